"""A layout vLLM refuses at run time, forced past lint on the real CPU fleet: prefill TP1
pushing to decode TP4 with the tiny model's 2 KV heads (``examples/cpu-1p1d.toml --set
decode.0.tp=4``). vLLM's prefill refuses that decode at its WRITE handshake
(``_validate_remote_agent_handshake``); pdctl's decode sees it coming, so every request
is answered with an error within seconds (not after the 120 s registration timeout),
both sides name the layout in their logs, and neither holds KV afterwards.

One fleet for the module (its TP4 decode is four workers on one core: slow to start,
light to run); a few requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk import chaos
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.freeports import free_ports
from pdctl.sdk.lint import lint
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.e2e

NAME = "e2e-layout"
ANSWER_S = 5.0
"""The issue's goal: every request answered with an error within 5 s."""
IDLE_BACK_S = 5.0
LAYOUT = "prefill TP1 → decode TP4 with 2 KV heads"


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    hp, hd, sp, sd, rp = free_ports(5)
    overrides = [
        "decode.0.tp=4",
        f"model.path={tiny_model}",
        f"fleet.name={NAME}",
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={rp}",
    ]
    spec = load_spec(EXAMPLES / "cpu-1p1d.toml", overrides, environ={}).spec
    # whatever lint refuses this layout with (the heterogeneous-TP rule) is waived, on
    # purpose: the point is what happens at run time when it is launched anyway
    waived = sorted({e.code for e in lint(spec, check_bound_ports=False).errors})
    print(f"  launching past lint errors {waived}")
    f = Fleet(spec, grace=5, ready_timeout=420, ignore_lint=waived)
    try:
        f.up()
        yield f
    finally:
        f.close()


def _log_text(f: Fleet, name: str) -> str:
    logs = sorted((f.fleet.dir / "logs").glob(f"{name}*"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


def test_every_request_is_an_error_within_seconds_and_no_kv_stays(fleet: Fleet):
    urls = [p.url for p in fleet.fleet.plan.instances]

    async def run() -> None:
        async with httpx.AsyncClient() as c:
            baseline = await chaos.fresh_idle(c, urls)
            answers = await asyncio.gather(
                *(
                    chaos.send(c, fleet.fleet.router_url, chaos.completion(f"layout {i} " * 20))
                    for i in range(4)
                )
            )
            for a in answers:
                print(f"  answer {a.status} after {a.seconds:.2f} s ({a.error})")
            assert all(a.status is not None and a.status >= 500 for a in answers), answers
            slowest = max(a.seconds for a in answers)
            assert slowest < ANSWER_S, f"slowest answer {slowest:.1f} s"
            back, last = await chaos.kv_back_to_idle(c, baseline, wait_s=IDLE_BACK_S)
            print(f"  KV back to idle after {back}")
            assert all(v is not None for v in back.values()), (back, last, baseline)

    t0 = time.perf_counter()
    asyncio.run(run())
    print(f"  module body {time.perf_counter() - t0:.1f} s")
    decode_log, prefill_log = _log_text(fleet, "decode"), _log_text(fleet, "prefill")
    assert LAYOUT in decode_log  # decode names the layout problem
    assert "_validate_remote_agent_handshake" in decode_log
    # prefill let go of the KV at once (decode's release), not at its 120 s lease
    assert "released the KV" in prefill_log
