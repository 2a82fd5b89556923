"""UCX log lines → which transports UCX really chose, per feature (pure, total).

The formats come from UCX's own printing code:

* ``ucp_worker_print_used_tls`` (``ucp_worker.c``, INFO): ``[<ctx> ]<self|intra-node|
  inter-node> cfg#N`` then ``feature(tl/dev tl/dev …)`` groups, feature one of ``tag``,
  ``rma``, ``rma_am`` (RMA emulated over active messages), ``amo``, ``amo_am``, ``device``,
  ``am``, ``stream``, ``ka``. UCX ≤ 1.12 printed ``ep_cfg[N]: tag(…); rma(…); am(…)``.
* ``ucp_ep_config_lane_info_str`` (``ucp_ep.c``, DEBUG, wireup): ``lane[N]: R:tl/dev[.path]
  md[M] -> … rma_bw#0 amo#0 am am_bw#0 keepalive wireup``.
* ``UCX_PROTO_INFO=y`` tables (``proto_debug.c``): a ``| <ctx> <locality> cfg#N | <operation>
  |`` header, then ``| range | protocol | lanes |`` rows whose lanes read ``tcp/eth0``,
  ``rc_mlx5/mlx5_0:1/path0`` or ``72% on rc_mlx5/mlx5_2:1 and 28% on dc_mlx5/mlx5_3:1``.
* ``cuda_ipc_iface.c`` (DEBUG): ``cuda-ipc get zcopy disabled as no nvlinks detected``.
* ``proto_common.c`` (TRACE): ``md <name> cannot register cuda memory``.
* ``parser.c`` (INFO): ``UCX_* env variables: UCX_TLS=… UCX_NET_DEVICES=…``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pdctl.sdk.preflight.report import PreflightWarning

RMA_FEATURES = frozenset({"rma", "rma_am", "rma_bw"})
"""Lanes that carry remote memory access: NIXL's KV reads and writes."""
AM_FEATURES = frozenset({"am", "am_bw", "amo", "amo_am", "tag", "stream"})
"""Lanes that carry active messages (control, notifications, emulated operations)."""

_FEATURES = r"tag|rma_am|rma|amo_am|amo|device|am|stream|ka"
_CFG = re.compile(r"(?:(self|intra-node|inter-node)\s+)?cfg#(\d+)|ep_cfg\[(\d+)\]:?")
_GROUP = re.compile(rf"(?<![\w|])({_FEATURES})\(([^()]*)\)")
_RSC = re.compile(r"([A-Za-z][A-Za-z0-9_]*)/([^\s/()|]+)")
_WIREUP_LANE = re.compile(
    r"lane\[(\d+)\]:\s*\d+:([A-Za-z][A-Za-z0-9_]*)/(\S+?)\s+md\[\d+\]\s*.*?->(.*)$"
)
_WIREUP_PURPOSE = re.compile(r"(?<!\S)(rma_bw|rma|amo|am_bw)#\d+|(?<!\S)(am|keepalive)(?!\S)")
_PROTO_HEADER = re.compile(
    r"\|\s*(?:\S+\s+)?(self|intra-node|inter-node)\s+cfg#(\d+)\s*\|\s*(.*?)\s*\|\s*$"
)
_PROTO_ROW = re.compile(r"\|\s*(\d+\S*\.\.\S+)\s*\|\s*(.*?)\s*\|\s*(.*?)\s*\|\s*$")
_NO_NVLINK = re.compile(r"cuda[-_]ipc\b.*\bdisabled\b.*\bno nvlinks?\b", re.IGNORECASE)
_NO_REG = re.compile(r"\bmd (\S+) cannot register (cuda(?:-managed)?|rocm(?:-managed)?) memory")
_ENV = re.compile(r"UCX_\* env variables?:\s*(.*)$")
_PATH_SUFFIX = re.compile(r"(?:/path\d+|\.\d+)$")


@dataclass(frozen=True)
class UcxLane:
    feature: str
    """What the lane carries: ``rma``, ``rma_am``, ``rma_bw``, ``am``, ``ka``, … (UCX's words)."""
    transport: str
    """``tcp``, ``rc_mlx5``, ``cuda_ipc``, …"""
    device: str
    locality: str | None
    """``self``, ``intra-node``, ``inter-node``; None when the line does not say."""
    where: str
    """How UCX printed it: ``used tls``, ``wireup lane``, ``proto`` (UCX_PROTO_INFO)."""
    operation: str = ""
    """UCX_PROTO_INFO only: the operation row header (``remote memory write by ucp_put* …``)."""

    @property
    def text(self) -> str:
        return f"{self.feature}({self.transport}/{self.device})"


@dataclass
class UcxLog:
    lanes: list[UcxLane] = field(default_factory=list)
    cuda_ipc_no_nvlink: bool = False
    no_registration: set[str] = field(default_factory=set)
    """Memory domains that cannot register GPU memory (``mlx5_3``)."""
    env: dict[str, str] = field(default_factory=dict)
    """``UCX_*`` variables UCX printed that it was given."""

    def tcp_rma(self) -> list[UcxLane]:
        return [ln for ln in self.lanes if ln.transport == "tcp" and ln.feature in RMA_FEATURES]

    def tcp_am_only(self) -> list[UcxLane]:
        """Active-message lanes on TCP in configurations whose AM has no other transport."""
        by_cfg: dict[tuple[str | None, str], list[UcxLane]] = {}
        for ln in self.lanes:
            if ln.feature in AM_FEATURES:
                by_cfg.setdefault((ln.locality, ln.where), []).append(ln)
        return [
            ln
            for lanes in by_cfg.values()
            if lanes and all(x.transport == "tcp" for x in lanes)
            for ln in lanes
        ]

    def merge(self, other: UcxLog) -> None:
        self.lanes.extend(other.lanes)
        self.cuda_ipc_no_nvlink |= other.cuda_ipc_no_nvlink
        self.no_registration |= other.no_registration
        self.env.update(other.env)


def parse_ucx_line(line: str, log: UcxLog, table: list[str | None]) -> bool:
    """Add what one log line says to ``log``; True when the line was a UCX line it read.

    ``table`` is a one-element list holding the UCX_PROTO_INFO table header in force
    (``locality|operation``) or None; rows between headers belong to it.
    """
    if (m := _NO_REG.search(line)) is not None:
        log.no_registration.add(m.group(1))
        return True
    if _NO_NVLINK.search(line):
        log.cuda_ipc_no_nvlink = True
        return True
    if (m := _ENV.search(line)) is not None and "UCX" in line:
        for item in m.group(1).split():
            key, sep, value = item.partition("=")
            if sep and key.startswith("UCX_"):
                log.env[key] = value
        return True
    if "|" in line:
        return _proto_line(line, log, table)
    if (m := _WIREUP_LANE.search(line)) is not None:
        tl, dev = m.group(2), _PATH_SUFFIX.sub("", m.group(3))
        for p in _WIREUP_PURPOSE.finditer(m.group(4)):
            feature = p.group(1) or ("ka" if p.group(2) == "keepalive" else "am")
            log.lanes.append(UcxLane(feature, tl, dev, None, "wireup lane"))
        return True
    cfg = _CFG.search(line)
    if cfg is None:
        return False
    groups = _GROUP.findall(line[cfg.end() :])
    for feature, rscs in groups:
        for tl, dev in _RSC.findall(rscs):
            log.lanes.append(UcxLane(feature, tl, dev, cfg.group(1), "used tls"))
    return bool(groups)


def _proto_line(line: str, log: UcxLog, table: list[str | None]) -> bool:
    if (h := _PROTO_HEADER.search(line)) is not None:
        table[0] = f"{h.group(1)}|{h.group(3)}"
        return True
    row = _PROTO_ROW.search(line)
    if row is None or table[0] is None:
        return False
    locality, _, operation = table[0].partition("|")
    feature = _proto_feature(operation)
    if feature is None:
        return True
    for tl, dev in _RSC.findall(row.group(3)):
        lane = UcxLane(feature, tl, _PATH_SUFFIX.sub("", dev), locality, "proto", operation)
        if lane not in log.lanes:
            log.lanes.append(lane)
    return True


def _proto_feature(operation: str) -> str | None:
    op = operation.lower()
    if "remote memory" in op or "ucp_put" in op or "ucp_get" in op:
        return "rma"
    if "active message" in op or "tagged message" in op or "ucp_am_send" in op:
        return "am"
    if "atomic" in op:
        return "amo"
    return None


def parse_ucx_log(text: str) -> UcxLog:
    log = UcxLog()
    table: list[str | None] = [None]
    for line in text.splitlines():
        parse_ucx_line(line, log, table)
    return log


def _names(lanes: list[UcxLane], limit: int = 4) -> str:
    seen: list[str] = []
    for ln in lanes:
        where = f"{ln.locality} " if ln.locality else ""
        text = f"{where}{ln.text}"
        if text not in seen:
            seen.append(text)
    return ", ".join(seen[:limit]) + (f" (+{len(seen) - limit} more)" if len(seen) > limit else "")


def ucx_warnings(log: UcxLog) -> list[PreflightWarning]:
    """What a UCX log proves about the KV path, each with the fix."""
    out: list[PreflightWarning] = []
    tls = f" (UCX_TLS={log.env['UCX_TLS']})" if "UCX_TLS" in log.env else ""
    if log.no_registration:
        mds = ", ".join(sorted(log.no_registration))
        out.append(
            PreflightWarning(
                "UCX_NO_GPU_REGISTRATION",
                "warning",
                f"UCX log: md {mds} cannot register GPU memory, so RDMA zero-copy of GPU "
                "memory gets 0 lanes and KV is copied through host bounce buffers. Do: load "
                "nvidia_peermem (GPUDirect RDMA) or use a DMA-BUF capable UCX/driver; check "
                "UCX_NET_DEVICES names a NIC next to the GPU",
            )
        )
    tcp = log.tcp_rma()
    if tcp:
        local = any(ln.locality in ("self", "intra-node") for ln in tcp)
        remote = any(ln.locality in ("inter-node", None) for ln in tcp)
        fixes = []
        if local:
            fixes.append(
                "on one host keep cuda_ipc in UCX_TLS and give the GPUs NVLink or PCIe P2P "
                "(nvidia-smi topo -p2p r); without NVLink use push mode (cuda_ipc writes)"
            )
        if remote:
            fixes.append(
                "across hosts put rc/dc (or ib) in UCX_TLS, set UCX_NET_DEVICES to the RDMA NIC "
                "(e.g. mlx5_0:1) and enable GPUDirect RDMA (nvidia_peermem); on EFA use the "
                "LIBFABRIC backend"
            )
        out.append(
            PreflightWarning(
                "UCX_TCP_LANES",
                "warning",
                f"UCX log: remote memory access (the KV data path) runs over TCP: "
                f"{_names(tcp)}{tls}; expect the 0.3-0.5 GB/s fallback band. Do: "
                + "; ".join(fixes),
            )
        )
    am = [ln for ln in log.tcp_am_only() if ln.where != "proto"]
    if am and not tcp:
        out.append(
            PreflightWarning(
                "UCX_TCP_AM_LANES",
                "info",
                f"UCX log: active messages (control, notifications) use only TCP: {_names(am)}"
                f"{tls}. KV is unaffected while RMA uses another transport. Do: nothing, or "
                "add an RDMA transport to UCX_TLS for lower notification latency",
            )
        )
    if log.cuda_ipc_no_nvlink:
        out.append(
            PreflightWarning(
                "UCX_CUDA_IPC_NO_NVLINK",
                "warning",
                "UCX log: cuda-ipc get zero-copy is disabled (no NVLink detected), so NIXL "
                "reads (pull mode) between GPUs of one host cannot use cuda_ipc and UCX picks "
                "another lane (TCP when the host has no RDMA). Do: use push mode (cuda_ipc "
                "writes), or NVLink-connected GPUs; UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y forces reads "
                "over PCIe P2P where nvidia-smi topo -p2p r says OK",
            )
        )
    return out
