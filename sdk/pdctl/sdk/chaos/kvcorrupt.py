"""The ``kv-corrupt`` chaos fault: WRITEs that deliver the wrong KV, and whether the
connector's digest check catches every one.

The fleet runs with ``pdctl_kv_verify_rate = 1.0`` and the corrupting failpoint
``pdctl_failpoint_kv_corrupt = "swap:match:<TAG>"`` (:func:`overrides`): the prefill
misplaces two blocks of the WRITE of every request whose id contains :data:`TAG`. The
fault sends ``n`` requests, one in ``every`` tagged (each a prompt of several blocks),
both legs straight to the instances and concurrently as the router does (the router
names requests itself, and the failpoint selects by id), and reads the decode's
``pdctl:kv_verify_total`` before and after.
Every tagged request must be detected (a mismatch each) and answered per the fleet's
``failure_policy`` (``fail``: an error status; ``recompute``: 200), no clean one flagged.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from pdctl.sdk.chaos import completion
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body

TAG = "kvcorrupt"


def overrides() -> list[str]:
    """Spec overrides that arm the fault (the failpoint needs PDCTL_ALLOW_FAILPOINTS=1)."""
    opts = "fleet.connector_options"
    return [
        f"{opts}.pdctl_kv_verify_rate=1.0",
        f"{opts}.pdctl_failpoint_kv_corrupt=swap:match:{TAG}",
    ]


def _prompt(i: int) -> str:
    words = ("cache", "block", "prefill", "decode", "router", "token", "engine", "push")
    return f"corrupt {i} {uuid.uuid4().hex[:6]} " + " ".join(
        words[(i + k * k) % len(words)] for k in range(110)
    )


async def _verified(c: httpx.AsyncClient, decode: str) -> dict[str, float]:
    s = parse((await c.get(decode + "/metrics")).text)
    key = rv.KV_VERIFY + "_total"
    return {r: total(s, key, {rv.RESULT_LABEL: r}) or 0.0 for r in rv.KV_VERIFY_RESULTS}


async def kv_corrupt(
    c: httpx.AsyncClient,
    prefill: tuple[str, PrefillIdentity],
    decode: str,
    *,
    n: int = 16,
    every: int = 4,
) -> dict[str, Any]:
    """Run the fault; returns sent/tagged counts, statuses of each kind, and the
    decode's verify results over the fault (``false_positives``: mismatches beyond the
    tagged requests; ``undetected``: tagged requests not counted as mismatches)."""
    before = await _verified(c, decode)
    tagged_status: dict[str, int] = {}
    clean_status: dict[str, int] = {}

    async def one(i: int) -> None:
        bad = i % every == every - 1
        rid = f"{TAG}-{uuid.uuid4().hex[:8]}" if bad else uuid.uuid4().hex
        body = completion(_prompt(i), 8)
        headers = {"X-Request-Id": rid}
        try:
            _, r = await asyncio.gather(
                c.post(
                    prefill[0] + "/v1/completions",
                    json=prefill_body(body),
                    headers=headers,
                    timeout=120,
                ),
                c.post(
                    decode + "/v1/completions",
                    json=push_decode_body(body, prefill[1], rid),
                    headers=headers,
                    timeout=120,
                ),
            )
            key = str(r.status_code)
        except httpx.HTTPError as e:
            key = type(e).__name__
        into = tagged_status if bad else clean_status
        into[key] = into.get(key, 0) + 1

    for start in range(0, n, 4):  # a few at a time: the CPU fleet serves 4 per instance
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + 4))))
    await asyncio.sleep(0.5)
    after = await _verified(c, decode)
    got = {r: after[r] - before[r] for r in after}
    tagged = sum(tagged_status.values())
    return {
        "fault": "kv-corrupt",
        "sent": n,
        "tagged": tagged,
        "tagged_statuses": tagged_status,
        "clean_statuses": clean_status,
        "verify": got,
        "undetected": max(0.0, tagged - got["mismatch"]),
        "false_positives": max(0.0, got["mismatch"] - tagged),
    }
