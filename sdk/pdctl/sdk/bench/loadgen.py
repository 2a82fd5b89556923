"""The load generator: synthetic prompts, a streaming client, open and closed loops.

Prompts are token-id lists of exact length (OpenAI completions accept them), so no
tokenizer is needed on the client and the length is exact for any model. The first two
tokens encode the request's index, so no two prompts share a prefix and prefix caching
cannot hide a transfer. Requests stream (``stream_options.include_usage`` and
``return_token_ids``) so TTFT, inter-token gaps and the output token ids are observed
as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.bench.stats import RequestResult
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.sse import DONE, EventParser

RESERVED_IDS = 4
"""Token ids 0..3 are special in most vocabularies (unk, bos, eos, pad): never sampled."""


class BenchError(PdctlError):
    """The benchmark cannot run as asked."""


@dataclass(frozen=True)
class Prompt:
    tokens: list[int] | None
    text: str | None = None

    @property
    def payload(self) -> list[int] | str:
        return self.tokens if self.tokens is not None else (self.text or "")

    @property
    def length(self) -> int | None:
        return len(self.tokens) if self.tokens is not None else None


def synthetic_prompts(
    count: int, input_len: int, vocab_size: int, *, seed: int = 0, first_index: int = 0
) -> list[Prompt]:
    """``count`` prompts of exactly ``input_len`` token ids, unique in their first two
    tokens (indices ``first_index``…)."""
    base = vocab_size - RESERVED_IDS
    if base < 2:
        raise BenchError(f"vocab_size {vocab_size} is too small for synthetic prompts")
    if input_len < 2:
        raise BenchError(f"input length {input_len} is too short: use at least 2 tokens")
    if first_index + count > base * base:
        raise BenchError(f"more than {base * base} unique prompts asked for")
    rng = random.Random(seed)
    out = []
    for i in range(first_index, first_index + count):
        head = [RESERVED_IDS + i // base, RESERVED_IDS + i % base]
        tail = [RESERVED_IDS + rng.randrange(base) for _ in range(input_len - 2)]
        out.append(Prompt(head + tail))
    return out


def shared_prefix_prompts(
    count: int, input_len: int, vocab_size: int, groups: int, suffix_len: int, *, seed: int = 0
) -> list[Prompt]:
    """``count`` prompts of ``input_len`` token ids in ``groups`` groups (taken in turn):
    a group's prompts share their first ``input_len - suffix_len`` tokens, then each has
    its own suffix (its index in the first two suffix tokens). ``seed`` draws the
    prefixes, so another seed gives groups nothing in common with these."""
    base = vocab_size - RESERVED_IDS
    if base < 2 or count > base * base:
        raise BenchError(f"vocab_size {vocab_size} is too small for {count} prompts")
    rng = random.Random(seed)
    prefixes = [
        [RESERVED_IDS + rng.randrange(base) for _ in range(input_len - suffix_len)]
        for _ in range(groups)
    ]
    out = []
    for i in range(count):
        head = [RESERVED_IDS + i // base, RESERVED_IDS + i % base]
        tail = [RESERVED_IDS + rng.randrange(base) for _ in range(suffix_len - 2)]
        out.append(Prompt(prefixes[i % groups] + head + tail))
    return out


def dataset_prompts(path: Path, count: int) -> list[Prompt]:
    """Prompts from a JSON-lines file: ``{"prompt": "..."}`` or ``{"prompt_token_ids":
    [...]}`` per line, cycled to ``count``."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise BenchError(f"cannot read dataset {path}: {e.strerror or e}") from None
    found: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise BenchError(f"{path}:{n}: not JSON") from None
        ids = row.get("prompt_token_ids") if isinstance(row, dict) else None
        text = row.get("prompt") if isinstance(row, dict) else None
        if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
            found.append(Prompt(ids))
        elif isinstance(text, str) and text:
            found.append(Prompt(None, text))
        else:
            raise BenchError(f'{path}:{n}: needs "prompt" (text) or "prompt_token_ids" (ints)')
    if not found:
        raise BenchError(f"{path} holds no prompts")
    return [found[i % len(found)] for i in range(count)]


def request_body(model: str, prompt: Prompt, output_len: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt.payload,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    timeout_s: float,
) -> list[int]:
    """Send one streaming completion; fill ``result``; return the output token ids."""
    t0 = time.monotonic()
    result.sent_at = t0
    tokens: list[int] = []
    last: float | None = None
    try:
        async with client.stream(
            "POST", url + "/v1/completions", json=body, timeout=timeout_s
        ) as resp:
            if resp.status_code != 200:
                raw = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {raw[:200]}"
                return tokens
            parser, done = EventParser(), False
            async for data in resp.aiter_bytes():
                for event in parser.feed(data):
                    done = done or event.data == DONE
                    if done:
                        break
                    chunk = json.loads(event.data)
                    if "error" in chunk and not chunk.get("choices"):
                        result.error = str(chunk["error"])[:200]
                        return tokens
                    last = _take(chunk, result, tokens, t0, last)
                if done:
                    break
    except (httpx.HTTPError, ValueError, OSError) as e:
        result.error = f"{type(e).__name__}: {e}"[:200]
        return tokens
    result.e2e_s = time.monotonic() - t0
    if not result.output_tokens:
        result.output_tokens = len(tokens)
    result.ok = result.ttft_s is not None
    if not result.ok and result.error is None:
        result.error = "no tokens streamed"
    return tokens


def _take(
    chunk: dict[str, Any], result: RequestResult, tokens: list[int], t0: float, last: float | None
) -> float | None:
    """One streamed event into ``result`` and ``tokens``; the time of its last token."""
    now = time.monotonic()
    for choice in chunk.get("choices") or ():
        ids = choice.get("token_ids") or []
        if not ids and not choice.get("text"):
            continue
        if last is None:
            result.ttft_s = now - t0
        else:
            result.itl_s.append(now - last)
        last = now
        tokens.extend(int(t) for t in ids)
        result.text += choice.get("text") or ""
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        result.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            result.prompt_tokens = int(usage["prompt_tokens"])
    return last


@dataclass
class CellRun:
    results: list[RequestResult]
    outputs: list[list[int]]
    duration_s: float
    """From the first measured send to the last completion."""


async def run_cell(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    output_len: int,
    *,
    offsets: Sequence[float] | None = None,
    concurrency: int | None = None,
    warmup: int = 0,
    timeout_s: float = 300.0,
    max_duration_s: float | None = None,
    on_done: Any = None,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CellRun:
    """Send ``prompts`` (the first ``warmup`` of them first and unmeasured) open loop at
    ``offsets`` seconds, or closed loop with ``concurrency`` in flight. Requests not
    started by ``max_duration_s`` are skipped (recorded as not sent). ``api_key``: sent
    as ``Authorization: Bearer`` (a router with keys)."""
    if (offsets is None) == (concurrency is None):
        raise BenchError("give either arrival offsets (open loop) or a concurrency (closed)")
    results = [
        RequestResult(i, p.length or 0, 0.0, warmup=i < warmup) for i, p in enumerate(prompts)
    ]
    outputs: list[list[int]] = [[] for _ in prompts]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(limits=limits, headers=headers, transport=transport) as client:

        async def one(i: int) -> None:
            body = request_body(model, prompts[i], output_len, stream=True)
            outputs[i] = await stream_one(client, url, body, results[i], timeout_s)
            if on_done is not None:
                on_done(results[i])

        for i in range(min(warmup, len(prompts))):
            await one(i)
        measured = range(min(warmup, len(prompts)), len(prompts))
        start = time.monotonic()
        deadline = None if max_duration_s is None else start + max_duration_s
        if offsets is not None:
            base = offsets[warmup] if len(offsets) > warmup else 0.0
            tasks = []
            for i in measured:
                delay = start + (offsets[i] - base) - time.monotonic()
                if deadline is not None and start + offsets[i] - base > deadline:
                    results[i].error = "not sent: cell time limit"
                    continue
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
        else:
            queue = list(measured)

            async def worker() -> None:
                while queue:
                    i = queue.pop(0)
                    if deadline is not None and time.monotonic() > deadline:
                        results[i].error = "not sent: cell time limit"
                        continue
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(max(1, concurrency or 1))))
        duration = time.monotonic() - start
    return CellRun(results, outputs, duration)


async def reference_outputs(
    url: str, model: str, prompts: Sequence[Prompt], output_len: int, timeout_s: float = 300.0
) -> list[list[int]]:
    """Greedy output token ids of ``prompts`` computed by one instance alone (no KV
    transfer): the yardstick for "every disaggregated request was correct"."""
    out: list[list[int]] = []
    async with httpx.AsyncClient() as client:
        for p in prompts:
            r = await client.post(
                url + "/v1/completions",
                json=request_body(model, p, output_len, stream=False),
                timeout=timeout_s,
            )
            if r.status_code != 200:
                raise BenchError(f"reference request to {url} failed: HTTP {r.status_code}")
            choice = r.json()["choices"][0]
            out.append([int(t) for t in choice.get("token_ids") or []])
    return out
