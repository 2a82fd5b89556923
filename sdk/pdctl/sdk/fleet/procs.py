"""Process helpers for the launcher (Linux /proc where available, POSIX signals)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from pdctl.sdk.errors import LaunchError
from pdctl.sdk.shepherd import group_members

if TYPE_CHECKING:
    from pdctl.sdk.spec import FleetSpec


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (identifies it across pid reuse)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds consumed so far by ``pids`` (vanished ones count 0)."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        with contextlib.suppress(IndexError, ValueError, TypeError):
            ticks += int(fields[11]) + int(fields[12])  # type: ignore[index]
    return ticks / os.sysconf("SC_CLK_TCK")


def instance_pids(shepherd_pids: list[int | None]) -> list[int]:
    """Every live process of the instances these shepherds lead (their process groups)."""
    return [p for g in shepherd_pids if g for p in group_members(g)]


def alive(pid: int | None, ticks: int | None = None) -> bool:
    """True if ``pid`` runs (and, when ``ticks`` is given, is the same process as then)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _zombie(pid):
        return False
    return ticks is None or start_ticks(pid) in (None, ticks)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def group_alive(pgid: int | None) -> bool:
    return pgid is not None and bool(group_members(pgid))


def kill_group(pgid: int, grace: float, reap_wait: float = 5.0) -> bool:
    """SIGTERM a whole process group, SIGKILL whatever is left after ``grace``, then wait
    up to ``reap_wait`` seconds for the killed processes to be gone. True when gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    if not group_members(pgid):
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + reap_wait
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    return False


def check_engine(argv0: str, spec: FleetSpec) -> None:
    """Is vLLM installed for ``argv0`` (the instances' first argument)? A
    :class:`LaunchError` naming the extra to install when it is not."""
    extra = "cpu" if spec.fleet.platform == "cpu" else "gpu"
    hint = f"install it: pip install 'pdctl[{extra}]'"
    if spec.fleet.platform == "gpu":
        if shutil.which(argv0) is None:
            raise LaunchError(f"vLLM is not installed here (no {argv0!r} on PATH); {hint}")
        return
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 3)"
    try:
        rc = subprocess.run([argv0, "-c", probe], timeout=60, check=False).returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"cannot run the interpreter {argv0!r}: {e}") from None
    if rc != 0:
        raise LaunchError(f"vLLM is not installed for {argv0}; {hint}")
