"""Recorded evidence (bundles, loose tool outputs, logs) → inventories → reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pdctl.sdk.preflight import run_preflight
from pdctl.sdk.preflight.inventory import inventory_from_sources
from pdctl.sdk.preflight.kvpath import PathClass
from pdctl.sdk.preflight.sources import (
    FI_INFO,
    IBV,
    SMI_Q,
    TOPO,
    UCX_INFO,
    EvidenceError,
    Sources,
    collect_sources,
    read_evidence,
    sniff,
    write_bundle,
)
from pdctl.sdk.preflight.tools import (
    efa_devices,
    nics_from_ibv,
    parse_fi_info,
    parse_ibv_devinfo,
    parse_nvidia_smi_q,
)
from pdctl.sdk.spec import FleetSpec
from tests.conftest import FIXTURES, spec_dict

DATA = FIXTURES / "topology"
QWEN = FIXTURES / "models" / "qwen2.5-7b"
H100_TOPO = DATA / "topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt"
H100_Q = DATA / "nvidia_smi_q_8xH100-SXM_PCIe_Gen5_driver550.txt"
IBV_FILE = DATA / "ibv_devinfo_v_ConnectX7_NDR_and_EFA.txt"
FI_P5 = DATA / "fi_info_efa_p5_rdmap_rdm_dgrm.txt"
UCX_L20 = DATA / "ucx_log_nixl_L20_pcie_noNVLink_rma_am_tcp.txt"


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8")


def test_nvidia_smi_q_names_bus_ids_and_pcie():
    q = parse_nvidia_smi_q(_text(H100_Q))
    assert (q.driver, q.cuda) == ("550.54.15", "12.4")
    gpus = q.gpu_infos()
    assert len(gpus) == 8
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert (gpus[1].bus_id, gpus[1].pcie_gen, gpus[1].pcie_width) == ("0000:2a:00.0", 5, 16)
    host_limited = _text(H100_Q).replace(
        "Host Max                  : 5", "Host Max                  : 4"
    )
    assert parse_nvidia_smi_q(host_limited).gpus[0].pcie_gen == 4


def test_ibv_devinfo_verbose_gives_nics_with_rates():
    nics = {n.name: n for n in nics_from_ibv(parse_ibv_devinfo(_text(IBV_FILE)))}
    assert (nics["mlx5_0"].kind, nics["mlx5_0"].rate_gbps, nics["mlx5_0"].active) == (
        "ib",
        400.0,
        True,
    )
    assert nics["mlx5_1"].active is False
    assert (nics["rdmap16s27"].kind, nics["rdmap16s27"].rate_gbps) == ("efa", 100.0)


@pytest.mark.parametrize(
    ("name", "devices"),
    [
        (
            "fi_info_efa_p5_rdmap_rdm_dgrm.txt",
            ["rdmap115s0", "rdmap116s0", "rdmap130s0", "rdmap131s0"],
        ),
        ("fi_info_efa_p3dn_p4d_awsdocs.txt", ["efa_0", "efa_1", "efa_2", "efa_3"]),
    ],
)
def test_efa_devices_from_both_domain_namings(name, devices):
    assert efa_devices(parse_fi_info(_text(DATA / name))) == devices


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (H100_TOPO, TOPO),
        (H100_Q, SMI_Q),
        (IBV_FILE, IBV),
        (FI_P5, FI_INFO),
        (DATA / "ucx_info_d_excerpt_rc_mlx5.txt", UCX_INFO),
        (UCX_L20, None),
        (DATA / "vllm_nixl_kv_transfer_metrics_same_host_noNVLinkPath.txt", None),
    ],
)
def test_recorded_files_are_recognised_by_content(path, kind):
    assert sniff(_text(path)) == kind


def test_loose_files_make_one_host_with_names_and_nics():
    (host,) = read_evidence([H100_TOPO, H100_Q, IBV_FILE, UCX_L20])
    inv = inventory_from_sources(host)
    assert inv.topology is not None
    assert inv.topology.gpus[3].name == "NVIDIA H100 80GB HBM3"
    assert inv.topology.gpus[3].pcie_gen == 5
    assert {n.name for n in inv.nics} == {"mlx5_0", "mlx5_1", "rdmap16s27"}
    assert "ucx_log_nixl_L20_pcie_noNVLink_rma_am_tcp.txt" in host.logs
    report = run_preflight(
        None, model=str(QWEN), ttft_colocated_s=0.7, evidence_files=[H100_TOPO, H100_Q, UCX_L20]
    )
    codes = {w.code for w in report.warnings}
    assert {"UCX_TCP_LANES", "UCX_CUDA_IPC_NO_NVLINK", "NVLINK"} <= codes
    nv = next(p for p in report.pairs if p.name == "GPU0 -> GPU1")
    assert nv.path is PathClass.NVLINK
    assert nv.assumptions == ()  # H100 from nvidia-smi -q: NVLink 4, no assumed rate


def _bundle(tmp_path: Path, host: str, addr: str, files: dict[str, Path]) -> Path:
    d = tmp_path / host
    d.mkdir()
    for name, src in files.items():
        shutil.copy(src, d / name)
    sources = [{"name": n, "state": "ok", "argv": [], "detail": "", "rc": 0} for n in files]
    manifest = {"schema": 1, "host": host, "addresses": [addr], "sources": sources}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_two_bundles_plan_a_cross_host_pair_from_each_side(tmp_path):
    """P on an EFA host, D on an InfiniBand host: each end is read from its own bundle."""
    efa = _bundle(tmp_path, "p5-a", "10.0.0.1", {TOPO: H100_TOPO, SMI_Q: H100_Q, FI_INFO: FI_P5})
    ib = _bundle(tmp_path, "ib-b", "10.0.0.2", {TOPO: H100_TOPO, SMI_Q: H100_Q, IBV: IBV_FILE})
    hosts = read_evidence([efa, ib])
    assert [h.host for h in hosts] == ["p5-a", "ib-b"]
    invs = [inventory_from_sources(h) for h in hosts]
    assert {n.kind for n in invs[0].nics} == {"efa"}
    assert {n.kind for n in invs[1].nics} == {"ib", "efa"}
    spec = FleetSpec(
        **spec_dict(
            model={"path": str(QWEN)},
            prefill=[{"host": "10.0.0.1", "devices": [0]}],
            decode=[{"host": "ib-b", "devices": [0]}],
        )
    )
    report = run_preflight(spec, ttft_colocated_s=0.7, evidence_files=[efa, ib])
    (pair,) = report.pairs
    assert not pair.same_host
    assert pair.path is not PathClass.UNKNOWN
    assert "EFA_WITH_UCX" in {w.code for w in report.warnings}
    assert not any("assumed to match" in a for a in report.assumptions)
    lone = run_preflight(
        spec,
        ttft_colocated_s=0.7,
        evidence_files=[efa, DATA / "lsmod_nvidia_peermem_loaded_H100.txt"],
    )
    assert any("no evidence for ib-b" in a for a in lone.assumptions)


def test_bundle_round_trip_keeps_every_text(tmp_path):
    src = Sources(host="h1", addresses=("10.1.1.1",))
    src.texts[TOPO] = _text(H100_TOPO)
    src.logs["prefill.log"] = _text(UCX_L20)
    out = write_bundle(src, tmp_path / "b.tar.gz")
    (back,) = read_evidence([out])
    assert (back.host, back.addresses) == ("h1", ("10.1.1.1",))
    assert back.texts[TOPO] == src.texts[TOPO]
    assert back.logs == src.logs


def test_collect_on_this_machine_records_every_source(tmp_path):
    src = collect_sources(sysfs_root=tmp_path)
    assert set(src.records) >= {TOPO, SMI_Q, IBV, FI_INFO, UCX_INFO, "sysfs.txt", "nvml.json"}
    for rec in src.records.values():
        assert rec["state"] in ("ok", "absent", "error", "timeout", "skipped")
        if rec["state"] == "ok":
            assert rec["name"] in src.texts
        if rec["name"] == "nixl.json" and rec["state"] == "absent":
            assert json.loads(src.texts["nixl.json"])["installed"] is False  # says so
        elif rec["state"] in ("absent", "skipped", "timeout"):
            assert rec["name"] not in src.texts


def test_unreadable_evidence_names_the_path(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(EvidenceError, match=r"--evidence .*missing"):
        read_evidence([tmp_path / "missing"])
    with pytest.raises(EvidenceError, match="not a readable bundle"):
        read_evidence([bad])
