"""One disaggregated request, the way push mode needs it: both legs at once.

The request bodies follow vLLM's push-connector contract (see the project docs): the
prefill leg runs the prompt for one token with ``do_remote_decode``; the decode leg names
the prefill's engine id, side channel, TP and PP sizes up front, so decode can register
its blocks while prefill is still computing. Both legs carry the same ``X-Request-Id``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.fleetplan import InstancePlan

_PREFILL_DROP = ("stream_options", "min_tokens")


class DispatchError(PdctlError):
    """A prefill or decode leg failed."""


@dataclass(frozen=True)
class PrefillIdentity:
    """What decode must know about a prefill before it answers."""

    engine_id: str
    host: str
    port: int
    tp_size: int
    pp_size: int

    @classmethod
    def from_plan(cls, plan: InstancePlan) -> PrefillIdentity:
        if plan.engine_id is None or plan.side_channel_port is None:
            raise ValueError(f"{plan.name} has no KV-transfer identity (colocated?)")
        return cls(
            engine_id=plan.engine_id,
            host=plan.side_channel_host or plan.host,
            port=plan.side_channel_port,
            tp_size=plan.tp,
            pp_size=plan.pp,
        )


def prefill_kv_params() -> dict[str, Any]:
    """What a prefill leg carries: compute the prompt, keep the KV for a remote decode."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI completion/chat body turned into its prefill leg (one token, no stream)."""
    out = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = prefill_kv_params()
    return out


def prefill_generate_body(gen: dict[str, Any]) -> dict[str, Any]:
    """A token-in/token-out ``GenerateRequest`` turned into its prefill leg."""
    out = {k: v for k, v in gen.items() if k != "stream_options"}
    sampling = dict(out.get("sampling_params") or {})
    sampling["max_tokens"] = 1
    sampling.pop("min_tokens", None)
    out["sampling_params"] = sampling
    out["stream"] = False
    out["kv_transfer_params"] = prefill_kv_params()
    return out


RELEASE_PARAM = "pdctl_release_ids"
"""``kv_transfer_params`` key of a *release request*: pdctl's connector on a prefill
frees the KV it holds for the requests named (ids the legs were sent with) instead of
waiting out its lease. The router sends one when a disaggregated request ends without
decode reading its KV, over HTTP, so the release does not depend on the P<->D side
channel (which may be the very thing that failed). Keep equal to the connector's."""


def release_body(served_name: str, request_ids: list[str]) -> dict[str, Any]:
    """A release request: the smallest completion there is (one prompt token, one
    output token) carrying the ids whose KV the prefill should let go of."""
    return {
        "model": served_name,
        "prompt": [0],
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {RELEASE_PARAM: list(request_ids)},
    }


def push_decode_body(
    body: dict[str, Any], prefill: PrefillIdentity, request_id: str
) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": prefill.engine_id,
        "remote_host": prefill.host,
        "remote_port": prefill.port,
        "tp_size": prefill.tp_size,
        "pp_size": prefill.pp_size,
        "remote_request_id": request_id,
    }
    return out


@dataclass(frozen=True)
class PDResult:
    request_id: str
    response: dict[str, Any]
    """The decode leg's JSON response (what the client would get)."""
    prefill_response: dict[str, Any]
    latency_s: float

    @property
    def text(self) -> str:
        choice = self.response.get("choices", [{}])[0]
        if "text" in choice:
            return str(choice["text"])
        return str(choice.get("message", {}).get("content", ""))


async def push_request(
    client: httpx.AsyncClient,
    prefill_url: str,
    decode_url: str,
    prefill: PrefillIdentity,
    body: dict[str, Any],
    *,
    endpoint: str = "/v1/completions",
    request_id: str | None = None,
    timeout_s: float = 120.0,
) -> PDResult:
    """Send one non-streaming request through prefill and decode concurrently."""
    rid = request_id or f"pdctl-{uuid.uuid4().hex}"
    headers = {"X-Request-Id": rid}
    t0 = time.perf_counter()
    p_task = asyncio.create_task(
        client.post(
            prefill_url + endpoint, json=prefill_body(body), headers=headers, timeout=timeout_s
        )
    )
    d_task = asyncio.create_task(
        client.post(
            decode_url + endpoint,
            json=push_decode_body(body, prefill, rid),
            headers=headers,
            timeout=timeout_s,
        )
    )
    try:
        p = await p_task
        if p.status_code != 200:
            raise DispatchError(f"prefill {prefill_url} answered {p.status_code}: {p.text[:300]}")
        try:
            d = await d_task
            failed = None if d.status_code == 200 else f"answered {d.status_code}: {d.text[:300]}"
        except httpx.HTTPError as e:
            failed = f"failed: {e!r}"
        if failed is not None:
            # decode will not read the KV prefill holds for it: free it now, not at the lease
            await release_kv(client, prefill_url, str(body.get("model") or ""), [rid])
            raise DispatchError(f"decode {decode_url} {failed}")
        return PDResult(rid, d.json(), p.json(), time.perf_counter() - t0)
    except BaseException:
        for t in (p_task, d_task):
            t.cancel()
        raise


async def release_kv(
    client: httpx.AsyncClient,
    prefill_url: str,
    served_name: str,
    request_ids: list[str],
    *,
    endpoint: str = "/v1/completions",
    timeout_s: float = 10.0,
) -> bool:
    """Ask a prefill on pdctl's connector to free the KV it holds for ``request_ids``
    (the ids the legs were sent with): what a dispatcher does when decode will not read
    it. Best effort: False when the prefill could not be told (a stock connector ignores
    the request and answers it as a one-token completion)."""
    try:
        r = await client.post(
            prefill_url + endpoint,
            json=release_body(served_name, request_ids),
            headers={"X-Request-Id": f"pdctl-release-{uuid.uuid4().hex}"},
            timeout=timeout_s,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200
