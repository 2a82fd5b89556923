"""pdctl probe: option pass-through, the preflight comparison, clear errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pytest

from pdctl.cli import proberun
from pdctl.connector.probe.options import add_arguments, to_argv


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_only_changed_options_are_passed_on():
    assert to_argv(_args()) == []
    args = _args("--bytes-per-token", "4096", "--no-merge", "--ucx-tls", "shm,tcp", "--tp", "2")
    assert to_argv(args) == [
        "--bytes-per-token", "4096", "--tp", "2", "--no-merge", "--ucx-tls", "shm,tcp",
    ]  # fmt: skip
    assert _args(*to_argv(args)) == args


def _result(gbps: float | None) -> dict[str, Any]:
    return {
        "gbps_per_request_p50": gbps,
        "transfer_ms": {"p50": 10.0},
        "ucx": {"transports": ["tcp/lo"]},
        "errors": ["r1: target got 0 of 1"],
    }


@pytest.mark.parametrize(
    ("gbps", "expected", "degraded"),
    [(2.0, 5e9, False), (1.4, 5e9, True), (2.0, None, False), (None, 5e9, True)],
)
def test_measured_vs_expected_flags_a_degraded_path(gbps, expected, degraded):
    line, bad = proberun.measured_vs_expected(_result(gbps), expected)
    assert bad is degraded
    assert ("software path degraded" in line) is (degraded and gbps is not None)


def test_missing_nixl_says_how_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(proberun.ProbeFailed, match=r"pdctl\[cpu\]"):
        proberun.run_probe(["true"])


def test_preflight_probe_needs_a_model():
    with pytest.raises(proberun.ProbeFailed, match="--model"):
        proberun.probe_for_preflight(None, 1024, 1, None)


def test_bad_geometry_is_an_error_naming_the_option():
    pytest.importorskip("nixl")  # without it, the probe stops at "install NIXL" first
    out = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "probe", "--json", "--bytes-per-token", "1000",
         "--regions", "3"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--regions" in json.loads(out.stdout)["error"]
