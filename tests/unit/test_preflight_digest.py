"""The preflight report for people: findings split into evidence and fix, KV paths with
their expected GB/s, what was not checked; garbage reads as unknown."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdctl.sdk.preflight import run_preflight
from pdctl.sdk.preflight.digest import digest, split_fix
from pdctl.sdk.preflight.model import Inventory, SourceCheck
from tests.unit.test_preflight_verdict import QWEN, _l40s


def worked_example() -> dict[str, Any]:
    """Two PCIe L40S without P2P, a 1.3 s measured transfer against a 0.7 s prefill:
    DO NOT DISAGGREGATE (the published example), through JSON as `--json` gives it."""
    inv: Inventory = _l40s()
    inv.checks = [
        SourceCheck("nvidia-smi", "ok", "2 GPU(s)"),
        SourceCheck("ucx_info", "absent", "ucx_info not on PATH"),
        SourceCheck("NVML", "error", "NVMLError_LibraryNotFound"),
    ]
    report = run_preflight(
        None, model=QWEN, prompt_len=8192, ttft_colocated_s=0.7, measured_transfer_s=1.3,
        inventory=inv,
    )  # fmt: skip
    raw: dict[str, Any] = json.loads(json.dumps(report.as_dict()))
    return raw


def test_split_fix_on_the_reports_convention():
    assert split_fix("no model given: unknown. Do: pass --model DIR") == (
        "no model given: unknown.",
        "pass --model DIR",
    )
    assert split_fix("fleet.platform = cpu: checks do not apply") == (
        "fleet.platform = cpu: checks do not apply",
        "",
    )
    # only the first mark splits: a fix may itself say "Do:"
    assert split_fix("a. Do: b. Do: c") == ("a.", "b. Do: c")


def test_the_worked_example_reads_verdict_findings_paths_and_gaps():
    raw = worked_example()
    d = digest(raw)
    assert d.verdict == "DO NOT DISAGGREGATE"
    assert d.exit_code == 2
    # errors first, each with the report's numbers and, where it gives one, the fix
    assert d.findings[0].severity == "error"
    assert [f.severity for f in d.findings] == sorted(
        (f.severity for f in d.findings), key=["error", "warning", "info"].index
    )
    sig = next(f for f in d.findings if f.code == "TCP_FALLBACK_SIGNATURE")
    assert "0.36 GB/s" in sig.evidence
    assert " Do: " not in sig.evidence
    message = next(w["message"] for w in raw["warnings"] if w["code"] == sig.code)
    assert message.startswith(sig.evidence)
    assert message.endswith(sig.fix)
    assert any(f.fix for f in d.findings)
    (path,) = d.paths
    assert path.path == raw["pairs"][0]["path"]
    assert path.expected_gbps == pytest.approx(12.5)
    assert path.transfer_s == pytest.approx(1.3)
    assert path.verdict == "DO NOT DISAGGREGATE"
    # what was not looked at, and why; what was, is not listed
    assert [(u.name, u.state) for u in d.unchecked] == [("ucx_info", "absent"), ("NVML", "error")]
    assert d.unchecked[1].why == "NVMLError_LibraryNotFound"
    assert d.headline.startswith("DO NOT DISAGGREGATE: ")
    assert d.headline.removeprefix("DO NOT DISAGGREGATE: ") == d.findings[0].evidence


def test_a_quiet_report_headlines_its_slowest_path():
    raw = worked_example()
    raw["warnings"] = []
    raw["verdict"] = "OK"
    d = digest(raw)
    assert d.headline == f"OK: slowest KV path {raw['pairs'][0]['name']} HOST_STAGED, 12.5 GB/s"
    raw["pairs"] = []
    assert digest(raw).headline == "OK"


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"verdict": 3, "warnings": "x", "pairs": [1, None], "checked": {"a": 1}},
        {"warnings": [{"message": None, "code": 5}], "pairs": [{"expected_gbps": "fast"}]},
        {"pairs": [{"kv_bytes": True, "assumptions": "one string"}], "exit_code": "2"},
    ],
)
def test_garbage_reads_as_unknown_never_raises(raw):
    d = digest(raw)
    assert d.verdict in ("UNKNOWN",)
    assert d.exit_code is None
    for f in d.findings:
        assert f.code == "?"
        assert f.evidence == ""
    for p in d.paths:
        assert p.expected_gbps is None
        assert p.kv_bytes is None
        assert p.assumptions == ()
    assert isinstance(d.headline, str)
