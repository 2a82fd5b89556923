"""The unit tier's own isolation (tests/unit/conftest.py): a temporary home, no user
``PDCTL_*`` settings, and a failing test for any read of the real home's caches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pdctl.sdk.fleet.state import state_root
from pdctl.sdk.paths import cache_root, tiny_model_dir
from tests.unit.conftest import GUARD, KEPT_PDCTL_VARIABLES, HomeGuard


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
