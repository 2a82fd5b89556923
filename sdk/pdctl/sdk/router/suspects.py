"""Word to the fleet's supervisor about an instance the router saw fail.

The router sees an engine die first: a decode answers a 5xx (vLLM's ``EngineDeadError``),
sends an error event mid-stream, or drops the connection. The supervisor's own liveness
check needs several failed ``/health`` rounds before it restarts the instance; told by
the router, it checks ``/health`` once at once and restarts on a 5xx
(:mod:`pdctl.sdk.fleet.supervisor`). It never takes the router's word alone.

The link is the supervisor's control socket (one JSON line each way:
``{"cmd": "suspect", "name": N, "why": W, "by": "router"}``), given to the router by the
local launcher (``--supervisor-socket``). Fleets without one (Kubernetes, Ray, a router
started by hand) rely on their supervisor's own checks. A word is sent at most once per
:data:`QUIET_S` per instance, in the background, and a supervisor that cannot be reached
never slows a request (logged once, short timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

log = logging.getLogger("pdctl.router")

QUIET_S = 2.0
"""At most one word per instance this often (a dead engine fails every request on it)."""
TIMEOUT_S = 2.0


class SupervisorLink:
    """Tells the supervisor at ``socket_path`` (None: nobody to tell) an instance failed."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path
        self.sent = 0
        self.failures = 0
        self._last: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def suspect(self, name: str, why: str) -> bool:
        """Tell the supervisor (in the background) that ``name`` failed; False when
        nothing was sent (no link, or it was told moments ago)."""
        if self.socket_path is None:
            return False
        now = time.monotonic()
        if now - self._last.get(name, -QUIET_S) < QUIET_S:
            return False
        self._last[name] = now
        task = asyncio.get_running_loop().create_task(self._send(name, why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _send(self, name: str, why: str) -> None:
        assert self.socket_path is not None
        line = json.dumps({"cmd": "suspect", "name": name, "why": why[:300], "by": "router"})
        try:
            async with asyncio.timeout(TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    await reader.readline()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
            self.sent += 1
        except (OSError, TimeoutError) as e:
            self.failures += 1
            if self.failures == 1:
                log.warning("could not tell the supervisor %s failed: %s", name, e)

    async def close(self) -> None:
        """Wait for words still on their way (bounded by their timeout)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
