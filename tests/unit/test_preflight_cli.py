"""``pdctl preflight`` as a real subprocess: GPU-less machine, offline files, JSON, errors."""

from __future__ import annotations

import json

from tests.conftest import FIXTURES
from tests.unit.test_cli import pdctl

TOPO = FIXTURES / "topology"
QWEN = FIXTURES / "models" / "qwen2.5-7b"


def test_on_this_machine_says_what_it_checked(tmp_path):
    r = pdctl("preflight", "--sysfs-root", str(tmp_path), cwd=tmp_path)
    assert r.returncode in (0, 1, 2), r.stderr
    assert "checked:" in r.stdout
    if "No GPU found" in r.stdout:
        assert r.returncode == 1
        assert "NO_GPU" in r.stdout
        for source in ("NVML", "nvidia-smi", "RDMA NICs", "GPUDirect RDMA"):
            assert source in r.stdout
    assert "Traceback" not in r.stderr


def test_offline_json_schema_and_exit_code(tmp_path):
    r = pdctl(
        "preflight",
        "--from-topo",
        str(TOPO / "topo_m_4xL40S_pcie_noNVLink_2numa_2nic.txt"),
        "--model",
        str(QWEN / "config.json"),
        "--prompt-len",
        "8192,16384",
        "--ttft-colocated",
        "0.7",
        "--measured-transfer",
        "1.3",
        "--mode",
        "pull",
        "--json",
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "DO NOT DISAGGREGATE"
    assert len(d["gpus"]) == 4
    assert d["kv"]["bytes_per_prompt"] == 469_762_048
    assert d["kv"]["bytes_per_prompt_p95"] == 2 * 469_762_048
    codes = {w["code"] for w in d["warnings"]}
    assert {"NIXL_PULL_TCP_FALLBACK", "DO_NOT_DISAGGREGATE", "TCP_FALLBACK_SIGNATURE"} <= codes
    assert d["pairs"][0]["path"] == "HOST_STAGED"
    assert d["exit_code"] == 2


def test_rich_report_puts_warnings_before_the_table(tmp_path):
    r = pdctl(
        "preflight",
        "--evidence",
        str(TOPO / "topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt"),
        "--evidence",
        str(TOPO / "nvidia_smi_q_8xH100-SXM_PCIe_Gen5_driver550.txt"),
        "--model",
        str(QWEN),
        "--ttft-colocated",
        "0.7",
        cwd=tmp_path,
    )
    assert r.returncode in (0, 1), r.stderr
    out = r.stdout
    assert out.index("NVLINK") < out.index("P -> D pairs") < out.index("GPU links")
    assert "NV18" in out
    assert "verdict: OK" in out


def test_bad_inputs_are_one_line_errors(tmp_path):
    missing = pdctl("preflight", "--from-topo", str(tmp_path / "nope.txt"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "--from-topo" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad_model = pdctl("preflight", "--model", str(tmp_path), cwd=tmp_path)
    assert bad_model.returncode == 2
    assert "config.json" in bad_model.stderr
    bad_len = pdctl("preflight", "--prompt-len", "8k", cwd=tmp_path)
    assert bad_len.returncode == 2
    assert "N,P95" in bad_len.stderr
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    no_heads = pdctl("preflight", "--model", str(tmp_path / "config.json"), cwd=tmp_path)
    assert no_heads.returncode == 2
    assert "num_attention_heads" in no_heads.stderr


def test_collect_then_evidence_gives_the_live_report(tmp_path):
    """On this (GPU-less) machine: the bundle analysed anywhere says what the live run says."""
    bundle = tmp_path / "host.tar.gz"
    c = pdctl("preflight", "--collect", str(bundle), "--json", cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    collected = json.loads(c.stdout)
    assert collected["bundle"] == str(bundle)
    names = {s["name"]: s for s in collected["manifest"]["sources"]}
    assert {"nvidia-smi-topo-m.txt", "ucx_info-d.txt", "fi_info-efa.txt", "sysfs.txt"} <= set(names)
    assert all(s["state"] in ("ok", "absent", "error", "timeout") for s in names.values())
    assert names["nvidia-smi-topo-m.txt"]["argv"] == ["nvidia-smi", "topo", "-m"]
    live = pdctl("preflight", "--json", cwd=tmp_path)
    recorded = pdctl("preflight", "--evidence", str(bundle), "--json", cwd=tmp_path)
    assert recorded.returncode == live.returncode, recorded.stderr
    assert json.loads(recorded.stdout) == json.loads(live.stdout)


def test_bad_evidence_is_a_one_line_error(tmp_path):
    r = pdctl("preflight", "--evidence", str(tmp_path / "missing.tar.gz"), cwd=tmp_path)
    assert r.returncode == 2
    assert "--evidence" in r.stderr
    assert "Traceback" not in r.stderr
