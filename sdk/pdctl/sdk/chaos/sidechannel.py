"""The P↔D side channel unreachable: decode cannot reach the prefill's NIXL side channel.

In push mode decode learns the prefill's side channel (host, port, engine id) from the
decode leg's ``kv_transfer_params`` and handshakes there (ZMQ, 5 s receive timeout)
before it can send its registration; it does so once per prefill engine (the first
request after the prefill (re)started). :func:`side_channel_unreachable` plays that first
contact with the address *refused* (nothing listens) or *blackholed* (a loopback
listener that accepts and never answers, :class:`Blackhole`): both legs are sent
directly, the prefill leg as usual, the decode leg naming an engine id decode has not
met (as after a prefill restart) at the unreachable address. Loopback only. (Through
pdctl's router this fault heals itself: the prefill's answer names its real side channel
and the router re-sends the decode leg there.)

:func:`side_channel_cut` cuts decode off from every prefill for real traffic through the
router: the connector's ``pdctl_failpoint_side_channel`` failpoint (``<mode>:while:<path>``
on the fleet) makes decode's registrations fail as an unreachable side channel does and
drops its release messages, while the switch file exists. Nothing then crosses the side
channel, so the prefill's KV comes back only through the router's release requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Literal

import httpx

from pdctl.sdk.chaos import Answer, FaultReport, _prompt, completion, kv_back_to_idle, send
from pdctl.sdk.chaos.kills import switched_on
from pdctl.sdk.freeports import free_port
from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body

Mode = Literal["refused", "blackholed"]


class Blackhole:
    """A loopback TCP listener that accepts connections and never answers."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []
        self.port = 0

    async def __aenter__(self) -> Blackhole:
        async def hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self._held.append(w)

        self._server = await asyncio.start_server(hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self._held:
            w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def refused_port() -> int:
    """A loopback port nothing listens on (outside the ephemeral range, so no outgoing
    connection takes it meanwhile)."""
    return free_port()


async def _legs(
    client: httpx.AsyncClient,
    prefill_url: str,
    decode_url: str,
    ident: PrefillIdentity,
    i: int,
    timeout_s: float,
) -> Answer:
    rid = f"chaos-sidechannel-{uuid.uuid4().hex}"
    body = completion(_prompt(4000 + i), 16)
    headers = {"X-Request-Id": rid}
    t0 = time.perf_counter()
    try:
        _, d = await asyncio.gather(
            client.post(
                prefill_url + "/v1/completions",
                json=prefill_body(body),
                headers=headers,
                timeout=timeout_s,
            ),
            client.post(
                decode_url + "/v1/completions",
                json=push_decode_body(body, ident, rid),
                headers=headers,
                timeout=timeout_s,
            ),
        )
    except httpx.HTTPError as e:
        return Answer(None, time.perf_counter() - t0, error=type(e).__name__)
    return Answer(d.status_code, time.perf_counter() - t0)


async def side_channel_unreachable(
    client: httpx.AsyncClient,
    prefill: tuple[str, PrefillIdentity],
    decode_url: str,
    baseline: dict[str, float],
    *,
    mode: Mode,
    n: int = 2,
    kv_wait_s: float = 15.0,
    timeout_s: float = 60.0,
) -> FaultReport:
    """``n`` requests whose decode cannot reach the prefill's side channel (``mode``);
    answers timed from the send, KV of both instances against ``baseline``."""
    prefill_url, real = prefill
    fresh = f"{real.engine_id}-unreached-{uuid.uuid4().hex[:6]}"
    async with Blackhole() as hole:
        port = hole.port if mode == "blackholed" else refused_port()
        ident = dataclasses.replace(real, engine_id=fresh, host="127.0.0.1", port=port)
        answers = list(
            await asyncio.gather(
                *(_legs(client, prefill_url, decode_url, ident, i, timeout_s) for i in range(n))
            )
        )
    return await _settled(f"side-channel-{mode}", client, answers, baseline, kv_wait_s)


async def side_channel_cut(
    client: httpx.AsyncClient,
    router_url: str,
    switch: Path,
    baseline: dict[str, float],
    *,
    mode: Mode,
    n: int = 2,
    kv_wait_s: float = 15.0,
    timeout_s: float = 60.0,
) -> FaultReport:
    """``n`` requests through the router while decode is cut off from every prefill
    (the fleet runs with ``pdctl_failpoint_side_channel = "<mode>:while:<switch>"``);
    answers timed from the send, KV of every instance in ``baseline`` timed from the
    last answer, the cut still on."""
    tag = uuid.uuid4().hex[:8]  # prompts no earlier fault left in a prefix cache
    with switched_on(switch, mode):
        bodies = [completion(f"{tag} {_prompt(i)}", 16) for i in range(n)]
        sends = [send(client, router_url, b, timeout_s=timeout_s) for b in bodies]
        answers = list(await asyncio.gather(*sends))
        # the cut lasts while the KV is measured: decode's own release (sent once its
        # request ended) must not slip through a channel that is back
        return await _settled(f"side-channel-cut-{mode}", client, answers, baseline, kv_wait_s)


async def _settled(
    name: str,
    client: httpx.AsyncClient,
    answers: list[Answer],
    baseline: dict[str, float],
    kv_wait_s: float,
) -> FaultReport:
    """The fault's report once its answers are in: KV back to ``baseline`` over time."""
    samples: list[tuple[float, dict[str, float | None]]] = []
    back, last = await kv_back_to_idle(client, baseline, wait_s=kv_wait_s, samples=samples)
    return FaultReport(name, answers, back, last, None, fault_at_s=0.0, kv_samples=samples)
