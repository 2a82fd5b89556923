"""sysfs trees, tool outputs, logs and NVML: every recorded source parsed into the right model."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdctl.sdk.preflight.evidence import MIB, parse_evidence
from pdctl.sdk.preflight.inventory import collect_inventory
from pdctl.sdk.preflight.nvml import merge_topologies, normalise_bus_id, nvml_topology
from pdctl.sdk.preflight.sysfs import (
    gdr_status,
    netdev_speeds,
    parse_rate_gbps,
    parse_sysfs,
    read_rdma_nics,
)
from pdctl.sdk.preflight.tools import (
    backends_from_plugins,
    gdr_from_lsmod,
    parse_fi_info,
    parse_ibv_devinfo,
    parse_lsmod,
    parse_ucx_transports,
)
from pdctl.sdk.preflight.topo import parse_topo
from tests.conftest import FIXTURES

TOPO = FIXTURES / "topology"


def _read(name: str) -> str:
    return (TOPO / name).read_text(encoding="utf-8")


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _ib_device(root: Path, dev: str, bdf: str, driver: str, vendor: str, **port: str) -> None:
    pci = root / "devices" / "pci0000:00" / bdf
    (pci / "net" / f"eth_{dev}").mkdir(parents=True)
    drv = root / "bus" / "pci" / "drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    os.symlink(drv, pci / "driver")
    _write(pci, "vendor", vendor + "\n")
    _write(pci, "numa_node", port.pop("numa", "1") + "\n")
    d = root / "class" / "infiniband" / dev
    d.mkdir(parents=True)
    os.symlink(pci, d / "device")
    for key, value in port.items():
        _write(d, f"ports/1/{key}", value + "\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    _ib_device(
        root,
        "mlx5_0",
        "0000:1a:00.0",
        "mlx5_core",
        "0x15b3",
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        link_layer="InfiniBand",
        rate="400 Gb/sec (4X NDR)",
    )
    _ib_device(
        root,
        "rdmap16s27",
        "0000:10:1b.0",
        "efa",
        "0x1d0f",
        numa="-1",
        state="4: ACTIVE",
        link_layer="Unknown",
        rate="100 Gb/sec (4X EDR)",
    )
    # amzn-drivers efa_sysfs.c: gdr is a file of the PCI device (&pdev->dev), which
    # class/infiniband/<dev>/device links to.
    _write(root, "devices/pci0000:00/0000:10:1b.0/gdr", "1\n")
    _write(root, "module/nvidia/version", "570.133.20\n")
    _write(root, "module/nvidia_peermem/version", "570.133.20\n")
    _write(root, "class/net/eth0/speed", "25000\n")
    _write(root, "class/net/docker0/speed", "-1\n")
    _write(root, "class/net/lo/speed", "10\n")
    return root


def test_sysfs_rdma_nics(sysfs: Path):
    nics = {n.name: n for n in read_rdma_nics(sysfs)}
    ib, efa = nics["mlx5_0"], nics["rdmap16s27"]
    assert (ib.driver, ib.vendor, ib.kind, ib.active) == ("mlx5_core", "0x15b3", "ib", True)
    assert (ib.rate_gbps, ib.numa, ib.bus_id, ib.gdr) == (400.0, 1, "0000:1a:00.0", None)
    assert ib.phys_state == "5: LinkUp"
    assert ib.netdevs == ("eth_mlx5_0",)
    assert (efa.driver, efa.kind, efa.gdr, efa.numa, efa.rate_gbps) == (
        "efa",
        "efa",
        True,
        None,
        100.0,
    )
    assert gdr_status(sysfs).present is True
    assert netdev_speeds(sysfs) == {"eth0": 25_000}


def test_efa_gdr_is_read_from_the_pci_device_not_the_ib_device(tmp_path: Path):
    root = tmp_path / "sys"
    _ib_device(root, "rdmap0s6", "0000:00:06.0", "efa", "0x1d0f", state="4: ACTIVE")
    # A gdr file beside the ib device is not where the driver puts it: not read.
    _write(root, "class/infiniband/rdmap0s6/gdr", "1\n")
    assert read_rdma_nics(root)[0].gdr is None
    _write(root, "devices/pci0000:00/0000:00:06.0/gdr", "0\n")
    assert read_rdma_nics(root)[0].gdr is False


def test_efa_gdr_dump_fixture_in_the_drivers_layout():
    nics = read_rdma_nics(parse_sysfs(_read("sysfs_dump_efa_gdr_on_pci_device.txt")))
    assert [(n.name, n.kind, n.gdr, n.bus_id) for n in nics] == [
        ("rdmap16s27", "efa", True, "0000:10:1b.0"),
        ("rdmap32s27", "efa", True, "0000:20:1b.0"),
    ]


def test_sysfs_gdr_absent_and_unknown(tmp_path: Path):
    assert gdr_status(tmp_path).present is None
    _write(tmp_path, "module/nvidia/version", "1\n")
    status = gdr_status(tmp_path)
    assert status.present is False
    assert "DMA-BUF" in status.evidence


def test_offline_inventory_from_files(sysfs: Path):
    topo_file = TOPO / "topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt"
    inv = collect_inventory(from_topo=topo_file, sysfs_root=sysfs)
    assert len(inv.gpus) == 8
    nic0 = inv.nic("NIC0")
    assert nic0 is not None
    assert nic0.name == "mlx5_0"
    assert [c.name for c in inv.checks][:2] == ["topo file", "RDMA NICs"]
    offline = collect_inventory(from_topo=topo_file)
    assert offline.nics == []
    assert {c.state for c in offline.checks if c.name in ("sysfs", "tools")} == {"skipped"}


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("", None),
        ("fast", None),
        (None, None),
    ],
)
def test_rate(text, gbps):
    assert parse_rate_gbps(text) == gbps


def test_lsmod_peermem_and_gdrcopy():
    mods = parse_lsmod(_read("lsmod_nvidia_peermem_loaded_H100.txt"))
    assert "nvidia_peermem" in mods
    assert "gdrdrv" in mods["nvidia"]
    status = gdr_from_lsmod(mods)
    assert (status.present, status.gdrcopy) == (True, True)
    assert gdr_from_lsmod(parse_lsmod("nvidia 1 0\n")).present is False
    assert gdr_from_lsmod({}).present is None


def test_fi_info_efa_domains():
    entries = parse_fi_info(_read("fi_info_efa_p3dn_p4d_awsdocs.txt"))
    assert [e.domain for e in entries] == [
        "efa_0-rdm",
        "efa_0-rdm",
        "efa_1-rdm",
        "efa_2-rdm",
        "efa_3-rdm",
    ]
    assert {e.provider for e in entries} == {"efa"}
    assert entries[1].version == "111.0"
    assert entries[1].type == "FI_EP_RDM"


def test_ucx_info_transports():
    cuda = parse_ucx_transports(_read("ucx_info_d_excerpt_cuda_copy_cuda_ipc.txt"))
    assert cuda == [("cuda_copy", "cuda"), ("cuda_ipc", "cuda")]
    rc = parse_ucx_transports(_read("ucx_info_d_excerpt_rc_mlx5.txt"))
    assert rc == [("rc_mlx5", "mlx5_0:1")]


def test_ibv_devinfo_roce_and_truncated_ib():
    devs = parse_ibv_devinfo(_read("ibv_devinfo_azure_RoCE_and_IB_mlx5.txt"))
    assert [d.hca_id for d in devs] == ["rdmaP23800p0s2", "ibP57247p0s2"]
    assert devs[0].vendor_id == "0x02c9"
    assert devs[0].fields["vendor_part_id"] == "4118"
    assert [(p.port, p.state, p.link_layer) for p in devs[0].ports] == [
        (1, "PORT_ACTIVE (4)", "Ethernet")
    ]
    assert devs[1].ports == []


def test_vllm_kv_transfer_metrics_line():
    ev = parse_evidence(_read("vllm_nixl_kv_transfer_metrics_same_host_noNVLinkPath.txt"))
    (m,) = ev.measurements
    assert m.bytes_per_s == pytest.approx(1800.983 * MIB)
    assert m.transfer_s == pytest.approx(0.173794)
    assert m.bytes_per_transfer == pytest.approx(313.0 * MIB)
    assert m.descriptors == 40064.0


def test_nixlbench_table_best_row():
    ev = parse_evidence(_read("nixlbench_GCP_A3Mega_TCPXO_VRAM_read_excerpt.txt"))
    (m,) = ev.measurements
    assert m.source == "nixlbench"
    assert m.bytes_per_s == pytest.approx(0.105219e9)
    assert "16384 B" in m.detail


def test_simple_p2p_bandwidth():
    ev = parse_evidence(_read("topo_m_2xL4_pcie_crossNUMA_SYS_plus_simpleP2P.txt"))
    assert [m.bytes_per_s for m in ev.measurements] == [pytest.approx(19.87e9)]


def test_nccl_channels_gdr_and_p2p():
    ev = parse_evidence(_read("nccl_debug_H20_NET-IB-GDRDMA_and_P2P-CUMEM.txt"))
    assert ev.nccl_transports == {"NET/IB/GDRDMA", "P2P/CUMEM"}
    assert ev.gdr_in_use is True
    assert (
        parse_evidence("x NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0").gdr_in_use
        is False
    )


def test_nccl_topology_paths_with_bandwidth():
    ev = parse_evidence(_read("nccl_debug_topo_paths_with_bw_NVL_PHB_PXB_SYS.txt"))
    paths = ev.nccl_paths["GPU/4B000"]
    kinds = {p.target: (p.hops, p.gbytes_per_s, p.kind) for p in paths}
    assert kinds["GPU/51000"] == (2, 160.0, "NVL")
    assert kinds["NET/0"] == (4, 12.5, "PXB")
    assert kinds["NET/7"] == (7, 10.0, "SYS")
    assert len(paths) == 13
    assert ev.nccl_transports == {"P2P/direct pointer/read"}


def test_ucx_trace_cannot_register_cuda():
    ev = parse_evidence(_read("ucx_trace_nixl_rc_mlx5_cannot_register_cuda_memory.txt"))
    assert ev.ucx.no_registration == {"mlx5_3"}
    assert ev.ucx.lanes[0].text == "rma(rc_mlx5/mlx5_3:1)"
    assert not ev.ucx.tcp_rma()
    tcp = parse_evidence("[1] UCX INFO ucp_context_0 self cfg#1 rma(tcp/eth0) am(tcp/eth0)")
    assert [ln.text for ln in tcp.ucx.tcp_rma()] == ["rma(tcp/eth0)"]


def test_nixl_plugin_names():
    names = ["libplugin_UCX.so", "libplugin_LIBFABRIC.so", "libplugin_UCX.so", "README", "x.so"]
    assert backends_from_plugins(names) == ("LIBFABRIC", "UCX")


class _FakeNvml:
    """Two H100s joined by 18 NVLinks to an NVSwitch, plus one PCIe-only GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.buses = ["00000000:1B:00.0", "00000000:43:00.0", "00000000:C1:00.0"]

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self.buses[h].encode())

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3" if h < 2 else "NVIDIA L4"

    def nvmlDeviceGetNumaNodeId(self, h):
        return 0 if h < 2 else 1

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5 if h < 2 else 4

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h == 2:
            raise self.NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 2

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        raise self.NVMLError("switch")

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return 0 if max(a, b) < 2 else 5

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 50


def test_nvml_with_a_stand_in_module():
    topo, check = nvml_topology(_FakeNvml())
    assert check.state == "ok"
    assert topo is not None
    assert topo.nvswitch is True
    assert next(g.bus_id for g in topo.gpus) == "0000:1b:00.0"
    assert topo.gpus[2].name == "NVIDIA L4"
    assert topo.gpus[2].pcie_gen == 4
    assert topo.link(0, 1) == "NV18"
    assert topo.link(0, 2) == "NV18"  # the switch side is known only from GPU 0's links
    assert topo.p2p["r"][(2, 0)] == "NS"
    assert topo.p2p["w"][(0, 1)] == "OK"
    smi = parse_topo(
        "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\n"
        "GPU0\t X \tNV18\tSYS\tPIX\t0-7\nGPU1\tNV18\t X \tSYS\tPXB\t0-7\n"
        "GPU2\tSYS\tSYS\t X \tSYS\t8-15\n"
    )
    merged = merge_topologies(smi, topo)
    assert merged is not None
    assert merged.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert merged.gpu_nic[(0, "NIC0")] == "PIX"
    assert merged.p2p["r"][(0, 1)] == "OK"


def test_nvml_absent_or_failing():
    topo, check = nvml_topology(_FakeNvml(fail_init=True))
    assert topo is None
    assert check.state == "absent"
    assert "Not Found" in check.detail
    assert normalise_bus_id("00000000:1B:00.0") == "0000:1b:00.0"


_JUNK = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.dictionaries(
        st.sampled_from(
            [
                "ports/1/state",
                "ports/1/rate",
                "ports/1/link_layer",
                "device/gdr",
                "device/numa_node",
                "device/vendor",
                "ports/2/state",
            ]
        ),
        _JUNK,
        max_size=7,
    )
)
def test_fuzz_sysfs_contents_never_raise(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("sys")
    (root / "class" / "infiniband" / "dev0").mkdir(parents=True)
    for rel, text in files.items():
        _write(root / "class" / "infiniband" / "dev0", rel, text)
    _write(root, "class/net/eth0/speed", files.get("device/gdr", "x"))
    (nic,) = read_rdma_nics(root)
    assert nic.name == "dev0"
    netdev_speeds(root)
    gdr_status(root)


@settings(max_examples=120, deadline=None)
@given(_JUNK.map(lambda s: s + "\n").flatmap(lambda s: st.lists(st.just(s), max_size=5)))
def test_fuzz_tool_and_log_parsers_never_raise(lines):
    text = "".join(lines)
    for prefix in (
        "",
        "provider: efa\n",
        "hca_id: x\n\tport:\t1\n",
        "#      Transport: tcp\n",
        "KV Transfer metrics: Throughput (MB/s)=",
        "NCCL INFO GPU/1 : ",
    ):
        parse_fi_info(prefix + text)
        parse_ibv_devinfo(prefix + text)
        parse_ucx_transports(prefix + text)
        parse_lsmod(prefix + text)
        parse_evidence(prefix + text)
