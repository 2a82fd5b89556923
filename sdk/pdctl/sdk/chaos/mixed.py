"""An engine that dies under a mixed load: the ``kill-engine-core`` faults.

``n`` concurrent greedy requests through the router (half streamed, half not; completions
and chat; 32 to 96 tokens each with ``ignore_eos``), and once enough streams are mid-answer
(or after ``after_s``) a SIGKILL of one instance's **EngineCore** process only — its API
server stays up and answers vLLM's engine-dead 500 (the common real crash: a CUDA error
or an OOM in the engine). Every request's generated token ids are compared with what one
instance alone gives for the same request (:func:`reference`): the router must finish
every request, on another decode where the one it was on died, with the same tokens.

``benchmarks/chaos.py`` (``--faults kill-engine-core-decode,kill-engine-core-prefill``)
and tests/e2e/test_e2e_engine_death.py compose these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pdctl.sdk.sse import DONE, EventParser

WORDS = [
    "cache",
    "block",
    "prefill",
    "decode",
    "router",
    "token",
    "engine",
    "fleet",
    "push",
    "write",
    "quiet",
    "green",
]


@dataclass(frozen=True)
class MixedRequest:
    """One request of the mix: its endpoint, whether it streams, its body."""

    path: str
    stream: bool
    body: dict[str, Any]


@dataclass
class MixedAnswer:
    status: int | None
    ids: list[int] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    misshapen: list[str] = field(default_factory=list)
    """Chunks of a chat stream asking for logprobs whose logprobs are not chat's shape."""


def chat_logprobs_problem(obj: dict[str, Any], top: int) -> str | None:
    """What is wrong with a chat chunk's logprobs (None: chat's shape, ``top``
    alternatives a token): ``{"content": [{"token", "logprob", "bytes",
    "top_logprobs": [...]}]}``."""
    for ch in obj.get("choices") or []:
        if not (ch.get("delta") or {}).get("content"):
            continue  # the role chunk, the finish
        lp = ch.get("logprobs")
        content = lp.get("content") if isinstance(lp, dict) else None
        if not isinstance(content, list) or not content:
            return f"logprobs {str(lp)[:120]}"
        for entry in content:
            if not {"token", "logprob", "bytes", "top_logprobs"} <= set(entry):
                return f"entry {str(entry)[:120]}"
            if len(entry["top_logprobs"]) != top:
                return f"{len(entry['top_logprobs'])} alternatives, not {top}"
    return None


def mixed_requests(n: int, model: str = "tiny", *, chat_every: int = 4) -> list[MixedRequest]:
    """``n`` greedy requests: even ones streamed, every ``chat_every``-th a chat request,
    32 to 96 tokens, each asking for its token ids."""
    out = []
    for i in range(n):
        words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(10 + i % 7))
        tokens = 32 + (i * 37) % 65
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        chat = chat_every > 0 and i % chat_every == chat_every - 1
        if chat:
            body["messages"] = [{"role": "user", "content": words}]
        else:
            body["prompt"] = words
        stream = i % 2 == 0
        if stream:
            body["stream"] = True
        path = "/v1/chat/completions" if chat else "/v1/completions"
        out.append(MixedRequest(path, stream, body))
    return out


def _choice_ids(obj: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    for ch in obj.get("choices") or []:
        got = ch.get("token_ids")
        if isinstance(got, list):
            ids.extend(t for t in got if isinstance(t, int))
    return ids


async def run_one(
    c: httpx.AsyncClient, url: str, req: MixedRequest, progress: list[int], i: int
) -> MixedAnswer:
    """Send one request of the mix; its status, generated token ids and any error."""
    t0 = time.perf_counter()
    try:
        if not req.stream:
            r = await c.post(url + req.path, json=req.body)
            if r.status_code != 200:
                return MixedAnswer(r.status_code, error=r.text[:300])
            ids = _choice_ids(r.json())
            progress[i] = len(ids)
            return MixedAnswer(200, ids, seconds=time.perf_counter() - t0)
        ans = MixedAnswer(None)
        chat_lp = req.path.endswith("/chat/completions") and req.body.get("logprobs")
        lp_top = int(req.body.get("top_logprobs") or 0) if chat_lp else None
        async with c.stream("POST", url + req.path, json=req.body) as r:
            ans.status = r.status_code
            if r.status_code != 200:
                ans.error = (await r.aread())[:300].decode(errors="replace")
                return ans
            parser = EventParser()  # lines end at CR, LF, CRLF only (pdctl.sdk.sse)
            async for chunk in r.aiter_bytes():
                for event in parser.feed(chunk):
                    if event.data == DONE or not event.data:
                        continue
                    obj = json.loads(event.data)
                    if "error" in obj:
                        ans.error = json.dumps(obj["error"])[:300]
                        continue
                    ans.ids.extend(_choice_ids(obj))
                    progress[i] = len(ans.ids)
                    if lp_top is not None:
                        problem = chat_logprobs_problem(obj, lp_top)
                        if problem is not None:
                            ans.misshapen.append(problem)
        ans.seconds = time.perf_counter() - t0
        return ans
    except httpx.HTTPError as e:
        return MixedAnswer(None, error=f"{type(e).__name__}: {e}"[:300])


async def reference(
    c: httpx.AsyncClient, url: str, reqs: Sequence[MixedRequest], concurrency: int = 4
) -> list[list[int]]:
    """What one instance alone (``url``: an engine's own server, no P/D) generates for
    each request, not streamed (``concurrency`` at a time: the demo's max_num_seqs)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(req: MixedRequest) -> list[int]:
        body = {k: v for k, v in req.body.items() if k != "stream"}
        async with gate:
            r = await c.post(url + req.path, json=body)
        r.raise_for_status()
        return _choice_ids(r.json())

    return list(await asyncio.gather(*(one(r) for r in reqs)))


@dataclass
class MixedKill:
    """What one engine-core kill under the mix gave."""

    answers: list[MixedAnswer]
    killed_at_s: float | None
    """When the kill came, from the first request's send (None: nothing was killed)."""
    streams_mid_answer: int = 0
    """Streams between their first and last tokens at the kill."""

    def complete(self, want: Sequence[Sequence[int]]) -> int:
        """Requests answered 200 with every token, no error event."""
        return sum(
            1
            for a, w in zip(self.answers, want, strict=True)
            if a.status == 200 and not a.error and len(a.ids) == len(w)
        )

    def identical(self, want: Sequence[Sequence[int]]) -> int:
        """Requests whose token ids are exactly ``want``'s."""
        return sum(
            1
            for a, w in zip(self.answers, want, strict=True)
            if a.status == 200 and not a.error and a.ids == list(w)
        )

    def failures(self, want: Sequence[Sequence[int]]) -> list[tuple[int, int | None, str]]:
        """(index, status, error) of every request that did not complete."""
        return [
            (i, a.status, a.error or f"{len(a.ids)} of {len(w)} tokens")
            for i, (a, w) in enumerate(zip(self.answers, want, strict=True))
            if not (a.status == 200 and not a.error and len(a.ids) == len(w))
        ]


async def kill_under_mix(
    c: httpx.AsyncClient,
    router: str,
    reqs: Sequence[MixedRequest],
    kill: Callable[[], int],
    *,
    min_streams: int = 4,
    after_s: float = 1.5,
    timeout_s: float = 240.0,
    ready: Callable[[], Awaitable[bool]] | None = None,
) -> MixedKill:
    """Send every request of ``reqs`` at once; call ``kill`` (it SIGKILLs, returning how
    many processes it killed) once ``min_streams`` streams are mid-answer (0: never the
    trigger), ``ready`` says so (e.g. the router holds legs on the instance to kill), or
    ``after_s`` has passed, whichever comes first; wait for every answer."""
    progress = [0] * len(reqs)
    tasks = [asyncio.create_task(run_one(c, router, r, progress, i)) for i, r in enumerate(reqs)]
    t0 = time.perf_counter()
    killed_at: float | None = None
    mid = 0
    try:
        while True:
            mid = sum(
                1
                for r, p in zip(reqs, progress, strict=True)
                if r.stream and 2 <= p < int(r.body["max_tokens"]) - 4
            )
            if (min_streams and mid >= min_streams) or time.perf_counter() - t0 >= after_s:
                break
            if ready is not None and await ready():
                break
            if all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.02)
        if kill():
            killed_at = time.perf_counter() - t0
        async with asyncio.timeout(timeout_s):
            answers = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)
    return MixedKill(list(answers), killed_at, mid)
