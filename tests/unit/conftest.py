"""The unit tier is hermetic: no test sees the user's home, caches, fleet state or
``PDCTL_*`` settings.

For the whole ``tests/unit`` package, ``HOME`` and the XDG directories point into a fresh
temporary home, so ``~/.cache/pdctl`` (the tiny model), ``~/.local/state/pdctl`` (fleet
state) and ``~/.config`` resolve there, in this process and in every subprocess a test
starts. A path computed before the switch (at import time) would still reach the real
home: an audit hook records every file a test opens under the real ``~/.cache`` (the
interpreter's own prefix and import path excepted) or the real pdctl state and config
directories, and the test fails at teardown naming the file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

KEPT_PDCTL_VARIABLES = frozenset(
    {
        "PDCTL_REQUIRE_PROMETHEUS",
        "PDCTL_TEST_WITHOUT",  # tests/fakes/no_extras
    }
)
"""Switches of the test suite itself; every other ``PDCTL_*`` variable is the user's
configuration and is removed."""


def _real_home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _protected_roots(home: Path) -> tuple[str, ...]:
    roots = [home / ".cache", home / ".local" / "state" / "pdctl", home / ".config" / "pdctl"]
    # of a relocated XDG directory only pdctl's part: it may be a shared one such as /tmp
    for var, sub in (("XDG_CACHE_HOME", "pdctl"), ("XDG_STATE_HOME", "pdctl")):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]).expanduser() / sub)
    if os.environ.get("PDCTL_STATE_DIR"):
        roots.append(Path(os.environ["PDCTL_STATE_DIR"]).expanduser())
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots)


def _allowed_roots(protected: tuple[str, ...]) -> tuple[str, ...]:
    """The interpreter, its virtualenv and its import path (the venv may live in
    ``~/.cache``: reading installed packages is not reading the user's state), except a
    directory that holds a protected one (``sys.path`` may name the home itself)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(p for p in sys.path if p)}
    dirs = (os.path.join(os.path.abspath(r), "") for r in roots)
    return tuple(d for d in dirs if not any(p.startswith(d) for p in protected))


class HomeGuard:
    """Records opens of files in the real home's caches and pdctl state while armed."""

    def __init__(self, home: Path) -> None:
        self.protected = _protected_roots(home)
        self.allowed = _allowed_roots(self.protected)
        self.armed = False
        self.seen: list[str] = []

    def offending(self, path: str) -> bool:
        p = os.path.join(os.path.abspath(path), "")
        return p.startswith(self.protected) and not p.startswith(self.allowed)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not self.armed or not args:
            return
        raw = args[0]
        if isinstance(raw, int) or raw is None:
            return
        try:
            path = os.fsdecode(raw)
        except TypeError:
            return
        if self.offending(path):
            self.seen.append(path)


GUARD = HomeGuard(_real_home())
sys.addaudithook(GUARD.hook)


@pytest.fixture(scope="package", autouse=True)
def hermetic_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh home for the unit tier (``HOME``, XDG directories, no ``PDCTL_*``)."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))
    for var, sub in (
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_STATE_HOME", ".local/state"),
    ):
        (home / sub).mkdir(parents=True)
        mp.setenv(var, str(home / sub))
    for var in list(os.environ):
        if var.startswith("PDCTL_") and var not in KEPT_PDCTL_VARIABLES:
            mp.delenv(var)
    GUARD.armed = True
    try:
        yield home
    finally:
        GUARD.armed = False
        mp.undo()


@pytest.fixture(autouse=True)
def no_reads_of_the_real_home(hermetic_home: Path) -> Iterator[None]:
    """Fails a test that opened a file in the real home's caches or pdctl state (in its
    own code or in a wider-scoped fixture set up for it)."""
    yield
    seen, GUARD.seen[:] = list(GUARD.seen), []
    if seen:
        pytest.fail(
            "a unit test opened files of the real home (use tmp_path or the fixtures): "
            + ", ".join(sorted(set(seen))[:5]),
            pytrace=False,
        )


@pytest.fixture
def yaml() -> Any:
    """PyYAML, from the ``k8s`` extra (pdctl writes Kubernetes YAML with it; tests read YAML
    back with it); the test is skipped without it."""
    return pytest.importorskip("yaml", reason="PyYAML is not installed (pip install 'pdctl[k8s]')")
