"""The AMX tile permission for every vLLM process where pdctl is installed.

On a CPU with AMX tiles, Linux lets a process run AMX instructions only after it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)``); the first one without the permission is
a SIGILL. vLLM's CPU attention picks its AMX kernel whenever the CPU has the tiles
(``vllm/v1/attention/backends/cpu_attn.py``, ``_get_attn_isa``) and never asks; oneDNN
asks only before its own AMX kernels. A worker whose first AMX instruction is vLLM's dies
(exit code -4) and every request after it fails.

The permission is per process and is cleared on ``execve``, and vLLM starts its engine
core and workers as fresh interpreters, so nothing outside them can grant it. vLLM runs
its general plugins (entry-point group ``vllm.general_plugins``, ``vllm/plugins/
__init__.py``, ``load_general_plugins``) in every process it starts: the engine core
(``vllm/v1/engine/core.py``) and each worker (``vllm/v1/worker/worker_base.py``,
``WorkerWrapperBase.init_worker``) before any model code. pdctl registers :func:`register`
there (``pdctl_amx`` in ``pyproject.toml``), so the stock connectors' instances pdctl
launches are covered too, not only its own connector's; pdctl's connector also asks when
it sets up a worker (for a ``VLLM_PLUGINS`` list that leaves ``pdctl_amx`` out).

Nothing here imports vLLM: the plugin only asks the kernel, through torch.
"""

from __future__ import annotations

import logging

_log = logging.getLogger(__name__)

PLUGIN = "pdctl_amx"
"""The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists)."""


def xtile_permitted() -> bool | None:
    """The kernel's own answer: whether this process may use AMX tile data
    (``arch_prctl(ARCH_GET_XCOMP_PERM)`` has bit 18, XTILEDATA); None where the call is
    refused (not x86-64 Linux, or a kernel before 5.16)."""
    import ctypes
    import platform
    import sys

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None  # the syscall number below is x86-64's
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        out = ctypes.c_uint64(0)
        if libc.syscall(158, 0x1022, ctypes.byref(out)) != 0:  # SYS_arch_prctl, x86-64
            return None
    except (OSError, AttributeError):
        return None
    return bool(out.value >> 18 & 1)


def allow_amx() -> bool:
    """Ask for this process's AMX tile permission (through ``torch.cpu._init_amx``) on a
    CPU that has AMX tiles; whether it is granted. Idempotent: asking again is a no-op."""
    import torch

    try:
        return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())
    except (AttributeError, RuntimeError):  # a torch without these helpers
        return False


def register() -> None:
    """vLLM's general-plugin entry point: grant the permission in this process. vLLM may
    call it more than once per process; it never raises (a plugin that raises is logged
    by vLLM and the instance starts anyway, which would hide the cause of a later SIGILL)."""
    try:
        if allow_amx():
            _log.debug("pdctl: this process may use AMX tiles")
    except Exception:  # a plugin must not stop vLLM; say why instead
        _log.warning("pdctl: could not ask for the AMX tile permission", exc_info=True)
