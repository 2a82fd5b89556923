"""vLLM's classes where each vLLM keeps them.

vLLM 0.32 and 0.33 define ``NixlPushConnector`` and ``NixlPullConnector`` in
``kv_connector/v1/nixl/connector.py``; vLLM main moved them to ``nixl/push_connector.py``
and ``nixl/pull_connector.py``. pdctl imports them through :func:`vllm_class`, which tries
the newer layout first and names every path it tried when none has the class.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
PUSH_CONNECTOR = (f"{NIXL}.push_connector", f"{NIXL}.connector")
"""Where ``NixlPushConnector`` lives: vLLM main, then vLLM 0.32/0.33."""
PULL_CONNECTOR = (f"{NIXL}.pull_connector", f"{NIXL}.connector")
"""Where ``NixlPullConnector`` lives: vLLM main, then vLLM 0.32/0.33."""


def _absent(error: ModuleNotFoundError, module: str) -> bool:
    """The module itself (or a package above it) is missing, not something it imports."""
    missing = error.name or ""
    return module == missing or module.startswith(missing + ".")


def vllm_class(name: str, modules: Sequence[str]) -> type:
    """The class ``name`` from the first of ``modules`` that defines it.

    A module that exists but fails to import (a dependency of it is missing) raises that
    error unchanged: it is not a layout question.
    """
    tried = []
    for path in modules:
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if not _absent(e, path):
                raise
            tried.append(f"{path} (no such module)")
            continue
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
        tried.append(f"{path} (no {name} in it)")
    raise ImportError(
        f"this vLLM has no {name}: tried {'; '.join(tried)}. pdctl's connector supports "
        "vLLM 0.32, 0.33 and main's layout; check the installed vLLM (pip show vllm)"
    )
