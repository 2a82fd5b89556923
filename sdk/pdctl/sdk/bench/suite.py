"""Run a benchmark plan against a fleet spec: each mode on the same hardware budget.

For every fleet configuration the plan needs (push — shared by push and
push-sequential, whose difference is only the router's dispatch —, pull, colocated) the
fleet is started from the same spec with only ``fleet.mode`` changed, so every mode gets
the same instances, devices and cores. Each cell (mode x input length x rate) sends
fresh prompts through the router, records client-side figures per request and the
server-side KV figures of the cell from the fleet's own ``/metrics``, and checks a
sample of outputs against what one instance computes alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.bench.arrivals import arrival_offsets
from pdctl.sdk.bench.loadgen import (
    BenchError,
    Prompt,
    dataset_prompts,
    reference_outputs,
    run_cell,
    shared_prefix_prompts,
    synthetic_prompts,
)
from pdctl.sdk.bench.plan import FLEET_MODE, BenchPlan, Cell
from pdctl.sdk.bench.stats import RequestResult, summarize
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.keys import inference_key
from pdctl.sdk.metrics.monitor import FleetMonitor, Snapshot
from pdctl.sdk.metrics.promtext import MetricsParseError, parse, total
from pdctl.sdk.modelinfo import ModelInfoError, read_model_info, text_config
from pdctl.sdk.spec import FleetSpec, RouterSpec
from pdctl.sdk.urls import router_url

SCHEMA_VERSION = 1


@dataclass
class Progress:
    """What a front end needs to draw progress bars (called on the event loop)."""

    on_phase: Callable[[str], None] = lambda msg: None
    on_cell_start: Callable[[Cell, int], None] = lambda cell, n: None
    on_request: Callable[[RequestResult], None] = lambda r: None
    on_cell_done: Callable[[dict[str, Any]], None] = lambda rec: None


def spec_for(spec: FleetSpec, fleet_mode: str, plan: BenchPlan) -> FleetSpec:
    """The spec with only the mode (and the prefix-caching choice) changed."""
    fleet = spec.fleet.model_copy(
        update={
            "mode": fleet_mode,
            "enable_prefix_caching": plan.prefix_caching,
            "name": f"{spec.fleet.name}-bench-{fleet_mode}",
        }
    )
    groups = {
        role: [g.model_copy(update={"mode": None}) for g in getattr(spec, role)]
        for role in ("prefill", "decode")
    }
    router = spec.router or RouterSpec()
    if "cache_aware" in plan.policies:
        router = router.model_copy(update={"policy": "cache_aware"})
    return spec.model_copy(update={"fleet": fleet, "router": router, **groups})


def _vocab_size(spec: FleetSpec) -> int:
    try:
        info = read_model_info(spec.model.path)
    except ModelInfoError as e:
        raise BenchError(str(e)) from None
    vocab = text_config(info.raw).get("vocab_size") if info is not None else None
    if not isinstance(vocab, int) or vocab <= 0:
        raise BenchError(
            f"cannot read vocab_size from {spec.model.path}/config.json: synthetic prompts "
            "need it (or give --dataset FILE)"
        )
    return vocab


def _server_figures(after: Snapshot) -> dict[str, Any]:
    """KV bytes moved and NIXL transfer times during the cell (the monitor's window
    spans exactly the two scrapes taken around it)."""
    moved = 0.0
    xfer_p50: list[float] = []
    xfer_p99: list[float] = []
    for inst in after.instances:
        t = inst.transfers
        moved += t.bytes_window or 0.0
        if t.xfer_time.p50 is not None:
            xfer_p50.append(t.xfer_time.p50 * 1000)
        if t.xfer_time.p99 is not None:
            xfer_p99.append(t.xfer_time.p99 * 1000)
    rdv = [i.rendezvous for i in after.instances if i.rendezvous and i.role == "prefill"]
    ratios = [r.registration_first_ratio for r in rdv if r.registration_first_ratio is not None]
    return {
        "kv_bytes_moved": moved,
        "median_kv_xfer_ms": max(xfer_p50) if xfer_p50 else None,
        "p99_kv_xfer_ms": max(xfer_p99) if xfer_p99 else None,
        "registration_first_ratio": min(ratios) if ratios else None,
    }


async def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """vLLM's prefix-cache (queried, hit) token counters summed over ``urls``."""
    q = h = 0.0
    async with httpx.AsyncClient(timeout=10) as c:
        for u in urls:
            try:
                samples = parse((await c.get(u + "/metrics")).text)
            except (httpx.HTTPError, MetricsParseError):
                continue
            q += total(samples, "vllm:prefix_cache_queries_total") or 0.0
            h += total(samples, "vllm:prefix_cache_hits_total") or 0.0
    return q, h


DECISIONS = "pdctl_router_disaggregation_decisions_total"


async def decode_alone_count(router: str) -> float:
    """Requests the router has sent to decode alone (no prefill, no KV transfer)."""
    async with httpx.AsyncClient(timeout=10) as c:
        try:
            samples = parse((await c.get(router + "/metrics")).text)
        except (httpx.HTTPError, MetricsParseError):
            return 0.0
    return total(samples, DECISIONS, {"decision": "decode-only"}) or 0.0


class BenchSuite:
    def __init__(
        self,
        spec: FleetSpec,
        plan: BenchPlan,
        *,
        dataset: str | None = None,
        progress: Progress | None = None,
        ready_timeout: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        """``api_key``: what the load carries to the router; default the spec's first
        readable inference key (else admin key), none when the router has no keys."""
        self.api_key = api_key if api_key is not None else inference_key(spec)
        self.spec = spec
        self.plan = plan
        self.dataset = dataset
        self.progress = progress or Progress()
        self.ready_timeout = ready_timeout
        self._next_index = 0
        self._vocab = None if dataset else _vocab_size(spec)

    def _prompts(self, input_len: int, count: int) -> list[Prompt]:
        if self.dataset is not None:
            return dataset_prompts(Path(self.dataset), count)
        assert self._vocab is not None
        if self.plan.shared_prefix is not None:
            groups, suffix = self.plan.shared_prefix
            self._next_index += 1  # a fresh seed: no cell inherits another's prefixes
            return shared_prefix_prompts(
                count,
                input_len,
                self._vocab,
                groups,
                suffix,
                seed=self.plan.seed + self._next_index,
            )
        out = synthetic_prompts(
            count,
            input_len,
            self._vocab,
            seed=self.plan.seed + self._next_index,
            first_index=self._next_index,
        )
        self._next_index += count
        return out

    async def run(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for fleet_mode in self.plan.fleet_modes:
            spec = spec_for(self.spec, fleet_mode, self.plan)
            self.progress.on_phase(f"starting the {fleet_mode} fleet")
            fleet = AsyncFleet(spec, ready_timeout=self.ready_timeout)
            t0 = time.monotonic()
            await fleet.up()
            try:
                self.progress.on_phase(f"{fleet_mode} fleet ready in {time.monotonic() - t0:.0f} s")
                records += await self._run_fleet(spec, fleet, fleet_mode)
            finally:
                self.progress.on_phase(f"stopping the {fleet_mode} fleet")
                await fleet.down()
        return records

    async def _run_fleet(
        self, spec: FleetSpec, fleet: AsyncFleet, fleet_mode: str
    ) -> list[dict[str, Any]]:
        router = router_url(spec)
        model = spec.model.effective_served_name
        reference = next(i.url for i in fleet.plan.instances if i.role in ("decode", "colocated"))
        out, dispatch = [], ""
        for cell in (c for c in self.plan.cells() if FLEET_MODE[c.mode] == fleet_mode):
            if cell.mode in ("push", "push-sequential") and cell.mode != dispatch:
                await fleet.router.set_mode(cell.mode)
                dispatch = cell.mode
            out.append(await self._run_cell(spec, fleet, cell, router, reference, model))
        return out

    async def _run_cell(
        self,
        spec: FleetSpec,
        fleet: AsyncFleet,
        cell: Cell,
        router: str,
        reference: str,
        model: str,
    ) -> dict[str, Any]:
        plan = self.plan
        n = plan.requests_in(cell)
        prompts = self._prompts(cell.input_len, n + plan.warmup)
        if cell.policy:
            await fleet.router.set_policy(cell.policy)
        prefills = [i.url for i in fleet.plan.instances if i.role == "prefill"]
        engines = [i.url for i in fleet.plan.instances if i.role in ("prefill", "decode")]
        hits0 = await prefix_counters(prefills)
        fleet0, alone0 = await prefix_counters(engines), await decode_alone_count(router)
        self.progress.on_cell_start(cell, n)
        monitor = FleetMonitor.for_fleet(spec, fleet.plan, window_s=1e9)
        await monitor.poll()  # opens the window the figures after the cell are taken over
        if plan.concurrency is None:
            offsets = arrival_offsets(
                cell.rate, len(prompts), burstiness=plan.burstiness, seed=plan.seed + n
            )
            run = await run_cell(
                router,
                model,
                prompts,
                plan.output_len,
                offsets=offsets,
                warmup=plan.warmup,
                max_duration_s=plan.cell_duration_s * 2 + 30,
                on_done=self.progress.on_request,
                api_key=self.api_key,
            )
        else:
            run = await run_cell(
                router,
                model,
                prompts,
                plan.output_len,
                concurrency=plan.concurrency,
                warmup=plan.warmup,
                max_duration_s=plan.cell_duration_s * 2 + 30,
                on_done=self.progress.on_request,
                api_key=self.api_key,
            )
        after = await monitor.poll()
        hits1 = await prefix_counters(prefills)
        fleet1, alone1 = await prefix_counters(engines), await decode_alone_count(router)
        queried = hits1[0] - hits0[0]
        fleet_queried = fleet1[0] - fleet0[0]
        rec: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "mode": cell.mode,
            "fleet_mode": spec.fleet.mode,
            "input_len": cell.input_len,
            "output_len": plan.output_len,
            "request_rate": "inf" if math.isinf(cell.rate) else cell.rate,
            "burstiness": plan.burstiness,
            "max_concurrency": plan.concurrency,
            "num_prompts": n,
            "policy": cell.policy or (spec.router.policy if spec.router else None),
            "prefill_prefix_hit_rate": (hits1[1] - hits0[1]) / queried if queried else None,
            # prefills and decodes: decode's hits are prompts it computed alone on top of
            # a prefix it holds, and the prefix of a pushed prompt it already had
            "fleet_prefix_hit_rate": (
                (fleet1[1] - fleet0[1]) / fleet_queried if fleet_queried else None
            ),
            # warmup included, as in the prefix counters
            "decode_alone_share": (alone1 - alone0) / (n + plan.warmup),
        }
        rec.update(summarize(run.results, run.duration_s, plan.slo))
        rec.update(_server_figures(after))
        rec.update(await self._verify(run.results, run.outputs, prompts, reference, model))
        self.progress.on_cell_done(rec)
        return rec

    async def _verify(
        self,
        results: list[RequestResult],
        outputs: list[list[int]],
        prompts: list[Prompt],
        reference: str,
        model: str,
    ) -> dict[str, Any]:
        """Compare a sample of successful outputs with one instance's own greedy output."""
        picks = [r.index for r in results if r.ok and not r.warmup][: self.plan.verify]
        wrong_len = sum(
            1 for r in results if r.ok and not r.warmup and r.output_tokens != self.plan.output_len
        )
        if not picks:
            return {"verified": 0, "mismatched": 0, "wrong_length": wrong_len}
        ref = await reference_outputs(
            reference, model, [prompts[i] for i in picks], self.plan.output_len
        )
        mismatched = sum(outputs[i] != want for i, want in zip(picks, ref, strict=True))
        return {"verified": len(picks), "mismatched": mismatched, "wrong_length": wrong_len}
