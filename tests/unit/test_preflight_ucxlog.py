"""UCX log lines in every form UCX prints them (ucp_worker.c, ucp_ep.c, proto_debug.c)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdctl.sdk.preflight.evidence import parse_evidence
from pdctl.sdk.preflight.ucxlog import parse_ucx_log, ucx_warnings
from tests.conftest import FIXTURES

TOPO = FIXTURES / "topology"


def _log(name: str):
    return parse_ucx_log((TOPO / name).read_text(encoding="utf-8"))


def _codes(log) -> set[str]:
    return {w.code for w in ucx_warnings(log)}


def test_pcie_without_nvlink_rma_emulated_over_tcp():
    log = _log("ucx_log_nixl_L20_pcie_noNVLink_rma_am_tcp.txt")
    assert log.cuda_ipc_no_nvlink
    assert log.env["UCX_TLS"] == "cuda_ipc,cuda_copy,tcp"
    tcp = {(ln.feature, ln.device, ln.locality, ln.where) for ln in log.tcp_rma()}
    assert tcp == {
        ("rma_am", "eth1", "intra-node", "used tls"),
        ("rma", "eth1", "intra-node", "proto"),
    }
    assert {"am", "amo_am", "ka", "rma_am"} <= {ln.feature for ln in log.lanes}
    assert ("cuda_ipc", "am") in {(ln.transport, ln.feature) for ln in log.lanes}
    warnings = {w.code: w for w in ucx_warnings(log)}
    assert set(warnings) == {"UCX_TCP_LANES", "UCX_CUDA_IPC_NO_NVLINK"}
    msg = warnings["UCX_TCP_LANES"].message
    assert "rma_am(tcp/eth1)" in msg
    assert "UCX_TLS=cuda_ipc,cuda_copy,tcp" in msg
    assert "cuda_ipc" in msg.split("Do:")[1]
    assert "push mode" in warnings["UCX_CUDA_IPC_NO_NVLINK"].message


def test_pre_1_13_ep_cfg_format():
    log = _log("ucx_log_pre1.13_ep_cfg_format.txt")
    assert [ln.text for ln in log.tcp_rma()] == ["rma(tcp/p2p2)"]
    assert {ln.text for ln in log.lanes if ln.feature == "tag"} >= {
        "tag(rc_mlx5/mlx5_0:1)",
        "tag(knem/knem)",
    }
    msg = next(w.message for w in ucx_warnings(log) if w.code == "UCX_TCP_LANES")
    assert "UCX_NET_DEVICES" in msg


def test_wireup_lane_lines_new_and_old():
    log = _log("ucx_debug_wireup_lanes_dc_mlx5_rma_bw.txt")
    rma = {(ln.transport, ln.device) for ln in log.lanes if ln.feature == "rma_bw"}
    assert rma == {
        ("dc_mlx5", "mlx5_2:1"),
        ("dc_mlx5", "mlx5_1:1"),
        ("knem", "memory"),
        ("rc_mlx5", "mlx5_0:1"),
    }
    assert not log.tcp_rma()
    assert _codes(log) == set()
    tcp = parse_ucx_log(
        "ep 0x1: lane[1]:  3:tcp/ens5.0 md[1]          -> addr[1].md[1]/tcp/sysdev[255] "
        "seg 0 rma_bw#0 am am_bw#0 keepalive"
    )
    assert [(ln.feature, ln.device) for ln in tcp.lanes] == [
        ("rma_bw", "ens5"),
        ("am", "ens5"),
        ("am_bw", "ens5"),
        ("ka", "ens5"),
    ]
    assert "UCX_TCP_LANES" in _codes(tcp)


def test_proto_info_split_lanes_and_paths():
    log = _log("ucx_proto_info_GB200_rc_dc_split_host_to_cuda.txt")
    rma = {(ln.transport, ln.device) for ln in log.lanes if ln.feature == "rma"}
    assert rma == {("rc_mlx5", "mlx5_2:1"), ("dc_mlx5", "mlx5_3:1")}
    am = {(ln.transport, ln.device) for ln in log.lanes if ln.feature == "am"}
    assert am == {("rc_mlx5", "mlx5_0:1")}
    assert _codes(log) == set()


def test_cannot_register_gpu_memory_names_the_md():
    log = _log("ucx_trace_nixl_rc_mlx5_cannot_register_cuda_memory.txt")
    assert log.no_registration == {"mlx5_3"}
    assert _codes(log) == {"UCX_NO_GPU_REGISTRATION"}
    managed = parse_ucx_log("x UCX TRACE rc_mlx5/mlx5_0:1: md mlx5_0 cannot register rocm memory")
    assert managed.no_registration == {"mlx5_0"}


def test_active_messages_only_on_tcp_is_an_info():
    log = parse_ucx_log(
        "[1] UCX INFO ucp_context_0 inter-node cfg#3 rma(rc_mlx5/mlx5_0:1) "
        "am(tcp/eth0) ka(tcp/eth0)"
    )
    assert not log.tcp_rma()
    (w,) = ucx_warnings(log)
    assert (w.code, w.severity) == ("UCX_TCP_AM_LANES", "info")


def test_evidence_merges_ucx_from_several_logs():
    ev = parse_evidence((TOPO / "ucx_log_nixl_L20_pcie_noNVLink_rma_am_tcp.txt").read_text())
    ev.merge(parse_evidence((TOPO / "ucx_log_pre1.13_ep_cfg_format.txt").read_text()))
    assert {ln.device for ln in ev.ucx.tcp_rma()} == {"eth1", "p2p2"}
    assert ev.ucx.cuda_ipc_no_nvlink


_FEATURE = st.sampled_from(
    ["tag", "rma", "rma_am", "amo", "amo_am", "device", "am", "stream", "ka"]
)
_TL = st.sampled_from(["tcp", "rc_mlx5", "dc_mlx5", "ud_verbs", "cuda_ipc", "posix", "sysv"])
_DEV = st.from_regex(r"[a-z][a-z0-9_]{0,6}(:[0-9])?", fullmatch=True)


@given(
    groups=st.lists(
        st.tuples(_FEATURE, st.lists(st.tuples(_TL, _DEV), min_size=1, max_size=4)),
        min_size=1,
        max_size=7,
    ),
    locality=st.sampled_from(["self", "intra-node", "inter-node"]),
    old=st.booleans(),
)
def test_every_used_tls_line_ucx_can_print_is_read(groups, locality, old):
    """Lines built the way ucp_worker_print_used_tls builds them (and its ≤ 1.12 form)."""
    body = (" " if not old else "; ").join(
        f"{f}({' '.join(f'{t}/{d}' for t, d in rscs)})" for f, rscs in groups
    )
    head = f"ep_cfg[2]: {body};" if old else f"ucp_context_0 {locality} cfg#2 {body}"
    log = parse_ucx_log(f"[1.0] [h:1:0]  ucp_worker.c:1912 UCX  INFO  {head}")
    expected = [(f, t, d) for f, rscs in groups for t, d in rscs]
    assert [(ln.feature, ln.transport, ln.device) for ln in log.lanes] == expected
    assert all(ln.locality == (None if old else locality) for ln in log.lanes)
    tcp_rma = any(f in ("rma", "rma_am") and t == "tcp" for f, t, _ in expected)
    assert ("UCX_TCP_LANES" in _codes(log)) == tcp_rma


@pytest.mark.parametrize(
    "line",
    [
        "cuda_ipc_iface.c:253  UCX  DEBUG cuda-ipc get zcopy disabled as no nvlinks detected",
        "UCX DEBUG cuda_ipc: get zcopy disabled as no nvlink detected",
    ],
)
def test_no_nvlink_line_variants(line):
    assert parse_ucx_log(line).cuda_ipc_no_nvlink
