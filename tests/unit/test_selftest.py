"""The GPU smoke kit's CPU parts: step sequencing (a failing step, a step that needs it,
the deadline), the report (JSON + text), the checks of each step's output, and the
command line. The steps themselves need a GPU (tests/gpu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl.cli.main import main
from pdctl.sdk import selftest
from pdctl.sdk.selftest import Step, StepFailed, run_steps, write_report
from pdctl.sdk.selftest import gpu as kit


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _step(name: str, clock: Clock, took: float, result: Any, **kw: Any) -> Step:
    def run(budget_s: float) -> dict[str, Any]:
        clock.t += took
        if isinstance(result, Exception):
            raise result
        return dict(result)

    return Step(name, f"step {name}", run, kw.pop("budget_s", 10), **kw)


def test_a_failing_step_is_reported_and_what_needs_it_is_skipped():
    clock = Clock()
    seen: list[str] = []
    report = run_steps(
        "gpu",
        [
            _step("a", clock, 1, {"x": 1}),
            _step("b", clock, 2, StepFailed("b broke", {"found": 3})),
            _step("c", clock, 1, {}, needs=("b",)),
            _step("d", clock, 1, RuntimeError("bug")),
            _step("e", clock, 1, {"y": 2}, needs=("a",)),
        ],
        deadline_s=100,
        clock=clock,
        on_step=lambda r: seen.append(f"{r.name}:{r.outcome}"),
    )
    assert seen == ["a:ok", "b:failed", "c:skipped", "d:failed", "e:ok"]
    by = {s.name: s for s in report.steps}
    assert (by["b"].error, by["b"].detail, by["b"].seconds) == ("b broke", {"found": 3}, 2)
    assert by["c"].error == "needs b"
    assert by["d"].error == "RuntimeError: bug"
    assert report.ok is False
    assert report.seconds == 5  # c never ran


def test_steps_that_no_longer_fit_the_deadline_are_skipped():
    clock = Clock()
    report = run_steps(
        "gpu",
        [_step("a", clock, 8, {}), _step("b", clock, 1, {}, budget_s=5)],
        deadline_s=10,
        clock=clock,
    )
    assert [s.outcome for s in report.steps] == ["ok", "skipped"]
    assert "out of time: 2 s left of the 10 s deadline" in report.steps[1].error


def test_the_report_is_written_as_json_and_text(tmp_path: Path):
    clock = Clock()
    report = run_steps(
        "gpu",
        [_step("a", clock, 1, {"gbps": 12.5}), _step("b", clock, 1, StepFailed("no lane"))],
        deadline_s=60,
        clock=clock,
    )
    js, txt = write_report(report, tmp_path / "out")
    doc = json.loads(js.read_text())
    assert doc["ok"] is False
    assert [(s["name"], s["outcome"]) for s in doc["steps"]] == [("a", "ok"), ("b", "failed")]
    assert doc["steps"][0]["detail"] == {"gbps": 12.5}
    text = txt.read_text()
    assert "FAILED" in text.splitlines()[0]
    assert "[ok  ] step a" in text
    assert "[FAIL] step b" in text
    assert "no lane" in text
    assert "gbps: 12.5" in text


PROBE_OK: dict[str, Any] = {
    "ok": True,
    "config": {"device": "cuda"},
    "gbps_per_request_p50": 180.0,
    "integrity": {"checked": 23, "mismatched": []},
    "ucx": {"transports": ["cuda_ipc/cuda"]},
}


def test_a_good_probe_report_passes_with_its_lane():
    found = kit.check_probe(0, PROBE_OK)
    assert (found["ucx_lane"], found["gpu_lane"], found["checked"]) == ("cuda_ipc/cuda", True, 23)
    tcp = kit.check_probe(0, {**PROBE_OK, "ucx": {"transports": ["tcp/eth0"]}})
    assert tcp["gpu_lane"] is False  # reported, not failed: the report shows the lane


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"error": "no CUDA"}, "the probe failed: no CUDA"),
        ({"ok": False}, "failed requests"),
        ({"config": {"device": "cpu"}}, "on cpu, not the GPU"),
        ({"integrity": {"checked": 23, "mismatched": [4]}}, "1 of 23 requests differ"),
        ({"integrity": {"checked": 0, "mismatched": []}}, "0 of 0"),
        ({"ucx": {"transports": None}}, "lane is unknown"),
    ],
)
def test_a_bad_probe_report_fails_naming_why(change: dict[str, Any], message: str):
    with pytest.raises(StepFailed, match=message):
        kit.check_probe(0, {**PROBE_OK, **change})


def test_preflight_and_answers_checks():
    doc = {"verdict": "PAYS", "pairs": [{"name": "GPU0 -> GPU0", "path": "nvlink"}]}
    assert kit.check_preflight(0, doc)["path"] == "nvlink"
    assert kit.check_preflight(1, {"verdict": "UNKNOWN", "pairs": []})["pair"] is None
    with pytest.raises(StepFailed, match="exit 2"):
        kit.check_preflight(2, {"verdict": "UNKNOWN"})

    class R:
        def __init__(self, code: int) -> None:
            self.status_code = code

    assert kit.check_answers([R(200)] * 3, 3)["answered_200"] == 3
    with pytest.raises(StepFailed, match="2 of 3 requests answered 200") as e:
        kit.check_answers([R(200), R(200), TimeoutError()], 3)
    assert e.value.detail["statuses"] == {"200": 2, "TimeoutError": 1}


def test_the_pair_shares_one_gpu_and_only_that_lint_error_is_waived(tmp_path: Path):
    from pdctl.sdk.lint import lint

    spec = kit.pair_spec(kit.GpuOptions(model=tmp_path), [18100, 18200, 15600, 15700, 18000])
    assert spec.prefill[0].devices == spec.decode[0].devices == [0]
    errors = {f.code for f in lint(spec, check_bound_ports=False).errors}
    assert errors <= {"PD013", "PD019"}  # one GPU twice; PD019: no model files in tmp


def test_the_command_needs_a_kit_and_sane_options(capsys: pytest.CaptureFixture[str]):
    assert main(["selftest"]) == 2
    assert "pdctl selftest --gpu" in capsys.readouterr().err
    assert main(["selftest", "--gpu", "--requests", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_the_command_writes_the_report_and_fails_with_a_failed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    clock = Clock()
    steps = [_step("inventory", clock, 0, StepFailed("no GPU found")), _step("x", clock, 0, {})]
    monkeypatch.setattr(selftest, "gpu_steps", lambda opts: steps)
    out = tmp_path / "report"
    rc = main(["selftest", "--gpu", "--model", str(tmp_path), "--out", str(out), "--json"])
    assert rc == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["steps"][0]["error"] == "no GPU found"
    assert json.loads((out / "selftest.json").read_text())["ok"] is False
    assert (out / "selftest.txt").read_text().startswith("pdctl selftest --gpu")
