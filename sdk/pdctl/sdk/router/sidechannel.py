"""A prefill's NIXL side channel as a second word on its engine's life.

When a prefill's engine dies, its API server lives on and goes on answering
``GET /health`` 200 until it notices (a few hundred milliseconds, sometimes more). A decode
whose request was waiting for that engine's KV fails first, and the router, asking the
prefill's ``/health`` at that moment, heard "healthy" and gave the request up. The side
channel (the ZMQ listener NIXL handshakes go to, ``kv_transfer_params`` ``remote_host`` /
``remote_port``) lives in the engine's own processes (vLLM's NIXL worker,
``kv_connector/v1/nixl``), so it is gone the moment the engine is: a TCP connect that is
refused there means no KV will come from that engine.

A refusal is believed only from an address this router has seen accepting: a fleet whose
side channels the router cannot reach (another network, a Kubernetes network policy, the
mock fleet's identities that nothing serves) keeps ``/health`` as the only word. No
answer within :data:`CONNECT_TIMEOUT_S` is not a refusal (a full backlog, a dropped
packet). An address not yet seen accepting is tried again after :data:`RETRY_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

from pdctl.sdk.router.instances import Upstream

Address = tuple[str, int]
Answer = Literal["accepts", "refuses", "silent"]

CONNECT_TIMEOUT_S = 0.5
"""How long a connect to a side channel may take."""
RETRY_S = 30.0
"""How long before an address not seen accepting is tried again."""


async def connect(addr: Address, timeout_s: float = CONNECT_TIMEOUT_S) -> Answer:
    """What ``addr`` does with a TCP connect: accepts, refuses (nothing listens: the
    kernel's RST), or stays silent (no answer in time, unreachable, anything else)."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(*addr)
    except ConnectionRefusedError:
        return "refuses"
    except (TimeoutError, OSError):
        return "silent"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return "accepts"


class SideChannels:
    """The side channels this router has seen accepting, and whether a prefill's now
    refuses. Single event loop; no locks."""

    def __init__(self, timeout_s: float = CONNECT_TIMEOUT_S, retry_s: float = RETRY_S) -> None:
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.seen: set[Address] = set()
        """Addresses that accepted a connect at least once."""
        self.refusing: set[Address] = set()
        """Seen addresses whose last connect was refused."""
        self._tried: dict[Address, float] = {}

    @staticmethod
    def address(u: Upstream) -> Address | None:
        if u.role != "prefill" or u.identity is None:
            return None
        return (u.identity.host or "127.0.0.1", u.identity.port)

    async def gone(self, u: Upstream) -> bool:
        """Whether ``u``'s side channel, once seen accepting, now refuses (its engine is
        gone). An address not seen yet is tried (at most once per :attr:`retry_s`) and
        remembered when it accepts; it never counts as gone."""
        addr = self.address(u)
        if addr is None:
            return False
        if addr not in self.seen:
            now = time.monotonic()
            if now - self._tried.get(addr, -self.retry_s) < self.retry_s:
                return False
            self._tried[addr] = now
            if await connect(addr, self.timeout_s) == "accepts":
                self.seen.add(addr)
            return False
        gone = await connect(addr, self.timeout_s) == "refuses"
        (self.refusing.add if gone else self.refusing.discard)(addr)
        return gone

    def refuses(self, u: Upstream) -> bool:
        """Whether ``u``'s side channel refused the last connect (seen accepting before)."""
        return self.address(u) in self.refusing
