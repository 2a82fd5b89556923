"""`pdctl bench --preset cpu-smoke` end to end on the real CPU demo fleet: every request
correct, push-concurrent TTFT below push-sequential TTFT by a stated margin (the median
of the per-cell ratios), the outputs written."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports
from tests.e2e.conftest import processes_mentioning

pytestmark = pytest.mark.e2e

MIN_SEQUENTIAL_OVER_PUSH = 1.05
"""The claim, with its margin: push-sequential's median TTFT is at least 5 % above
push's (concurrent dispatch), in the median over the preset's cells."""


def test_cpu_smoke_preset(tiny_model: Path, state_root: Path, tmp_path: Path):
    hp, hd, sp, sd, rp = free_ports(5)
    out = tmp_path / "bench"
    sets = [
        f"model.path={tiny_model}",
        "fleet.name=e2e-bench",
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={rp}",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdctl.cli.main",
            "bench",
            "--preset",
            "cpu-smoke",
            "--out",
            str(out),
            "--json",
            *(a for s in sets for a in ("--set", s)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PDCTL_STATE_DIR": str(state_root)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    recs = doc["results"]
    assert {r["mode"] for r in recs} == {"push", "push-sequential"}
    for r in recs:
        assert r["failed"] == 0, r["errors"]
        assert r["completed"] == r["num_prompts"]
        assert r["verified"] == 4
        assert r["mismatched"] == 0
        assert r["wrong_length"] == 0
        assert r["kv_bytes_moved"] > 0
    # each cell's median TTFT is over its requests (~20 at 1 req/s, ~40 at 2 req/s); the
    # bench's ratios compare the arms cell by cell, and the claim is on their median
    assert len(doc["ratios"]) == 2  # push-sequential vs push, one per rate
    cells = sorted(doc["ratios"], key=lambda r: r["request_rate"])
    assert all(r["mode"] == "push-sequential" and r["vs"] == "push" for r in cells), cells
    seq_over_push = [r["median_ttft_ratio"] for r in cells]
    print(f"\nmedian TTFT push-sequential / push per rate: {seq_over_push}")
    assert statistics.median(seq_over_push) >= MIN_SEQUENTIAL_OVER_PUSH, seq_over_push
    # sequential dispatch: prefill always finishes before decode registers
    seq = [r for r in recs if r["mode"] == "push-sequential"]
    assert all(r["registration_first_ratio"] == 0 for r in seq)
    saved = json.loads((out / "bench.json").read_text())
    assert saved["results"] == recs
    assert (out / "bench.csv").read_text().count("\n") == len(recs) + 1
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not processes_mentioning("e2e-bench"), "fleet processes left behind"
