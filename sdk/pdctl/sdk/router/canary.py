"""The live output canary: a sampled share of greedy requests is replayed on one instance
alone (no KV transfer, prefix cache bypassed) after its answer is sent, and the two
answers are compared. Greedy decoding of the same prompt with the same parameters gives
the same tokens wherever it runs, so a replay that differs says the disaggregated answer
came from KV that was not what the prompt computes (corrupted, misplaced, incomplete),
counted per P->D pair in ``pdctl_router_canary_total{prefill,decode,result}``.

What is sampled (``router.canary.rate``, off by default): a request with
``temperature`` 0 (vLLM's greedy sampling type, ``vllm/sampling_params.py``:
``sampling_type`` is GREEDY when the temperature is below ``_SAMPLING_EPS``; a request
without a temperature gets the model's default, not greedy), one choice, that was
disaggregated, answered 200 and not migrated. Everything else is never sampled.

The replay goes, colocated-style, to ``router.canary.target``: the pair's decode (the
default), its prefill, or a reference server. It is the client's body with no
``kv_transfer_params``: on vLLM's push connector such a request matches no external
tokens and runs locally (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/
push_scheduler.py``, ``get_num_new_matched_tokens`` returns ``(0, False)`` and
``request_finished`` holds nothing without params; the same in vLLM 0.32 and 0.33). It
carries a fresh ``cache_salt`` (vLLM's per-request prefix-cache salt, in both releases'
completion and chat protocols) so that it cannot reuse the blocks the push just wrote:
otherwise a decode that cached corrupted KV would replay from it and agree with itself.
A streamed answer is compared by its text, gathered from its events as they pass (a
chat stream that calls tools is not compared: its calls come as deltas).

Cost and isolation: the replay starts once the reply is handed to the server (the end
of a stream), so the client's latency does not include it; at most
``router.canary.concurrency`` replays run at once, and one is dropped (counted in
``pdctl_router_canary_dropped_total{reason}``) when that many already run, when its
instance has ``router.canary.busy_outstanding`` legs in flight or is out of rotation,
or when the router stops (replays in flight are cancelled, their connections closed).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.router.canaryverdict import (
    ask_logprobs,
    judge,
    positions,
    token_ids,
)
from pdctl.sdk.router.canaryverdict import first_difference as first_difference
from pdctl.sdk.router.httpclient import Pool, UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.lease import Lease
from pdctl.sdk.router.promreg import Counter, Registry
from pdctl.sdk.router.replies import Reply, StreamReply
from pdctl.sdk.router.timeline import MAX_PRIMED_PAIRS, Timeline
from pdctl.sdk.spec import CanarySpec
from pdctl.sdk.sse import DONE, EventParser

RESULTS = ("match", "diverged", "tied", "error")
"""How a replay ends: the same tokens, different ones, a first difference at a near-tie
on a pair whose sides do not compute alike (heterogeneous TP; :mod:`~pdctl.sdk.router.
canaryverdict`), or no comparable answer (the replay failed, timed out or answered an
error; the request's answer had no text)."""
DROPS = ("full", "busy", "shutdown")
"""Why a sampled request was not replayed: ``router.canary.concurrency`` replays already
running, its instance busy or out of rotation, the router stopping."""
MAX_CAPTURE = 4 * 1024 * 1024
"""A streamed answer's text larger than this is not compared (not held in memory)."""


def greedy(body: dict[str, Any]) -> bool:
    """Whether ``body`` asks for greedy decoding of one choice (temperature 0)."""
    t = body.get("temperature")
    if isinstance(t, bool) or not isinstance(t, int | float) or t >= 1e-5:
        return False
    if body.get("use_beam_search"):
        return False
    return all(body.get(k) in (None, 1) for k in ("n", "best_of"))


def answer_text(endpoint: str, answer: dict[str, Any]) -> str | None:
    """The first choice's text of a whole answer (completions: ``text``; chat: the
    message's ``content``, and its tool calls when it made any); None without one."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    if endpoint.endswith("/chat/completions"):
        msg = c.get("message")
        if not isinstance(msg, dict):
            return None
        text = msg.get("content") or ""
        calls = msg.get("tool_calls")
        return str(text) + (json.dumps(calls, sort_keys=True) if calls else "")
    text = c.get("text")
    return text if isinstance(text, str) else None


def event_text(endpoint: str, event: dict[str, Any]) -> str | None:
    """The text one streamed event adds to the first choice; None when the event makes
    the stream not comparable by text (a chat stream's tool-call deltas)."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return ""
    out = []
    for c in choices:
        if not isinstance(c, dict) or c.get("index", 0) != 0:
            continue
        if endpoint.endswith("/chat/completions"):
            delta = c.get("delta")
            if isinstance(delta, dict) and delta.get("tool_calls"):
                return None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                out.append(delta["content"])
        elif isinstance(c.get("text"), str):
            out.append(c["text"])
    return "".join(out)


def replay_body(body: dict[str, Any], salt: str) -> dict[str, Any]:
    """The request as replayed: the same parameters, answered whole, with its own
    prefix-cache salt (so it computes the prompt itself)."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    out["cache_salt"] = salt
    return out


@dataclass
class Sample:
    """A request drawn for the canary, until its answer is known."""

    canary: Canary
    endpoint: str
    body: dict[str, Any]
    tl: Timeline
    answer_ids: list[int] | None = None
    """The answer's token ids when it carries them (the client asked
    ``return_token_ids``): then ids, not text, are compared."""

    def watch(self, reply: Reply | StreamReply) -> Reply | StreamReply:
        """:meth:`Canary.watch` of this sample."""
        return self.canary.watch(self, reply)


def canary_counters(registry: Registry, upstreams: list[Upstream]) -> tuple[Counter, Counter]:
    """The canary's result and drop counters, at 0 for every pair and reason from the
    start; registered with the canary off too, so its dashboard panel and alert PA013 read
    series (all 0) on every fleet."""
    results = registry.counter(
        "pdctl_router_canary_total",
        "Greedy requests replayed on one instance alone (router.canary) and compared "
        "with their disaggregated answer, by the P->D pair that answered and result: "
        "match, diverged (the pair's answer differs: its KV was not the prompt's), "
        "tied (a heterogeneous-TP pair's first difference is at a near-tie within "
        "router.canary.tie_tolerance), error (no comparable answer).",
        ("prefill", "decode", "result"),
    )
    p = [u.name for u in upstreams if u.role == "prefill"]
    d = [u.name for u in upstreams if u.role == "decode"]
    if len(p) * len(d) <= MAX_PRIMED_PAIRS:
        results.prime(p, d, RESULTS)
    dropped = registry.counter(
        "pdctl_router_canary_dropped_total",
        "Requests drawn for the canary but not replayed, by reason: full "
        "(router.canary.concurrency replays running), busy (the instance had "
        "router.canary.busy_outstanding legs in flight or was out of rotation), "
        "shutdown.",
        ("reason",),
    )
    dropped.prime(DROPS)
    return results, dropped


class Canary:
    """Draws greedy requests, replays them in the background, counts the results."""

    def __init__(
        self,
        settings: CanarySpec,
        registry: Registry,
        upstreams: list[Upstream],
        *,
        connect_timeout_s: float = 5.0,
        rng: random.Random | None = None,
        tp: Mapping[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self.tp = dict(tp or {})
        """Instance name → tensor-parallel size (the fleet plan's): a pair whose sizes
        differ is compared with the near-tie tolerance."""
        self.connect_timeout_s = connect_timeout_s
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._by_name = {u.name: u for u in upstreams}
        """The instances replays may go to."""
        self.reference: Upstream | None = None
        if settings.target == "reference" and settings.reference_url:
            url = settings.reference_url
            self.reference = Upstream("reference", "reference", url, Pool(url))
        self.results, self.dropped = canary_counters(registry, upstreams)
        self.replay_s = registry.histogram(
            "pdctl_router_canary_replay_seconds",
            "Duration of a canary replay (the extra work one sampled request costs).",
            ("target",),
        )

    # ------------------------------------------------------------------ the hook

    def draw(self, endpoint: str, body: dict[str, Any], tl: Timeline) -> Sample | None:
        """A sample of this request, or None (not greedy, not drawn, canary stopped)."""
        rate = self.settings.rate
        if self._closed or rate <= 0 or not greedy(body):
            return None
        if rate < 1.0 and self._rng.random() >= rate:
            return None
        return Sample(self, endpoint, body, tl)

    def watch(self, sample: Sample, reply: Reply | StreamReply) -> Reply | StreamReply:
        """``reply`` as the client gets it; its text goes to a replay once it is known
        (a whole answer now, a stream at its end)."""
        if reply.status != 200:
            return reply
        if isinstance(reply, Reply):
            try:
                answer = json.loads(reply.body)
            except ValueError:
                return reply
            text = answer_text(sample.endpoint, answer) if isinstance(answer, dict) else None
            sample.answer_ids = token_ids(answer) if isinstance(answer, dict) else None
            self._finish(sample, text)
            return reply
        reply.chunks = self._tee(sample, reply.chunks)
        return reply

    async def _tee(
        self, sample: Sample, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        parser = EventParser()
        parts: list[str] = []
        size = 0
        try:
            async for chunk in chunks:
                if size <= MAX_CAPTURE:
                    for ev in parser.feed(chunk):
                        if ev.data == DONE:
                            continue
                        try:
                            data = json.loads(ev.data)
                        except ValueError:
                            continue
                        part = event_text(sample.endpoint, data) if isinstance(data, dict) else ""
                        if part is None:  # not comparable by text: stop gathering
                            size = MAX_CAPTURE + 1
                            break
                        parts.append(part)
                        size += len(part)
                yield chunk
        finally:
            await chunks.aclose()
        # the stream ran to its end (a client gone, or an error, never gets here)
        self._finish(sample, "".join(parts) if size <= MAX_CAPTURE else None)

    # ------------------------------------------------------------------ replays

    def _finish(self, sample: Sample, text: str | None) -> None:
        """The request's answer is known: replay it unless it does not qualify."""
        tl = sample.tl
        if tl.outcome != "ok" or tl.decision != "disaggregated" or tl.migrations:
            return
        if not tl.prefill or not tl.decode or text is None or self._closed:
            return
        target = self._target(tl)
        why = self._refusal(target)
        if why is not None:
            self.dropped.inc(why)
            tl.canary = {"result": "dropped", "why": why}
            return
        assert target is not None
        task = asyncio.get_running_loop().create_task(self._replay(sample, text, target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _target(self, tl: Timeline) -> Upstream | None:
        if self.reference is not None:
            return self.reference
        want = tl.decode if self.settings.target == "decode" else tl.prefill
        return self._by_name.get(want or "")

    def _refusal(self, u: Upstream | None) -> str | None:
        if len(self._tasks) >= self.settings.concurrency:
            return "full"
        if u is None or u.drained or not u.eligible():
            return "busy"
        if u.outstanding >= self.settings.busy_outstanding:
            return "busy"
        return None

    def layout(self, prefill: str, decode: str) -> str:
        """Why a pair's sides do not compute alike ("prefill TP2 → decode TP1"), or ""
        when they do (equal TP, or sizes not known)."""
        p, d = self.tp.get(prefill), self.tp.get(decode)
        return f"prefill TP{p} → decode TP{d}" if p and d and p != d else ""

    async def _replay(self, sample: Sample, text: str, u: Upstream) -> None:
        tl = sample.tl
        assert tl.prefill is not None
        assert tl.decode is not None
        pair = (tl.prefill, tl.decode)
        why = self.layout(*pair)
        salt = f"pdctl-canary-{uuid.uuid4().hex}"
        body = replay_body(sample.body, salt)
        by_id = sample.answer_ids is not None
        if why:
            body = ask_logprobs(sample.endpoint, body, by_id=by_id)
        data = json.dumps(body).encode()
        headers = [("Content-Type", "application/json"), ("X-Request-Id", salt)]
        t0 = time.perf_counter()
        result, detail = "error", ""
        try:
            async with asyncio.timeout(self.settings.timeout_s), Lease(u):
                r = await u.pool.request(
                    "POST", sample.endpoint, data, headers, connect_timeout_s=self.connect_timeout_s
                )
                try:
                    raw = await r.read()
                finally:
                    r.release()
            got = _answer_of(raw) if r.status == 200 else None
            replay = answer_text(sample.endpoint, got) if got is not None else None
            if got is None or replay is None:
                detail = f"{u.name} answered {r.status}: {raw[:200].decode(errors='replace')}"
            else:
                v = judge(
                    answer=text,
                    replay=replay,
                    answer_ids=sample.answer_ids,
                    replay_ids=token_ids(got) if by_id else None,
                    replay_positions=positions(sample.endpoint, got, spelled=not by_id)
                    if why
                    else None,
                    comparable=not why,
                    tolerance=self.settings.tie_tolerance,
                    on=f"replay on {u.name}",
                    why=why,
                )
                result, detail = v.result, v.detail
        except TimeoutError:
            detail = f"no answer from {u.name} within {self.settings.timeout_s:g} s"
        except (UpstreamError, OSError) as e:
            detail = f"{u.name}: {e}"
        except asyncio.CancelledError:
            self.dropped.inc("shutdown")
            raise
        self.replay_s.observe(time.perf_counter() - t0, self.settings.target)
        self.results.inc(*pair, result)
        tl.canary = {"result": result, "on": u.name, **({"detail": detail} if detail else {})}
        if result == "diverged":
            tl.note(f"canary: {detail}")

    async def close(self) -> None:
        """Stop drawing; cancel the replays in flight (their connections are closed)."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.reference is not None:
            self.reference.pool.close()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)


def _answer_of(raw: bytes) -> dict[str, Any] | None:
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
