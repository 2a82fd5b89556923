"""Optional extras in tests: skip when the extra is not installed, fail when it is but a
module inside it is not where the test expects.

``pytest.importorskip("vllm.v1.core.kv_cache_utils")`` would also skip when vLLM is
installed and the module moved (an upstream rename): a test that silently stopped
running. :func:`require` skips only on the distribution's top-level package; the internals
are then imported plainly, so a moved module is an error. Under ``--strict-skips`` (CI)
a missing extra fails too (tests/conftest.py).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

EXTRA_OF = {
    "vllm": "cpu",
    "zmq": "cpu",  # pyzmq and msgspec come with vLLM
    "msgspec": "cpu",
}


def require(*top_levels: str) -> None:
    """Skip (naming the extra) unless every top-level package is importable."""
    for name in top_levels:
        extra = EXTRA_OF[name]
        pytest.importorskip(name, reason=f"{name} is not installed (pip install 'pdctl[{extra}]')")


def internal(module: str) -> ModuleType:
    """A module inside an extra: skip when the extra is absent, import it plainly (an
    ImportError fails the test) when it is present."""
    require(module.split(".")[0])
    return importlib.import_module(module)
