"""Every benchmark and script still imports: they run outside CI (by hand, minutes each),
so a moved SDK name would otherwise break them unseen."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("benchmarks", "scripts") for p in (ROOT / d).glob("*.py"))


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPTS])
def test_imports_without_running(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(path.parent))  # benchmarks import their _bench helper
    spec = importlib.util.spec_from_file_location(f"_checked_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defined
    try:
        spec.loader.exec_module(module)  # __name__ is not "__main__": nothing runs
    finally:
        sys.modules.pop(spec.name, None)
    assert module.__doc__, f"{path.name} says what it measures in its docstring"
