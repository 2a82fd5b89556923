"""`pdctl profile --quick` on the CPU demo fleet (one colocated instance, then a 1P1D push
pair, then the probe), a resumed run that measures nothing again, then `pdctl plan` on
the profile it wrote; and the UI's live recommendation computed from a running fleet."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.plan import Layout, LivePlanner
from pdctl.tui.source import LiveSource, Update
from tests.conftest import free_ports
from tests.e2e.conftest import WORDS, demo_spec, processes_mentioning, running_fleet
from tests.unit.tui_support import tiny_profile

pytestmark = pytest.mark.e2e


def _pdctl(args: list[str], state_root: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PDCTL_STATE_DIR": str(state_root)},
        check=False,
    )


def test_profile_quick_then_plan(tiny_model: Path, state_root: Path, tmp_path: Path):
    hp, hd, sp, sd, rp = free_ports(5)
    sets = [
        f"model.path={tiny_model}",
        "fleet.name=e2e-plan",
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={rp}",
    ]
    out = tmp_path / "profile.json"
    argv = ["profile", "--quick", "-o", str(out), "--json"]
    argv += [a for s in sets for a in ("--set", s)]
    first = _pdctl(argv, state_root, 600)
    assert first.returncode == 0, first.stderr[-3000:]
    prof = json.loads(out.read_text())
    assert prof["model"] == "tiny"
    assert prof["platform"] == "cpu"
    assert prof["hardware"].startswith("cpu: ")
    assert prof["tp"] == 1
    assert prof["vllm_version"].startswith("0.32")
    assert len(prof["prefill"]) == 3
    assert len(prof["decode"]) == 4
    assert all(p["ttft_s"] > 0 for p in prof["prefill"])
    assert [d["input_len"] for d in prof["disagg"]] == sorted(
        p["input_len"] for p in prof["prefill"]
    )
    assert all(d["mode"] == "push" and d["ttft_s"] > 0 for d in prof["disagg"])
    assert prof["kv_path"]["bytes_per_s"] > 0
    assert "pdctl probe" in prof["kv_path"]["source"]
    assert not processes_mentioning("e2e-plan"), "fleet processes left behind"
    # resumed: every point is there, nothing is started again
    again = _pdctl(argv, state_root, 120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["resumed_points"] == 10
    assert "starting" not in again.stderr
    plan = _pdctl(
        [
            "plan",
            "--profile",
            str(out),
            "--isl",
            "64",
            "--osl",
            "32",
            "--rate",
            "1",
            "--ttft-slo",
            "2000",
            "--itl-slo",
            "500",
            "--budget",
            "2",
            "--json",
        ],
        state_root,
        60,
    )
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    names = {c["layout"] for c in doc["candidates"]}
    assert names == {"colocated x1", "colocated x2", "1P1D push", "1P1D pull"}
    assert doc["recommended"] in names
    assert doc["kv_path"]["path"] == "measured P/D"
    best = next(c for c in doc["candidates"] if c["layout"] == doc["recommended"])
    assert best["meets_slos"]
    assert 0 < best["ttft_ms"]["p50"] < 2000


def test_live_recommendation_from_a_running_fleet(tiny_model: Path, state_root: Path):
    """The UI's source on a real 1P1D push fleet: the recommendation's live figures are
    the snapshot's, the lengths are what the requests used, the factors observed /
    predicted (the profile is the hand-made one of the UI tests)."""
    spec, _ = demo_spec(tiny_model, "e2e-plan-live")
    assert spec.router is not None
    url = f"http://127.0.0.1:{spec.router.port}/v1/completions"
    with contextlib.contextmanager(running_fleet)(spec) as fleet:
        planner = LivePlanner(tiny_profile(), spec, "tiny-profile")
        src = LiveSource(spec, fleet.fleet.plan, window_s=600, planner=planner)

        async def observe() -> tuple[Update, Update, list[dict[str, int]]]:
            before = await src.poll()
            usage = []
            async with httpx.AsyncClient(timeout=60) as client:
                for n in range(8):
                    body = {
                        "model": "tiny",
                        "prompt": " ".join(WORDS[: 4 + n]),
                        "max_tokens": 6,
                        "temperature": 0,
                        "ignore_eos": True,
                    }
                    r = await client.post(url, json=body)
                    assert r.status_code == 200, r.text
                    usage.append(r.json()["usage"])
            after = await src.poll()
            await src.close()
            return before, after, usage

        before, after, usage = asyncio.run(observe())
    assert before.recommendation is None
    assert "no request rate" in before.recommendation_note
    rec = after.recommendation
    assert rec is not None, after.recommendation_note
    print(json.dumps(rec.as_dict(), indent=1))  # the figures, for the record (-s)
    snap = after.snapshot
    p, d = snap.instance("prefill-0"), snap.instance("decode-0")
    assert rec.current == Layout("push", 1, 1)
    # the figures are the live snapshot's
    assert rec.load["rate"].value == p.request_rate
    assert p.request_rate is not None
    assert p.span_s is not None
    assert p.request_rate * p.span_s == pytest.approx(8)  # the 8 requests, one scrape apart
    prompts = sum(u["prompt_tokens"] for u in usage) / len(usage)
    outputs = sum(u["completion_tokens"] for u in usage) / len(usage)
    assert rec.load["isl"].value == pytest.approx(prompts)
    assert rec.load["osl"].value == pytest.approx(outputs)
    assert rec.observed["ttft_p50"].value == d.ttft.p50
    assert rec.observed["itl_p50"].value == d.itl.p50
    # factors: observed / predicted, applied to the recommendation's expectation
    pred, factor = rec.predicted["ttft_p50"].value, rec.factors["ttft"].value
    assert pred is not None
    assert factor is not None
    assert d.ttft.p50 is not None
    assert factor == pytest.approx(d.ttft.p50 / pred, abs=1e-3)
    assert rec.correction is not None
    assert rec.correction.window_s == max(i.span_s for i in snap.instances if i.span_s is not None)
    best = rec.plan.best
    assert rec.expected["ttft_p50"].value == best.pred.ttft_s["p50"]
    assert not processes_mentioning("e2e-plan-live"), "fleet processes left behind"
