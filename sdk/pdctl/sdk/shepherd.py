"""A tiny per-instance supervisor process: the reason no vLLM process outlives pdctl.

``python -m pdctl.sdk.shepherd --lifeline FD --exit-file PATH --grace S -- CMD...``

The launcher starts one shepherd per instance in a new session, so the shepherd leads a
process group that vLLM and every process vLLM spawns (engine core, workers) inherit.
The shepherd then:

* runs CMD as its child (with the parent-death signal set to SIGKILL, so CMD dies even
  if the shepherd itself is SIGKILLed);
* watches the *lifeline*: the read end of a pipe whose only write end lives in the
  pdctl process. When pdctl exits for any reason — SIGKILL included — the kernel closes
  the write end, the read returns EOF, and the shepherd stops the whole group;
* on SIGTERM/SIGINT, or lifeline EOF: SIGTERM to every other member of the group, then
  SIGKILL after the grace period;
* when CMD exits, writes ``{"code": N, "at": unix_time}`` to the exit file at once (so
  other shells see the exit within milliseconds), kills any leftover group members and
  exits with the same code.

Standard library only (it runs before anything heavy is imported). Linux-specific bits
(prctl, /proc) degrade gracefully elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def group_members(pgid: int, exclude: int | None = None) -> list[int]:
    """PIDs whose process group is ``pgid`` (from /proc; empty where /proc is absent)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == exclude:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # the command name (field 2) may contain spaces and parentheses
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            out.append(pid)
    return out


def signal_group(pgid: int, sig: int, exclude: int | None) -> int:
    """Send ``sig`` to every live member of the group except ``exclude``; return count."""
    n = 0
    for pid in group_members(pgid, exclude):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            n += 1
    return n


class Shepherd:
    def __init__(
        self,
        cmd: list[str],
        exit_file: Path,
        grace: float,
        lifeline: int | None,
        cpus: set[int] | None = None,
    ):
        self.cmd = cmd
        self.exit_file = exit_file
        self.grace = grace
        self.lifeline = lifeline
        self.cpus = cpus
        self.me = os.getpid()
        self.pgid = os.getpgid(0)
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None

    def stop_group(self) -> None:
        """SIGTERM every other member, wait up to ``grace``, then SIGKILL the rest."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        signal_group(self.pgid, signal.SIGTERM, exclude=self.me)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and group_members(self.pgid, exclude=self.me):
            time.sleep(0.1)
        if signal_group(self.pgid, signal.SIGKILL, exclude=self.me):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and group_members(self.pgid, exclude=self.me):
                time.sleep(0.05)

    def _watch_lifeline(self) -> None:
        assert self.lifeline is not None
        try:
            while os.read(self.lifeline, 64):
                pass
        except OSError:
            pass
        self.stop_group()

    def run(self) -> int:
        def on_signal(signum: int, frame: object) -> None:
            threading.Thread(target=self.stop_group, daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_signal)
        if self.cpus:
            # every process of the instance (API server, engine core, workers) inherits it
            os.sched_setaffinity(0, self.cpus)
        try:
            self.child = subprocess.Popen(
                self.cmd, preexec_fn=lambda: _set_pdeathsig(signal.SIGKILL)
            )
        except OSError as e:
            print(f"pdctl shepherd: cannot start {self.cmd[0]!r}: {e}", file=sys.stderr)
            self._write_exit(127)
            return 127
        if self.lifeline is not None:
            threading.Thread(target=self._watch_lifeline, daemon=True).start()
        while True:
            try:
                rc = self.child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        code = rc if rc >= 0 else 128 - rc
        self._write_exit(code)
        # engine-core/worker processes must not outlive the API server
        if group_members(self.pgid, exclude=self.me):
            self.stopping.clear()
            self.stop_group()
        return code

    def _write_exit(self, code: int) -> None:
        tmp = self.exit_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"code": code, "at": time.time()}))
        tmp.replace(self.exit_file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.shepherd")
    ap.add_argument("--lifeline", type=int, default=None)
    ap.add_argument("--exit-file", type=Path, required=True)
    ap.add_argument("--grace", type=float, default=10.0)
    ap.add_argument("--cpus", default="", help="comma-separated cores to confine the instance to")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given after --")
    cpus = {int(c) for c in args.cpus.split(",") if c.strip()} or None
    return Shepherd(cmd, args.exit_file, args.grace, args.lifeline, cpus).run()


if __name__ == "__main__":
    sys.exit(main())
