"""`pdctl demo` — the README's main job — runs traffic through a real fleet and exits
leaving nothing running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports
from tests.e2e.conftest import processes_mentioning

pytestmark = pytest.mark.e2e


def test_demo_serves_disaggregated_traffic_and_cleans_up(tiny_model: Path, state_root: Path):
    hp, hd, sp, sd, rp = free_ports(5)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdctl.cli.main",
            "demo",
            "--duration",
            "12",
            "--rate",
            "2",
            "--json",
            "--set",
            f"prefill.0.http_port={hp}",
            "--set",
            f"prefill.0.side_channel_port={sp}",
            "--set",
            f"decode.0.http_port={hd}",
            "--set",
            f"decode.0.side_channel_port={sd}",
            "--set",
            f"router.port={rp}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    kinds = [ln.get("kind") for ln in lines]
    assert "fleet-ready" in kinds
    assert kinds.index("fleet-ready") < kinds.index("fleet-stopped")
    summary = lines[-1]["summary"]
    assert summary["sent"] >= 10
    assert summary["ok"] == summary["sent"]
    assert summary["failed"] == 0
    assert summary["kv_bytes_moved"] > 0
    assert summary["decode_prompt_tokens_via_kv_transfer"] > 0
    assert summary["decode_ttft_p50_ms"] > 0
    assert summary["alerts"] == []
    assert processes_mentioning(str(tiny_model)) == []
