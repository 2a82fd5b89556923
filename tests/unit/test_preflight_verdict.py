"""Pairs, stack checks and verdicts: the published worked example and one case per rule."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdctl.sdk.preflight import PathClass, Verdict, run_preflight
from pdctl.sdk.preflight.model import GdrStatus, Inventory, NicInfo, ToolsInfo
from pdctl.sdk.preflight.stack import tls_allows
from pdctl.sdk.preflight.topo import parse_topo
from pdctl.sdk.preflight.verdict import verdict_for
from pdctl.sdk.spec import FleetSpec
from tests.conftest import FIXTURES, spec_dict

QWEN = str(FIXTURES / "models" / "qwen2.5-7b")
DEEPSEEK = str(FIXTURES / "models" / "deepseek-v3")
TOPO = FIXTURES / "topology"

# two PCIe L40S on one host, no NVLink and no P2P (the published setup)
TWO_L40S_NO_P2P = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tSYS\t0-31\t0\t\tN/A
GPU1\tSYS\t X \t32-63\t1\t\tN/A
# nvidia-smi topo -p2p r
 \tGPU0\tGPU1\t
 GPU0\tX\tNS\t
 GPU1\tNS\tX\t
# nvidia-smi topo -p2p w
 \tGPU0\tGPU1\t
 GPU0\tX\tNS\t
 GPU1\tNS\tX\t
"""


def _inv(text: str, name: str | None = None, **kw) -> Inventory:
    """A topo text as an inventory; ``name``: every GPU's product name (as NVML reports)."""
    topo = parse_topo(text)
    topo.gpus = [replace(g, name=name) for g in topo.gpus]
    return Inventory(topology=topo, **kw)


def _l40s() -> Inventory:
    return _inv(TWO_L40S_NO_P2P, "NVIDIA L40S")


def _file_inv(name: str, **kw) -> Inventory:
    return _inv((TOPO / name).read_text(encoding="utf-8"), **kw)


def _codes(report) -> set[str]:
    return {w.code for w in report.warnings}


def _spec(**kw) -> FleetSpec:
    return FleetSpec(**spec_dict(**kw))


def test_worked_example_do_not_disaggregate_with_tcp_fallback():
    report = run_preflight(
        None,
        model=QWEN,
        prompt_len=8192,
        ttft_colocated_s=0.7,
        measured_transfer_s=1.3,
        inventory=_l40s(),
    )
    assert report.kv.bytes_per_prompt == 469_762_048
    (pair,) = report.pairs
    assert pair.path is PathClass.HOST_STAGED
    assert pair.expected_bps == pytest.approx(12.5e9)  # L40S: Gen4 x16 through host memory
    assert pair.transfer_s == pytest.approx(1.3)
    assert pair.ratio == pytest.approx(1.857, rel=1e-3)  # 1.3 s of transfer vs 0.7 s
    assert pair.verdict is Verdict.DO_NOT
    assert report.verdict is Verdict.DO_NOT
    assert report.exit_code == 2
    assert {"TCP_FALLBACK_SIGNATURE", "DO_NOT_DISAGGREGATE", "NO_P2P_HOST_STAGED"} <= _codes(report)
    sig = next(w for w in report.warnings if w.code == "TCP_FALLBACK_SIGNATURE")
    assert "0.36 GB/s" in sig.message
    assert "469.8 MB" in sig.message
    assert report.warnings[0].severity == "error"


def test_unknown_part_gives_unknown_pcie_bandwidth_but_still_flags_the_fallback():
    report = run_preflight(
        None,
        model=QWEN,
        ttft_colocated_s=0.7,
        measured_transfer_s=1.3,
        inventory=_inv(TWO_L40S_NO_P2P),
    )
    (pair,) = report.pairs
    assert pair.path is PathClass.HOST_STAGED
    assert pair.expected_bps is None
    assert "PCIe bandwidth unknown (GPU model unknown)" in pair.assumptions
    sig = next(w for w in report.warnings if w.code == "TCP_FALLBACK_SIGNATURE")
    assert "at least" in sig.message
    unmeasured = run_preflight(
        None, model=QWEN, ttft_colocated_s=0.7, inventory=_inv(TWO_L40S_NO_P2P)
    )
    assert unmeasured.pairs[0].verdict is Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("name", "cell", "expected"),  # 80 % of the part's NVLink GB/s a direction
    [
        ("NVIDIA H100 80GB HBM3", "NV18", 360e9),
        ("NVIDIA H200", "NV18", 360e9),
        ("NVIDIA B200", "NV18", 720e9),
        ("NVIDIA GB200", "NV18", 720e9),
        ("NVIDIA A100-SXM4-80GB", "NV12", 240e9),
        ("NVIDIA RTX A6000", "NV4", 45e9),
        ("NVIDIA GeForce RTX 3090", "NV4", 45e9),
        ("Tesla V100-SXM2-32GB", "NV6", 120e9),
    ],
)
def test_nvlink_generation_follows_the_part(name, cell, expected):
    text = f"\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t{cell}\t0-7\nGPU1\t{cell}\t X \t0-7\n"
    (pair,) = run_preflight(None, inventory=_inv(text, name)).pairs
    assert pair.path is PathClass.NVLINK
    assert pair.expected_bps == pytest.approx(expected)
    assert pair.assumptions == ()


@pytest.mark.parametrize(
    ("name", "expected"),  # half the part's PCIe GB/s a direction (host-staged)
    [
        ("NVIDIA GeForce RTX 5090", 25e9),
        ("NVIDIA GeForce RTX 5060 Ti", 12.5e9),  # Gen5 x8
        ("NVIDIA H100 PCIe", 25e9),
        ("NVIDIA GeForce RTX 4090", 12.5e9),
        ("NVIDIA L4", 12.5e9),
        ("NVIDIA Some Future GPU", None),
    ],
)
def test_pcie_generation_follows_the_part(name, expected):
    (pair,) = run_preflight(None, inventory=_inv(TWO_L40S_NO_P2P, name)).pairs
    assert pair.path is PathClass.HOST_STAGED
    if expected is None:
        assert pair.expected_bps is None
        assert any("not in the table" in a for a in pair.assumptions)
    else:
        assert pair.expected_bps == pytest.approx(expected)


def test_worked_example_without_measurement_is_fine_on_the_expected_path():
    report = run_preflight(None, model=QWEN, ttft_colocated_s=0.7, inventory=_l40s())
    (pair,) = report.pairs
    assert pair.transfer_s == pytest.approx(0.04258, rel=1e-3)  # 448 MiB at 12.5 GB/s + 5 ms
    assert pair.ratio == pytest.approx(0.0608, rel=1e-2)  # 43 ms vs 0.7 s
    assert pair.verdict is Verdict.OK  # the hardware path would pay; the fallback does not


def test_pull_mode_same_host_predicts_fallback_and_uses_the_fallback_band():
    spec = _spec(fleet={"mode": "pull"}, model={"path": QWEN})
    report = run_preflight(spec, ttft_colocated_s=0.7, inventory=_l40s())
    (pair,) = report.pairs
    assert "NIXL_PULL_TCP_FALLBACK" in _codes(report)
    assert pair.expected_bps == pytest.approx(0.4e9)
    assert pair.bandwidth_source.startswith("predicted NIXL fallback")
    assert pair.verdict is Verdict.DO_NOT
    push = run_preflight(_spec(model={"path": QWEN}), ttft_colocated_s=0.7, inventory=_l40s())
    assert "NIXL_PULL_TCP_FALLBACK" not in _codes(push)


def test_deepseek_mla_on_nv18_is_ok_and_reports_mla_note():
    spec = _spec(
        model={"path": DEEPSEEK},
        prefill=[{"host": "127.0.0.1", "devices": [0, 1, 2, 3], "tp": 4}],
        decode=[{"host": "127.0.0.1", "devices": [4, 5, 6, 7], "tp": 4}],
    )
    inv = _file_inv("topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt")
    report = run_preflight(spec, prompt_len=8192, ttft_colocated_s=1.0, rate=2, inventory=inv)
    (pair,) = report.pairs
    assert report.kv.bytes_per_token == 70_272
    assert pair.path is PathClass.NVLINK
    assert pair.kv_bytes == 575_668_224  # 70 272 B a token x 8192: MLA latent is not split over TP
    assert pair.expected_bps == pytest.approx(360e9)  # 80 % of 450 GB/s
    assert pair.verdict is Verdict.OK
    assert {"MLA_CONFIG", "NVLINK"} <= _codes(report)
    assert report.exit_code == 0
    assert report.expected_throughput_bps() == pytest.approx(1.44e12)  # 4 pairs x 360 GB/s


def _rdma_nics(kind: str, n: int = 8, gdr: bool | None = None):
    layer = {"ib": "InfiniBand", "roce": "Ethernet", "efa": "Unknown"}[kind]
    name = "rdmap" if kind == "efa" else "mlx5_"
    return [
        NicInfo(
            name=f"{name}{i}",
            label=f"NIC{i}",
            driver="efa" if kind == "efa" else "mlx5_core",
            state="4: ACTIVE",
            link_layer=layer,
            rate_gbps=400.0,
            gdr=gdr,
        )
        for i in range(n)
    ]


def _h100_rdma(kind: str, nic_gdr: bool | None = None, gdr: bool | None = True) -> Inventory:
    """The 8x H100 NV18 box with one RDMA NIC per GPU (PIX) of the given kind."""
    return _file_inv(
        "topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt",
        nics=_rdma_nics(kind, gdr=nic_gdr),
        gdr=GdrStatus(gdr, "recorded for the test"),
    )


def _two_hosts(**fleet):
    return _spec(
        model={"path": QWEN},
        fleet=fleet,
        prefill=[{"host": "10.0.0.1", "devices": [0]}],
        decode=[{"host": "10.0.0.2", "devices": [0]}],
    )


def test_cross_host_ib_with_gdr_and_pix_nic():
    inv = _h100_rdma("ib")
    report = run_preflight(_two_hosts(), ttft_colocated_s=0.7, inventory=inv)
    (pair,) = report.pairs
    assert pair.path is PathClass.RDMA_IB
    assert pair.expected_bps == pytest.approx(42.5e9)  # 85 % of 50 GB/s
    assert "every host is assumed to match the inventoried one" in report.assumptions


def test_cross_host_without_gdr_is_host_staged_and_warns():
    inv = _h100_rdma("roce", gdr=False)
    report = run_preflight(_two_hosts(), ttft_colocated_s=0.7, inventory=inv)
    assert report.pairs[0].path is PathClass.RDMA_HOST_STAGED
    assert "NO_GPUDIRECT_RDMA" in _codes(report)


def test_nic_not_local_on_l40s_box():
    inv = _file_inv(
        "topo_m_4xL40S_pcie_noNVLink_2numa_2nic.txt",
        nics=[
            NicInfo(
                "mlx5_0", label="NIC0", state="4: ACTIVE", link_layer="InfiniBand", rate_gbps=200.0
            ),
            NicInfo(
                "mlx5_1", label="NIC1", state="4: ACTIVE", link_layer="InfiniBand", rate_gbps=200.0
            ),
        ],
        gdr=GdrStatus(True, "nvidia_peermem"),
    )
    report = run_preflight(_two_hosts(), ttft_colocated_s=0.7, inventory=inv)
    assert report.pairs[0].path is PathClass.RDMA_HOST_STAGED
    nic = next(w for w in report.warnings if w.code == "NIC_NOT_LOCAL")
    assert "via SYS" in nic.message
    assert "UCX_NET_DEVICES" in nic.message


def test_efa_with_ucx_backend_downgrades_and_libfabric_does_not():
    inv = _h100_rdma("efa", nic_gdr=True)
    ucx = run_preflight(_two_hosts(), ttft_colocated_s=0.7, inventory=inv)
    assert ucx.pairs[0].path is PathClass.EFA
    assert "EFA_WITH_UCX" in _codes(ucx)
    assert ucx.pairs[0].expected_bps == pytest.approx(0.4e9)
    lf = run_preflight(_two_hosts(nixl_backends=["LIBFABRIC"]), ttft_colocated_s=0.7, inventory=inv)
    assert "EFA_WITH_UCX" not in _codes(lf)
    assert lf.pairs[0].expected_bps == pytest.approx(42.5e9)  # 85 % of 50 GB/s


def test_efa_gdr_zero_warns():
    inv = _h100_rdma("efa", nic_gdr=False)
    report = run_preflight(_two_hosts(nixl_backends=["LIBFABRIC"]), inventory=inv)
    assert report.pairs[0].path is PathClass.RDMA_HOST_STAGED
    assert "EFA_NO_GDR" in _codes(report)


def test_no_rdma_cross_host_is_tcp():
    inv = _inv(TWO_L40S_NO_P2P, netdev_speeds_mbps={"eth0": 25_000})
    report = run_preflight(_two_hosts(), ttft_colocated_s=0.7, inventory=inv)
    (pair,) = report.pairs
    assert pair.path is PathClass.TCP
    assert pair.expected_bps == pytest.approx(2.031e9, rel=1e-3)  # 65 % of 25 Gbit/s
    assert "CROSS_NODE_TCP" in _codes(report)


def test_ucx_tls_excluding_cuda_ipc_on_nvlink():
    inv = _file_inv("topo_m_4xH100_NV6_directNVLink_4nic_4numa.txt")
    spec = _spec(model={"path": QWEN}, fleet={"ucx": {"tls": "^cuda_ipc"}})
    report = run_preflight(spec, ttft_colocated_s=0.7, inventory=inv)
    assert "UCX_TLS_EXCLUDES" in _codes(report)
    assert report.pairs[0].expected_bps == pytest.approx(0.4e9)


def test_ucx_tls_without_any_remote_transport_blocks():
    inv = _file_inv("topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt", nics=_rdma_nics("ib"))
    report = run_preflight(
        _two_hosts(ucx={"tls": "cuda_ipc,cuda_copy"}), ttft_colocated_s=0.7, inventory=inv
    )
    assert "UCX_TLS_NO_TRANSPORT" in _codes(report)
    assert report.exit_code == 2


@pytest.mark.parametrize(
    ("tls", "transport", "allowed"),
    [
        (None, "tcp", None),
        ("", "tcp", None),
        ("all", "cuda_ipc", True),
        ("rc,cuda_copy", "rc_mlx5", True),
        ("rc,cuda_copy", "cuda_ipc", False),
        ("^cuda_ipc", "cuda_ipc", False),
        ("^cuda_ipc", "tcp", True),
        ("ib", "dc_mlx5", True),
        ("shm,cuda", "cuda_ipc", True),
    ],
)
def test_tls_allows(tls, transport, allowed):
    assert tls_allows(tls, transport) is allowed


def test_gpu_missing_from_inventory_is_blocking():
    spec = _spec(model={"path": QWEN}, decode=[{"host": "127.0.0.1", "devices": [5]}])
    report = run_preflight(spec, inventory=_l40s())
    assert report.pairs[0].path is PathClass.UNKNOWN
    assert "GPU_NOT_FOUND" in _codes(report)
    assert report.exit_code == 2


def test_nixl_backend_missing_and_descriptor_count():
    inv = _inv(TWO_L40S_NO_P2P, tools=ToolsInfo(nixl_installed=True, nixl_backends=("UCX",)))
    spec = _spec(model={"path": QWEN}, fleet={"nixl_backends": ["LIBFABRIC"], "block_size": 16})
    report = run_preflight(spec, inventory=inv)
    assert {"NIXL_BACKEND_MISSING", "DESCRIPTOR_COUNT", "NO_PREFILL_TIME"} <= _codes(report)
    d = next(w for w in report.warnings if w.code == "DESCRIPTOR_COUNT")
    assert "28,672" in d.message
    assert all(p.verdict is Verdict.UNKNOWN for p in report.pairs)


def test_link_saturation_at_high_rate():
    report = run_preflight(None, model=QWEN, ttft_colocated_s=2.0, rate=30, inventory=_l40s())
    (pair,) = report.pairs
    assert pair.link_load is not None
    assert pair.link_load > 0.7
    assert pair.verdict is Verdict.UNLIKELY
    assert "LINK_SATURATION" in _codes(report)


def test_no_spec_lists_every_gpu_pair_and_peer_pairs():
    inv = _file_inv("topo_m_4xH100_NV6_directNVLink_4nic_4numa.txt")
    report = run_preflight(None, model=QWEN, inventory=inv)
    names = [p.name for p in report.pairs]
    assert names[:3] == ["GPU0 -> GPU1", "GPU0 -> GPU2", "GPU0 -> GPU3"]
    assert len(names) == 6 + 4
    nv = [w for w in report.warnings if w.code == "NVLINK"]
    assert len(nv) == 1
    assert len(nv[0].pairs) == 6


def test_measured_vllm_log_and_degraded_path(tmp_path):
    log = tmp_path / "prefill.log"
    log.write_text((TOPO / "vllm_nixl_kv_transfer_metrics_same_host_noNVLinkPath.txt").read_text())
    inv = _file_inv("topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt")
    spec = _spec(model={"path": QWEN})
    report = run_preflight(spec, ttft_colocated_s=0.7, logs=[log], inventory=inv)
    (pair,) = report.pairs
    assert pair.bandwidth_source.startswith("measured")
    assert pair.bandwidth_bps == pytest.approx(1_888_467_550, rel=1e-6)  # 1800.983 MiB/s
    assert "SOFTWARE_PATH_DEGRADED" in _codes(report)


def test_cpu_platform_and_no_gpu():
    cpu = _spec(
        model={"path": QWEN},
        fleet={"platform": "cpu", "block_size": 32},
        prefill=[{"cpu_cores": [0]}],
        decode=[{"cpu_cores": [1]}],
    )
    report = run_preflight(cpu, inventory=Inventory(topology=None))
    assert report.pairs == []
    assert "CPU_PLATFORM" in _codes(report)
    assert "NO_GPU" not in _codes(report)
    bare = run_preflight(None, inventory=Inventory(topology=None))
    assert {"NO_GPU", "NO_MODEL"} <= _codes(bare)
    assert bare.verdict is Verdict.UNKNOWN
    assert bare.exit_code == 1


def test_as_dict_schema_is_json_ready():
    report = run_preflight(
        None,
        model=QWEN,
        ttft_colocated_s=0.7,
        measured_transfer_s=1.3,
        inventory=_l40s(),
    )
    d = json.loads(json.dumps(report.as_dict()))
    assert {"gpus", "nics", "pairs", "warnings", "verdict", "exit_code", "kv"} <= set(d)
    pair = d["pairs"][0]
    for key in ("path", "bandwidth_gbps", "bandwidth_source", "kv_bytes", "transfer_s", "verdict"):
        assert key in pair
    assert pair["verdict"] == "DO NOT DISAGGREGATE"
    assert pair["bandwidth_gbps"] == pytest.approx(0.3614, abs=1e-3)
    assert {"code", "message", "severity", "pairs"} <= set(d["warnings"][0])
    assert d["gpus"][0]["numa"] == 0


@pytest.mark.parametrize(
    ("ratio", "load", "verdict"),
    [
        (None, None, Verdict.UNKNOWN),
        (0.05, None, Verdict.OK),
        (0.1, 0.5, Verdict.OK),
        (0.05, 0.6, Verdict.MARGINAL),
        (0.3, 0.1, Verdict.MARGINAL),
        (0.5, 0.0, Verdict.MARGINAL),
        (0.51, 0.0, Verdict.UNLIKELY),
        (0.05, 0.71, Verdict.UNLIKELY),
        (1.0, 0.0, Verdict.UNLIKELY),
        (1.01, 0.0, Verdict.DO_NOT),
        (1.9, 5.0, Verdict.DO_NOT),
    ],
)
def test_verdict_table(ratio, load, verdict):
    assert verdict_for(ratio, load) is verdict


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10))
def test_verdict_is_monotonic_in_ratio(r1, r2, load):
    from pdctl.sdk.preflight.report import VERDICT_RANK

    lo, hi = sorted((r1, r2))
    assert VERDICT_RANK[verdict_for(lo, load)] <= VERDICT_RANK[verdict_for(hi, load)]


def test_xgmi_pair_of_mi300x():
    # the rocm_smi_showtopo_4xAMD_PCIE_only.txt layout, with the XGMI cells of an MI300X pair
    text = (
        "ROCm System Management Interface\n"
        "========================== Link Type between two GPUs ==========================\n"
        "       GPU0         GPU1\nGPU0   0            XGMI\nGPU1   XGMI         0\n"
    )
    (pair,) = run_preflight(None, inventory=_inv(text, "AMD Instinct MI300X")).pairs
    assert pair.path is PathClass.XGMI
    assert pair.expected_bps == pytest.approx(51.2e9)  # 80 % of 64 GB/s
    (unknown,) = run_preflight(None, inventory=_inv(text)).pairs
    assert (unknown.path, unknown.expected_bps) == (PathClass.XGMI, None)
