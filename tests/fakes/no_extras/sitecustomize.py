"""Makes the modules named in ``$PDCTL_TEST_WITHOUT`` (comma-separated top-level names)
look not installed: importing them raises ``ModuleNotFoundError`` and
``importlib.util.find_spec`` answers None. Put this folder first on ``PYTHONPATH`` to run
the tests as on a machine without those extras (tests/unit/test_hermetic.py does)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

WITHOUT = frozenset(n for n in os.environ.get("PDCTL_TEST_WITHOUT", "").split(",") if n)


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] in WITHOUT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


_find_spec = importlib.util.find_spec


def _find_spec_without(
    name: str, package: str | None = None
) -> importlib.machinery.ModuleSpec | None:
    if name.partition(".")[0] in WITHOUT:
        return None
    return _find_spec(name, package)


if WITHOUT:
    sys.meta_path.insert(0, _Absent())
    importlib.util.find_spec = _find_spec_without
