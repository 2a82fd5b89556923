"""Measure a profile on a running instance (through the router when the spec has one).

* prefill: ``repeats`` single requests of each prompt length with one output token; the
  median TTFT is the point;
* decode: ``batch`` requests of ``context`` prompt tokens sent together, each for
  ``decode_tokens`` tokens; the median of the gaps emitted once every request of the
  batch has its first token (the steady batch) is the point.

Every point is saved as soon as it is measured; a run given an existing profile of the
same model, hardware and TP skips the points it already holds (resume).
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from pdctl.sdk.bench.loadgen import Prompt, run_cell, synthetic_prompts
from pdctl.sdk.bench.stats import RequestResult
from pdctl.sdk.plan.profile import DecodePoint, DisaggPoint, PrefillPoint, Profile, ProfileError


@dataclass(frozen=True)
class Sweep:
    prefill_lens: tuple[int, ...]
    decode_points: tuple[tuple[int, int], ...]
    """(batch, context)"""
    repeats: int = 5
    decode_tokens: int = 48

    @property
    def total(self) -> int:
        return len(self.prefill_lens) + len(self.decode_points)


def default_sweep(max_len: int, max_seqs: int, quick: bool) -> Sweep:
    """Prompt lengths up to ~90% of ``max_len`` (minus decode room); batches up to
    ``max_seqs``."""
    room = 64 if quick else 128
    top = max(16, int(max_len * 0.9) - room)
    if quick:
        lens = sorted({16, max(17, top // 4), top})
        batches = sorted({1, max(1, max_seqs)})
        contexts = sorted({16, max(17, top // 2)})
        return Sweep(tuple(lens), tuple((b, c) for b in batches for c in contexts), 3, 24)
    lens = sorted({16, *(max(17, top * k // 8) for k in (1, 2, 4, 6)), top})
    batches = sorted({1, max(1, max_seqs // 2), max(1, max_seqs)})
    contexts = sorted({16, max(17, top // 4), top})
    return Sweep(tuple(lens), tuple((b, c) for b in batches for c in contexts), 5, 48)


def hardware_name(platform_name: str) -> str:
    if platform_name == "cpu":
        model = "unknown CPU"
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            model = platform.processor() or model
        return f"cpu: {model} x{os.cpu_count() or 1}"
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.splitlines()
            if out:
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown GPU"


async def vllm_version(url: str) -> str:
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(url + "/version")
            v = r.json().get("version") if r.status_code == 200 else None
            return str(v) if v else "unknown"
    except (httpx.HTTPError, ValueError):
        return "unknown"


@dataclass
class ProfileProgress:
    on_point: Callable[[str], None] = lambda what: None
    """Called before each point with a short label."""
    on_done: Callable[[str, bool], None] = lambda what, skipped: None


@dataclass
class Profiler:
    url: str
    model: str
    vocab_size: int
    sweep: Sweep
    save: Callable[[Profile], None]
    progress: ProfileProgress = field(default_factory=ProfileProgress)
    _next: int = 0

    def _prompts(self, n: int, length: int) -> list[Prompt]:
        out = synthetic_prompts(
            n, length, self.vocab_size, seed=7 + self._next, first_index=self._next
        )
        self._next += n
        return out

    async def run(self, profile: Profile) -> Profile:
        await self._one(profile, 16)  # warm-up, unmeasured
        have_p = {p.input_len for p in profile.prefill}
        for length in self.sweep.prefill_lens:
            label = f"prefill {length} tokens"
            self.progress.on_point(label)
            if length in have_p:
                self.progress.on_done(label, True)
                continue
            ttfts = []
            for _ in range(self.sweep.repeats):
                r = await self._one(profile, length)
                if r.ttft_s is not None:
                    ttfts.append(r.ttft_s)
            profile.prefill.append(
                PrefillPoint(input_len=length, ttft_s=statistics.median(ttfts), samples=len(ttfts))
            )
            profile.prefill.sort(key=lambda p: p.input_len)
            self.save(profile)
            self.progress.on_done(label, False)
        have_d = {(d.batch, d.context) for d in profile.decode}
        for batch, context in self.sweep.decode_points:
            label = f"decode batch {batch} x {context} tokens"
            self.progress.on_point(label)
            if (batch, context) in have_d:
                self.progress.on_done(label, True)
                continue
            itl, n = await self._batch(batch, context)
            profile.decode.append(DecodePoint(batch=batch, context=context, itl_s=itl, samples=n))
            self.save(profile)
            self.progress.on_done(label, False)
        return profile

    async def run_disagg(self, profile: Profile, lengths: tuple[int, ...], mode: str) -> Profile:
        """TTFT through a real 1P1D pair (``self.url`` is its router) at ``lengths``."""
        await self._one(profile, 16)
        have = {d.input_len for d in profile.disagg}
        for length in lengths:
            label = f"1P1D {mode} {length} tokens"
            self.progress.on_point(label)
            if length in have:
                self.progress.on_done(label, True)
                continue
            ttfts = [
                t
                for _ in range(self.sweep.repeats)
                if (t := (await self._one(profile, length)).ttft_s)
            ]
            profile.disagg.append(
                DisaggPoint(
                    input_len=length, ttft_s=statistics.median(ttfts), mode=mode, samples=len(ttfts)
                )
            )
            profile.disagg.sort(key=lambda d: d.input_len)
            self.save(profile)
            self.progress.on_done(label, False)
        return profile

    async def _one(self, profile: Profile, length: int) -> RequestResult:
        run = await run_cell(self.url, self.model, self._prompts(1, length), 1, concurrency=1)
        r = run.results[0]
        if not r.ok:
            raise ProfileError(
                f"a {length}-token request failed on {self.url} ({r.error}); check the "
                "instance's log (pdctl logs) and the spec's max_model_len"
            )
        return r

    async def _batch(self, batch: int, context: int) -> tuple[float, int]:
        run = await run_cell(
            self.url,
            self.model,
            self._prompts(batch, context),
            self.sweep.decode_tokens,
            concurrency=batch,
        )
        failed = [r for r in run.results if not r.ok]
        if failed:
            raise ProfileError(
                f"decode batch {batch} x {context}: {len(failed)} request(s) failed "
                f"({failed[0].error}); lower max_num_seqs or the context"
            )
        return steady_gaps(run.results)


def steady_gaps(results: list[RequestResult]) -> tuple[float, int]:
    """Median gap after every request of the batch has its first token (falls back to
    every gap when the batch never overlapped)."""
    start = max(r.sent_at + (r.ttft_s or 0.0) for r in results)
    steady: list[float] = []
    every: list[float] = []
    for r in results:
        t = r.sent_at + (r.ttft_s or 0.0)
        for g in r.itl_s:
            if t >= start:
                steady.append(g)
            every.append(g)
            t += g
    gaps = steady if len(steady) >= 3 else every
    if not gaps:
        raise ProfileError("no inter-token gaps were streamed; raise the output length")
    return statistics.median(gaps), len(gaps)


def same_target(old: Profile, new: Profile) -> bool:
    return (old.model, old.hardware, old.tp, old.platform) == (
        new.model,
        new.hardware,
        new.tp,
        new.platform,
    )


def describe(profile: Profile) -> dict[str, Any]:
    return {
        "tag": profile.tag(),
        "prefill_points": len(profile.prefill),
        "decode_points": len(profile.decode),
        "kv_path": None if profile.kv_path is None else profile.kv_path.model_dump(),
        "disagg_points": len(profile.disagg),
    }
