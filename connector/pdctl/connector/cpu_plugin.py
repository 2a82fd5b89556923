"""vLLM general plugin: the small-CPU-machine tuning for the push connector (a stopgap).

Registered as the ``vllm.general_plugins`` entry point ``pdctl_cpu``; vLLM calls
:func:`register` in every process it starts (API server, engine core, workers). It does
nothing unless the instance's environment has ``PDCTL_CPU_TUNING=1``, which pdctl's
renderer sets on the CPU platform (``fleet.cpu_tuning``, default true). With it:

1. NIXL agents are created without UCX's progress thread. NIXL's Python API busy-polls
   that thread with zero delay, so each idle server burns a whole core; on a 2-core
   machine two idle servers sit at 200 % CPU and requests slow down ~2x. Transfers still
   complete: the connector drives progress itself when it checks transfer state.
2. vLLM's NIXL worker stops re-pinning the engine's main thread to the last core of each
   NUMA node, which on the CPU platform overrode ``VLLM_CPU_OMP_THREADS_BIND`` and put
   prefill and decode on the same core.

Both touch only the process that opted in. The connector issue replaces this with a
connector subclass that makes the same choices explicitly.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

ENV_FLAG = "PDCTL_CPU_TUNING"
# a child of "vllm" so that the message lands in the instance log with vLLM's format
_log = logging.getLogger("vllm.pdctl_cpu_plugin")
_applied = False


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "") == "1"


def register() -> None:
    """vLLM entry point: apply the CPU tuning once per process when enabled."""
    global _applied
    if _applied or not enabled():
        return
    _applied = True
    _no_nixl_progress_thread()
    _no_numa_repinning()


def _no_nixl_progress_thread() -> None:
    try:
        from nixl._api import nixl_agent_config
    except ImportError:
        return
    original = nixl_agent_config.__init__
    if getattr(original, "_pdctl_patched", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not args:
            kwargs.setdefault("enable_prog_thread", False)
        original(self, *args, **kwargs)

    init._pdctl_patched = True  # type: ignore[attr-defined]
    nixl_agent_config.__init__ = init
    _log.info("pdctl: NIXL progress thread disabled (%s=1)", ENV_FLAG)


def _no_numa_repinning() -> None:
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return

    def no_topology(cls: type) -> list[list[int]]:
        return []

    CpuPlatform.discover_numa_topology = classmethod(no_topology)  # type: ignore[method-assign,assignment]
    _log.info("pdctl: NIXL worker core re-pinning disabled (%s=1)", ENV_FLAG)
