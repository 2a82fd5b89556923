"""The state directory of a running fleet: state file, logs, exit files, control socket.

One directory per fleet name under ``$PDCTL_STATE_DIR`` (default
``$XDG_STATE_HOME/pdctl`` or ``~/.local/state/pdctl``). The supervising process rewrites
``state.json`` atomically on every change; other shells only read it.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from pdctl.sdk.errors import PdctlError

InstanceStateName = Literal[
    "starting", "ready", "unhealthy", "backoff", "failed", "exited", "stopping", "stopped"
]


class StateError(PdctlError):
    """The state directory is unreadable or inconsistent."""


def state_root() -> Path:
    env = os.environ.get("PDCTL_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "pdctl"


def fleet_dir(fleet_name: str, root: Path | None = None) -> Path:
    return (root or state_root()) / fleet_name


class InstanceRecord(BaseModel):
    name: str
    role: str
    url: str
    served_name: str
    http_port: int
    side_channel_ports: list[int]
    engine_id: str | None
    log: str
    exit_file: str
    shepherd_pid: int | None = None
    shepherd_ticks: int | None = None
    started_at: float | None = None
    ready_at: float | None = None
    restarts: int = 0
    state: InstanceStateName = "starting"
    exit_code: int | None = None
    restart_policy: str = ""
    last_restart_at: float | None = None
    next_restart_at: float | None = None
    last_failure: str | None = None


class FleetRecord(BaseModel):
    fleet: str
    source: str
    supervisor_pid: int
    supervisor_ticks: int | None
    control_socket: str
    started_at: float
    instances: list[InstanceRecord]

    def instance(self, name: str) -> InstanceRecord:
        for r in self.instances:
            if r.name == name:
                return r
        names = ", ".join(r.name for r in self.instances)
        raise StateError(f"no instance named {name!r} in fleet {self.fleet!r} (have: {names})")


def state_file(d: Path) -> Path:
    return d / "state.json"


def read_state(d: Path) -> FleetRecord | None:
    path = state_file(d)
    try:
        return FleetRecord.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as e:
        raise StateError(
            f"{path} is unreadable ({type(e).__name__}); if no fleet runs, delete it"
        ) from None


def write_state(d: Path, record: FleetRecord) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tmp = state_file(d).with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=2))
    tmp.replace(state_file(d))


def read_exit(path: str | Path) -> tuple[int, float] | None:
    try:
        d = json.loads(Path(path).read_text())
        return int(d["code"]), float(d["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def tail(path: str | Path, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a log file ([] when missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return []
    return list(deque(data.splitlines(), maxlen=lines))
