"""A replayed fleet: recorded ``/metrics`` payloads served to the real SDK.

:class:`ReplaySource` builds a fleet of any size from one recorded prefill payload and
one recorded decode payload. Each round moves every counter and histogram on by a
per-instance step (so rates, windows and sparklines move) and varies the gauges; the
router is pdctl's real :class:`~pdctl.sdk.router.Router` behind its ASGI app, fed with
synthetic request timelines, so drain, mode toggles and the flight recorder go through
the same SDK calls as on a live fleet. Nothing here opens a socket.

Used by the tests, the UI benchmark and ``pdctl top --replay DIR``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.client import AsyncRouterClient
from pdctl.sdk.events import Event, EventSource
from pdctl.sdk.fleet import InstanceStatus
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.lint import lint
from pdctl.sdk.metrics.monitor import FleetMonitor, targets_for
from pdctl.sdk.plan.recommend import HOW_TO, LivePlanner
from pdctl.sdk.router import Router, RouterApp
from pdctl.sdk.router.core import Timeline
from pdctl.sdk.spec import FleetSpec
from pdctl.tui.source import Clock, PreflightResult, Source, Update

PREFILL_FILE = "metrics_prefill_push_busy.txt"
DECODE_FILE = "metrics_decode_push_busy.txt"

GAUGES: dict[str, Callable[[int, int], float]] = {
    # gauge name -> value for (round k, instance index i); deterministic waves
    "vllm:num_requests_running": lambda k, i: float((3 * k + i) % 5),
    "vllm:num_requests_waiting": lambda k, i: float((k + 2 * i) % 4),
    "vllm:kv_cache_usage_perc": lambda k, i: 0.2 + 0.06 * ((7 * k + 3 * i) % 10),
    "pdctl:push_registrations_waiting": lambda k, i: float((k + i) % 3),
    "pdctl:push_prefills_waiting": lambda k, i: float((2 * k + i) % 2),
    "pdctl:push_writes_in_flight": lambda k, i: float((k * 5 + i) % 4),
    "pdctl:push_awaiting_notifications": lambda k, i: float((k + 3 * i) % 3),
}
"""Everything else in a payload that is a number is treated as a counter or histogram
part and scaled up each round (bucket counts, sums and counts scale together, so every
histogram stays valid and its window keeps the recorded shape)."""


def advance(text: str, k: int, i: int) -> str:
    """The payload as it would read ``k`` rounds later on instance ``i``."""
    factor = 1.0 + k * (0.2 + 0.05 * (i % 7))
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name = head.split("{", 1)[0]
            gauge = GAUGES.get(name)
            if gauge is not None:
                line = f"{head} {gauge(k, i)}"
            elif name.startswith(("vllm:", "pdctl:")) and not name.startswith(
                ("vllm:num_", "vllm:kv_cache_usage", "vllm:cache_config", "vllm:engine_")
            ):
                with contextlib.suppress(ValueError):
                    line = f"{head} {float(value) * factor}"
        out.append(line)
    return "\n".join(out) + "\n"


def replay_spec(prefills: int, decodes: int) -> tuple[FleetSpec, FleetPlan]:
    """A push-mode GPU fleet spec of the given size (8 instances per host) and its plan."""

    def groups(role: str, n: int, net: int, port: int) -> list[dict[str, Any]]:
        if n <= 8:
            return [{"host": f"10.{net}.0.1", "count": n, "devices": list(range(n)),
                     "http_port": port, "side_channel_port": 5600}]  # fmt: skip
        return [
            {
                "name": f"{role}-n{h}",
                "host": f"10.{net}.{h}.1",
                "count": min(8, n - 8 * h),
                "devices": list(range(min(8, n - 8 * h))),
                "http_port": port,
                "side_channel_port": 5600,
            }
            for h in range((n + 7) // 8)
        ]

    spec = FleetSpec(
        model={"path": "org/replayed-model", "served_name": "tiny"},
        fleet={"name": "replay", "mode": "push", "platform": "gpu", "block_size": 128},
        prefill=groups("prefill", prefills, 0, 8100),
        decode=groups("decode", decodes, 1, 8200),
        router={"host": "127.0.0.1", "port": 8000, "canary": {"rate": 0.25}},
    )
    plan = lint(spec, check_bound_ports=False).plan
    assert plan is not None, "the replay spec is valid by construction"
    return spec, plan


@dataclass(frozen=True)
class Payloads:
    prefill: str
    decode: str

    @classmethod
    def from_dir(cls, root: Path) -> Payloads:
        return cls((root / PREFILL_FILE).read_text(), (root / DECODE_FILE).read_text())


class ReplaySource(Source):
    def __init__(
        self,
        payloads: Payloads,
        *,
        prefills: int = 1,
        decodes: int = 1,
        interval_s: float = 1.0,
        requests_per_round: int = 4,
        clock: Clock | None = None,
        logs: dict[str, Path] | None = None,
        extra: Callable[[str, int, int], str] | None = None,
        preflight: dict[str, Any] | None = None,
        planner: Callable[[FleetSpec], LivePlanner] | None = None,
    ) -> None:
        """``extra(role, k, i)`` returns more payload lines for instance ``i`` at round
        ``k`` (e.g. a connector's series); ``preflight`` is a recorded report
        (``PreflightReport.as_dict()``); ``planner`` makes the recommendation view's
        planner for the replayed spec (without it the view says how to get one)."""
        self.preflight_report = preflight
        spec, plan = replay_spec(prefills, decodes)
        self.plan = plan
        self.payloads = payloads
        self.requests_per_round = requests_per_round
        self.extra = extra
        self.logs = logs or {}
        self.round = 0
        self.down: set[str] = set()
        self.restarts: dict[str, int] = {}
        self.router_core = Router(spec, plan)
        self.transport = _Transport(self, httpx.ASGITransport(app=RouterApp(self.router_core)))
        router_url = next(t.url for t in targets_for(spec, plan) if t.role == "router")
        super().__init__(
            title=f"replay {prefills}P+{decodes}D (recorded vLLM-CPU payloads)",
            interval_s=interval_s,
            spec=spec,
            fleet_name=None,
            router=AsyncRouterClient(router_url, transport=self.transport, pool=False),
            clock=clock or Clock(),
            planner=planner(spec) if planner is not None else None,
            planner_note="" if planner is not None else HOW_TO,
        )
        self.monitor = FleetMonitor.for_fleet(
            spec, plan, interval_s=interval_s, transport=self.transport
        )
        self._index = {(h.host, h.http_port): n for n, h in enumerate(plan.instances)}
        self._cache: dict[int, str] = {}
        self._client: httpx.AsyncClient | None = None
        self.events = EventSource(None)  # the replay's own: kept in memory only

    # ------------------------------------------------------------------ payloads

    def payload(self, index: int) -> str:
        text = self._cache.get(index)
        if text is None:
            inst = self.plan.instances[index]
            base = self.payloads.prefill if inst.role == "prefill" else self.payloads.decode
            text = advance(base, self.round, index)
            if self.extra is not None:
                text += self.extra(inst.role, self.round, index)
            self._cache[index] = text
        return text

    def _timelines(self) -> None:
        rng = random.Random(self.round)
        prefills = [u for u in self.router_core.prefills if not u.drained]
        decodes = [u for u in self.router_core.decodes if not u.drained]
        if not prefills or not decodes:
            return
        seq = self.router_core.mode == "push-sequential"
        now = self.clock.now()
        for n in range(self.requests_per_round):
            p = prefills[(self.round + n) % len(prefills)]
            d = decodes[(self.round * 3 + n) % len(decodes)]
            queue = rng.uniform(0.1, 2.0)
            prefill = rng.uniform(20, 60)
            p_done = queue + prefill
            d_sent = p_done + 0.4 if seq else queue + 0.2
            first = p_done + rng.uniform(3, 15)
            done = first + rng.uniform(40, 160)
            failed = (self.round + n) % 11 == 10
            tl = Timeline(
                id=f"pdctl-r{self.round:04d}-{n}",
                mode=self.router_core.mode,
                endpoint="/v1/completions",
                stream=False,
                received=now - (self.requests_per_round - n) * 0.05,
                t0=0.0,
                prefill=p.name,
                decode=d.name,
                prefill_sent=queue / 1000,
                prefill_done=p_done / 1000,
                decode_sent=d_sent / 1000,
                decode_first_byte=None if failed else first / 1000,
                done=(first if failed else done) / 1000,
                prompt_tokens=rng.randint(20, 60),
                completion_tokens=None if failed else 16,
                outcome="error" if failed else "ok",
                status=502 if failed else 200,
                error=f"decode {d.name} failed mid-answer: connection reset" if failed else None,
            )
            if not failed and n % 4 == 0:  # the output canary's share (router.canary)
                self._canary(tl, "error" if (self.round + n) % 9 == 8 else "match")
            self.router_core.history.append(tl)

    def _canary(self, tl: Timeline, result: str) -> None:
        """What the router's canary would have counted for ``tl`` (its replay)."""
        canary = self.router_core.dispatcher.canary
        if canary is not None and tl.prefill and tl.decode:
            canary.results.inc(tl.prefill, tl.decode, result)
            tl.canary = {"result": result, "on": tl.decode}

    # ------------------------------------------------------------------ Source

    async def poll(self) -> Update:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self.transport)
        self.round += 1
        self._cache.clear()
        self.clock.tick(self.interval_s)
        self._timelines()
        snap = await self.monitor.poll(self._client)
        assert self.router is not None
        reqs = tuple(t.raw for t in await self.router.requests(200))
        state = await self.router.state()
        fleet = {
            i.name: InstanceStatus(
                name=i.name,
                role=i.role,
                url=i.url,
                state="stopped" if i.name in self.down else "ready",
                pid=None,
                exit_code=0 if i.name in self.down else None,
                uptime_s=None,
                restarts=self.restarts.get(i.name, 0),
                log=str(self.logs.get(i.name, "")),
            )
            for i in self.plan.instances
        }
        return self.journal(self.advise(Update(snap, reqs, state, fleet)))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def log_path(self, name: str) -> Path | None:
        return self.logs.get(name)

    async def preflight(self) -> PreflightResult:
        r = self.preflight_report
        if r is None:
            return PreflightResult(False, message="no preflight report recorded in this replay")
        bps = r.get("expected_throughput_bps")
        return PreflightResult(True, r, expected_bps=bps if isinstance(bps, float | int) else None)

    async def restart(self, name: str) -> None:
        self.plan.by_name(name)
        self.down.discard(name)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self._lifecycle(name, "restart", "restarting", "restarted")

    async def stop(self, name: str) -> None:
        self.plan.by_name(name)
        self.down.add(name)
        self._lifecycle(name, "stop", "stopping", "stopped")

    def _lifecycle(self, name: str, action: str, *kinds: str) -> None:
        """What the supervisor would journal for a restart or stop (a control action,
        then the instance's states)."""
        assert self.events is not None
        now = self.clock.now()
        self.events.control(action, name, by="replay", at=now)
        self.events.record([Event(k, name, at=now) for k in kinds])


class _Transport(httpx.AsyncBaseTransport):
    """Routes the SDK's requests: the router's address to its ASGI app, an instance's
    address to its current payload (or a refused connection when it is stopped)."""

    def __init__(self, source: ReplaySource, router: httpx.ASGITransport) -> None:
        self.source = source
        self.router = router

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = self.source._index.get((request.url.host, request.url.port or 80))
        if index is None:
            return await self.router.handle_async_request(request)
        if self.source.plan.instances[index].name in self.source.down:
            raise httpx.ConnectError("connection refused (stopped)", request=request)
        return httpx.Response(200, text=self.source.payload(index))
