"""The overload preset's load and figures (:mod:`pdctl.sdk.bench.overload`) against
pdctl's mock engines behind two routers, one with admission and one without."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

from pdctl.sdk.bench.overload import (
    CAUSES,
    WITH,
    WITHOUT,
    Outcome,
    OverloadPlan,
    cause_of,
    run_overload,
    summary,
)
from pdctl.sdk.bench.overloadside import cpu_seconds, histogram_delta, renice
from pdctl.sdk.router.mock import MockConfig
from tests.unit.test_router import rig


def test_summary_counts_goodput_sheds_and_the_interactive_tail():
    outs = [
        Outcome("interactive", 1.5, status=200, ttft_s=0.5, answered_s=0.9),  # good
        Outcome("interactive", 1.5, status=200, ttft_s=2.0, answered_s=2.5),  # late
        Outcome("standard", 3.0, status=200, ttft_s=1.0, answered_s=1.2),  # good
        Outcome("batch", 10.0, status=429, answered_s=0.01, reason="decode_saturated"),
        Outcome("batch", 10.0, status=503, answered_s=0.2, reason="slo_unreachable"),
        Outcome("standard", 3.0, gave_up=True),
        Outcome("standard", 3.0),  # no answer, not given up: lost
    ]
    s = summary(outs, duration_s=2.0)
    assert s["offered"] == 7
    assert s["good"] == 2
    assert s["goodput_rps"] == 1.0  # 2 good / 2 s
    assert s["good_by_class"] == {"interactive": 1, "standard": 1, "batch": 0}
    assert s["by_status"] == {"200": 3, "429": 1, "503": 1, "gave_up": 1, "None": 1}
    assert s["shed"] == 2
    assert s["shed_within_50ms"] == 1  # the 429 at 10 ms; the 503 took 200 ms
    assert s["shed_by"] == {
        "429 decode_saturated batch": {"n": 1, "max_ms": 10.0},
        "503 slo_unreachable batch": {"n": 1, "max_ms": 200.0},
    }
    assert s["interactive_ttft_p99_ms"] == 2000.0  # the slower of the two admitted
    assert s["lost"] == 1


def test_late_answers_are_counted_by_cause():
    """Every non-2xx answer slower than 50 ms is counted under its cause, from its status
    and pdctl-shed-when; fast ones and 200s are not."""

    def shed(status: int, when: str | None, ms: float, reason: str = "x") -> Outcome:
        return Outcome("batch", 10.0, status=status, answered_s=ms / 1000, reason=reason, when=when)

    outs = [
        shed(429, "queued", 900),  # its place given to a higher class
        shed(504, "queued", 10000),  # its SLO passed while queued
        shed(504, "queued", 3000),
        shed(503, "queued", 10000),  # max_queue_wait_s without room
        shed(503, "arrival", 70),  # decided at arrival, answered slowly
        shed(503, "arrival", 10),  # fast: not late
        shed(504, None, 2000, "deadline_exceeded"),  # admitted, no first byte in time
        Outcome("batch", 10.0, status=502, answered_s=0.3),  # an upstream error
        Outcome("batch", 10.0, status=200, ttft_s=0.1, answered_s=0.5),
    ]
    assert [cause_of(o) for o in outs[:5]] == [
        "evicted",
        "deadline_in_queue",
        "deadline_in_queue",
        "queue_timeout",
        "arrival",
    ]
    late = summary(outs, duration_s=1.0)["late_by_cause"]
    assert set(late) == set(CAUSES)
    assert {k: v["n"] for k, v in late.items()} == {
        "evicted": 1,
        "deadline_in_queue": 2,
        "queue_timeout": 1,
        "arrival": 1,
        "other": 2,
    }
    assert late["deadline_in_queue"]["max_ms"] == 10000.0
    assert late["arrival"]["p50_ms"] == 70.0
    assert late["other"]["sent"] == ["batch@0.0", "batch@0.0"]
    outs[1].sent_s, outs[2].sent_s = 7.25, 3.0
    assert summary(outs, duration_s=1.0)["late_by_cause"]["deadline_in_queue"]["sent"] == [
        f"{outs[2].klass}@3.0",
        f"{outs[1].klass}@7.2",
    ]


async def test_both_arms_run_in_one_run_and_only_admission_sheds():
    plan = OverloadPlan(
        load=4,
        duration_s=1.0,
        rounds=2,
        capacity_s=0.5,
        conc=2,
        prompt_words=4,
        give_up_s=20,
        client_processes=1,  # one process of its own: the path the benchmark takes
    )
    slow = MockConfig(role="decode", delay_s=0.1)
    tight = {
        "decode_in_flight_per_instance": 1,
        "prefill_in_flight_per_instance": 1,
        "max_queued": 1,
        "max_queue_wait_s": 0.5,  # the one queued is shed soon (the default waits 10 s)
    }
    seen: list[str] = []

    async def after(arm: str, url: str) -> dict[str, str]:
        seen.append(arm)
        return {"url": url}

    async with AsyncExitStack() as stack:
        on = await stack.enter_async_context(
            rig("push", decodes=[slow], router={"admission": tight})
        )
        off = await stack.enter_async_context(
            rig("push", decodes=[slow], router={"admission": {"enabled": False}})
        )
        record = await run_overload({WITH: on.url, WITHOUT: off.url}, plan, after_arm=after)
    assert seen == [WITH, WITHOUT, WITHOUT, WITH]  # the order alternates round by round
    assert record["capacity_rps"] > 0
    assert set(record["rounds"]) == {WITH, WITHOUT}
    for arm, rounds in record["rounds"].items():
        assert len(rounds) == 2
        for r in rounds:
            assert r["offered"] > 0
            assert r["lost"] == 0
            assert r["url"] == (on.url if arm == WITH else off.url)
            assert set(r["ttft_prediction"]) == {"predicted", "error_p50", "error_p90"}
            (client,) = r["client_loop_lag"]["processes"]
            assert set(client) == {"p50_ms", "p99_ms", "max_ms", "cpu_share"}
            assert set(r["tcp_drops"]) <= {"ListenDrops", "TCPSynRetrans"}
            if arm == WITHOUT:
                assert r["router_shed"] is None  # no admission, no shed answers to time
                assert r["router_loop_lag"] is None
            else:
                assert r["router_loop_lag"]["n"] > 0
    for r in record["rounds"][WITH]:
        # every late answer has a cause; a shed one says when it was shed
        assert set(r["late_by_cause"]) == set(CAUSES)
        assert r["late_by_cause"]["other"]["n"] == 0
        # the router's own count of its shed answers is the client's
        router = r["router_shed"]
        assert sum(v["n"] for v in router.values()) == r["shed"]
        assert set(router) == {"arrival", "queued"}
    assert all(r["shed"] == 0 for r in record["rounds"][WITHOUT])
    shed = [r for r in record["rounds"][WITH] if r["shed"]]
    assert shed, "at 4x capacity with one place in flight, admission sheds"
    for r in shed:
        for key in r["shed_by"]:
            status, reason, klass = key.split()
            assert status in ("429", "503", "504")
            assert reason in ("prefill_saturated", "decode_saturated", "slo_unreachable")
            assert klass in ("interactive", "standard", "batch")
    med = record["goodput_median_rps"]
    assert record["goodput_ratio"] == (med[WITH] / med[WITHOUT] if med[WITHOUT] else None)


def test_the_routers_shed_timings_are_one_arms_share_of_its_histogram():
    before = {"arrival": {0.01: 2.0, 0.05: 3.0, 0.1: 3.0, float("inf"): 3.0}}
    after = {
        "arrival": {0.01: 100.0, 0.05: 200.0, 0.1: 202.0, float("inf"): 203.0},
        "queued": {0.01: 0.0, 0.05: 0.0, 0.1: 1.0, float("inf"): 1.0},
    }
    got = histogram_delta(before, after)
    assert got == {
        "arrival": {"n": 200, "within_50ms": 197, "p99_under_ms": 100.0, "max_under_ms": None},
        "queued": {"n": 1, "within_50ms": 0, "p99_under_ms": 100.0, "max_under_ms": 100.0},
    }
    assert histogram_delta(None, None) is None


def test_the_cli_preset_plans_from_its_arguments(capsys, tmp_path, monkeypatch):
    import json

    from pdctl.cli.main import main

    monkeypatch.chdir(tmp_path)  # no ./pdctl.toml: the demo spec
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setattr("pdctl.cli.tinymodel.ensure_tiny_model", lambda quiet: model)
    argv = ["bench", "--preset", "overload", "--load", "3", "--duration", "20", "--rounds", "2"]
    assert main([*argv, "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["load"], plan["duration_s"], plan["rounds"]) == (3.0, 20.0, 2)


def test_the_cli_rows_name_each_arm_and_round():
    from pdctl.cli.benchoverload import rows

    r = summary([Outcome("interactive", 1.5, status=200, ttft_s=0.5)], duration_s=1.0)
    r["ttft_prediction"] = {"predicted": 0, "error_p50": None, "error_p90": None}
    (row,) = rows({"rounds": {WITH: [r]}})
    assert (row["arm"], row["round"], row["goodput_rps"], row["shed"]) == (WITH, 1, 1.0, 0)


def test_renice_lowers_every_process_of_a_group():
    import os
    import subprocess
    import sys

    code = "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        for _ in range(200):  # its child, in the same group, started
            members = [
                int(p)
                for p in os.listdir("/proc")
                if p.isdigit() and _pgid(int(p)) == leader.pid and int(p) != leader.pid
            ]
            if members:
                break
            time.sleep(0.01)
        assert members
        assert renice([None, leader.pid], 7) == [leader.pid]
        for pid in (leader.pid, *members):
            assert os.getpriority(os.PRIO_PROCESS, pid) == 7
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def _pgid(pid: int) -> int | None:
    import os

    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_cpu_seconds_of_a_process():
    import os

    used = cpu_seconds(os.getpid())
    assert used is not None
    assert used > 0
    assert cpu_seconds(None) is None
    assert cpu_seconds(2**22 + 12345) is None  # no such process
