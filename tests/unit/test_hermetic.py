"""The unit tier's own isolation (tests/unit/conftest.py): a temporary home, no user
``PDCTL_*`` settings, and a failing test for any read of the real home's caches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl.sdk.fleet.state import state_root
from pdctl.sdk.paths import cache_root, tiny_model_dir
from tests.conftest import REPO, STRICT_SKIPS_VARIABLES
from tests.unit.conftest import GUARD, KEPT_PDCTL_VARIABLES, HomeGuard

EXTRAS = ("textual", "yaml", "matplotlib", "ray", "vllm", "nixl", "torch", "zmq", "msgspec")
"""Top-level modules of the optional extras (and what they pull in)."""


def test_home_caches_and_state_live_in_the_temporary_home(hermetic_home: Path):
    assert Path.home() == hermetic_home
    assert cache_root().is_relative_to(hermetic_home)
    assert tiny_model_dir().is_relative_to(hermetic_home)
    assert state_root().is_relative_to(hermetic_home)
    assert not [v for v in os.environ if v.startswith("PDCTL_") and v not in KEPT_PDCTL_VARIABLES]


def test_subprocesses_get_the_temporary_home_too(hermetic_home: Path):
    out = subprocess.run(
        [sys.executable, "-c", "from pdctl.sdk.paths import cache_root; print(cache_root())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()).is_relative_to(hermetic_home)


def test_guard_names_the_real_home_but_not_the_interpreter():
    real = Path(GUARD.protected[0])  # the real home's .cache
    assert GUARD.offending(str(real / "pdctl" / "models" / "tiny" / "config.json"))
    assert not GUARD.offending(os.__file__)
    assert not GUARD.offending(sys.executable)


def test_guard_records_an_open_under_a_protected_root(tmp_path: Path):
    home = tmp_path / "home"
    cached = home / ".cache" / "pdctl" / "models" / "tiny" / "config.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("{}")
    guard = HomeGuard(home)
    assert guard.offending(str(cached))
    assert not guard.offending(str(tmp_path / "elsewhere.json"))
    # the installed hook, pointed for a moment at this home, sees a real open()
    saved = GUARD.protected
    GUARD.protected = guard.protected
    try:
        cached.read_text()
        (tmp_path / "elsewhere.json").write_text("{}")
    finally:
        GUARD.protected = saved
        seen, GUARD.seen[:] = list(GUARD.seen), []
    assert seen == [str(cached)]


@pytest.mark.slow  # collects the whole unit tier in a second interpreter
def test_the_unit_tier_collects_without_the_optional_extras():
    """A module that imports an extra at the top, unguarded, is an error here; with
    ``pytest.importorskip`` it is a skip that names the extra (outside CI: the second
    interpreter does not inherit ``--strict-skips``, where such a skip is a failure)."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in STRICT_SKIPS_VARIABLES},
        "PYTHONPATH": os.pathsep.join(
            p
            for p in (str(REPO / "tests" / "fakes" / "no_extras"), os.environ.get("PYTHONPATH"))
            if p
        ),
        "PDCTL_TEST_WITHOUT": ",".join(EXTRAS),
    }
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(REPO / "tests" / "unit")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "the TUI tests need the tui extra" in r.stdout  # the extras were absent
