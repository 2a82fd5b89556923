"""nvidia-smi topo -m / -p2p and rocm-smi parsing against the recorded real outputs."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pdctl.sdk.preflight.kvpath import PathClass, classify_same_host, p2p_ok
from pdctl.sdk.preflight.topo import parse_topo
from tests.conftest import FIXTURES

TOPO = FIXTURES / "topology"


def _parse(name: str):
    return parse_topo((TOPO / name).read_text(encoding="utf-8"), name)


def _numa(t):
    return [g.numa for g in t.gpus]


def test_8x_h100_sxm_nv18_every_pair_one_pix_nic_each():
    t = _parse("topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt")
    assert [g.index for g in t.gpus] == list(range(8))
    assert len(t.links) == 28
    assert set(t.links.values()) == {"NV18"}
    assert t.nvlink_count(7, 0) == 18
    assert t.nic_labels == [f"NIC{i}" for i in range(8)]
    assert t.nic_name("NIC5") == "mlx5_5"
    assert all(t.gpu_nic[(i, f"NIC{i}")] == "PIX" for i in range(8))
    assert t.gpu_nic[(0, "NIC4")] == "SYS"
    assert _numa(t) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.gpus[4].cpu_affinity == "48-95,144-191"
    assert not t.notes


def test_4x_h100_nv6_direct_mesh_four_numa_nodes():
    t = _parse("topo_m_4xH100_NV6_directNVLink_4nic_4numa.txt")
    assert len(t.gpus) == 4
    assert set(t.links.values()) == {"NV6"}
    assert t.nvlink_count(1, 3) == 6
    assert _numa(t) == [3, 1, 7, 5]
    assert {(g, n) for (g, n), c in t.gpu_nic.items() if c == "PIX"} == {
        (i, f"NIC{i}") for i in range(4)
    }
    assert t.nic_names == {}
    choice = classify_same_host(t, 0, 2)
    assert choice.path is PathClass.NVLINK
    assert choice.nominal_bps == 6 * 25e9


def test_4x_l40s_pcie_node_and_sys_nics_named_in_legend():
    t = _parse("topo_m_4xL40S_pcie_noNVLink_2numa_2nic.txt")
    assert len(t.gpus) == 4
    assert t.link(0, 1) == "NODE"
    assert t.link(1, 2) == "SYS"
    assert t.link(3, 2) == "NODE"
    assert all(t.nvlink_count(a, b) == 0 for a, b in t.links)
    assert t.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert t.gpu_nic[(2, "NIC0")] == "NODE"
    assert t.gpu_nic[(0, "NIC1")] == "SYS"
    assert _numa(t) == [0, 0, 1, 1]
    assert t.p2p == {}
    assert p2p_ok(t, 0, 1) == (None, "P2P status unknown")


def test_2x_l4_tab_separated_sys_with_cuda_peer_access():
    t = _parse("topo_m_2xL4_pcie_crossNUMA_SYS_plus_simpleP2P.txt")
    assert [g.index for g in t.gpus] == [0, 1]
    assert t.link(0, 1) == "SYS"
    assert _numa(t) == [0, 2]
    assert t.p2p["cuda"] == {(0, 1): "OK", (1, 0): "OK"}
    choice = classify_same_host(t, 0, 1)
    # SYS does not mean "no P2P": this pair does P2P (19.87 GB/s measured)
    assert choice.path is PathClass.PCIE_P2P
    assert "through the CPU" in choice.basis


def test_8x_rtx4090_all_sys_two_nics_behind_one_gpu():
    t = _parse("topo_m_8xRTX4090_allSYS_2numa_2nic.txt")
    assert len(t.gpus) == 8
    assert set(t.links.values()) == {"SYS"}
    assert len(t.links) == 28
    assert t.nic_labels == ["NIC0", "NIC1"]
    assert t.gpu_nic[(6, "NIC0")] == "PHB"
    assert t.gpu_nic[(0, "NIC1")] == "SYS"
    assert _numa(t) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert classify_same_host(t, 0, 5).path is PathClass.HOST_STAGED


def test_5x_rtx5060ti_with_p2p_p_matrix():
    t = _parse("topo_m_and_p2p_p_5xRTX5060Ti_NODE_PHB_OK.txt")
    assert len(t.gpus) == 5
    assert t.link(3, 4) == "PHB"
    assert t.link(0, 4) == "NODE"
    assert set(t.p2p) == {"p"}
    assert len(t.p2p["p"]) == 20
    assert set(t.p2p["p"].values()) == {"OK"}
    assert _numa(t) == [0] * 5
    assert classify_same_host(t, 3, 4).path is PathClass.PCIE_P2P


def test_truncated_topo_inside_lsmod_capture():
    t = _parse("lsmod_nvidia_peermem_loaded_H100.txt")
    assert len(t.gpus) == 8  # the header names eight; only three rows survived
    assert t.link(0, 5) == "NV18"
    assert t.link(3, 4) is None
    assert t.nic_labels == [f"NIC{i}" for i in range(6)]
    assert t.gpu_nic[(2, "NIC1")] == "PIX"
    assert _numa(t)[:4] == [0, 0, 0, None]


def test_rocm_smi_showtopo_pcie_only():
    t = _parse("rocm_smi_showtopo_4xAMD_PCIE_only.txt")
    assert t.source == "rocm-smi --showtopo"
    assert len(t.gpus) == 4
    assert set(t.links.values()) == {"PCIE"}
    assert len(t.links) == 6


def test_p2p_read_write_sections_and_letters():
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\t0-7\t0\n"
        "GPU1\tSYS\t X \t8-15\t1\n"
        "$ nvidia-smi topo -p2p r\n"
        " \tGPU0\tGPU1\t\n GPU0\tX\tCNS\t\n GPU1\tCNS\tX\t\n\n"
        "$ nvidia-smi topo -p2p w\n"
        " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n"
    )
    t = parse_topo(text)
    assert t.p2p["r"][(0, 1)] == "CNS"
    assert t.p2p["w"][(1, 0)] == "OK"
    assert p2p_ok(t, 0, 1) == (False, "P2P read CNS, write OK")
    assert classify_same_host(t, 0, 1).path is PathClass.HOST_STAGED


def test_ansi_header_older_driver_nic_names_and_single_gpu():
    text = (
        "\x1b[4m\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\x1b[0m\n"
        "GPU0\t X \tNV12\tPXB\t0-31\t0\n"
        "GPU1\tNV12\t X \tPXB\t0-31\t0\n"
        "mlx5_0\tPXB\tPXB\t X \n"
    )
    t = parse_topo(text)
    assert t.link(0, 1) == "NV12"
    assert t.nic_labels == ["mlx5_0"]
    assert t.gpu_nic[(1, "mlx5_0")] == "PXB"
    one = parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\tN/A\n")
    assert [(g.index, g.numa, g.cpu_affinity) for g in one.gpus] == [(0, None, "0-7")]


def test_bad_cells_are_noted_not_raised():
    t = parse_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tWAT\t0-3\nGPU1\tWAT\t X \t0-3\n")
    assert t.links == {}
    assert t.notes


_TOKENS = st.sampled_from(
    [
        "GPU0",
        "GPU1",
        "GPU12",
        "NIC0",
        "mlx5_0",
        "X",
        "NV18",
        "PIX",
        "SYS",
        "OK",
        "NS",
        "CPU",
        "Affinity",
        "NUMA",
        "N/A",
        "0-7",
        "-1",
        "\t",
        " ",
        "-p2p",
        "r",
        "NIC0:",
        "Legend:",
        "\x1b[4m",
        "Peer access from A (GPU0) -> B (GPU1) : Yes",
        "=====",
        "Link Type",
        "GPU[0]",
    ]
)


def test_a_gpus_own_cell_is_never_a_link():
    """A row whose own column holds a link type (a garbled dump) adds no self-link."""
    t = parse_topo("GPU0 GPU1 CPU\nGPU0 NV18 NV18\nGPU1 NV18 X")
    assert t.links == {(0, 1): "NV18"}
    assert any("own column" in n for n in t.notes)
    assert parse_topo("GPU0 CPU\nGPU0 NV18").links == {}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_TOKENS, max_size=12).map(" ".join), max_size=12).map("\n".join))
@example("GPU0 CPU\nGPU0 NV18")  # once found: a self-link (0, 0)
def test_fuzz_token_soup_never_raises(text):
    t = parse_topo(text)
    for (a, b), _cell in t.links.items():
        assert a < b


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_any_text_never_raises(text):
    parse_topo(text)
    parse_topo("ROCm System Management Interface\n" + text)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2000), st.data())
def test_fuzz_truncated_real_files(cut, data):
    names = sorted(p.name for p in TOPO.glob("topo_m_*"))
    text = (TOPO / data.draw(st.sampled_from(names))).read_text(encoding="utf-8")
    t = parse_topo(text[:cut])
    assert len(t.gpus) <= 8
