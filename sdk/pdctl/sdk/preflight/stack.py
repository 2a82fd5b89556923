"""Stack checks: can the software (NIXL backend, UCX transports, mode) use the hardware path?

Each check returns warnings that say what was seen, what it costs and what to do; the
ones that predict a NIXL fallback also return a reason, and the pair's bandwidth is then
taken from the fallback band whatever the hardware (TOPOLOGY.md, decision step 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdctl.sdk.preflight.kvpath import FALLBACK_BPS, FALLBACK_RANGE, PathChoice, PathClass
from pdctl.sdk.preflight.model import Inventory, PlannedPair
from pdctl.sdk.preflight.report import PreflightWarning, Severity

if TYPE_CHECKING:
    from pdctl.sdk.preflight.kvsize import KvLayout

POST_S_PER_DESCRIPTOR = 46e-3 / 18_880
"""Published: block size 16 → 18,880 descriptors and 46 ms post time (vs 118 and 0.46 ms)."""
DESCRIPTOR_LIMIT = 10_000
_ALIASES: dict[str, tuple[str, ...]] = {
    "rc": ("rc_verbs", "rc_mlx5"),
    "dc": ("dc_mlx5",),
    "ud": ("ud_verbs", "ud_mlx5"),
    "ib": ("rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5"),
    "cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"),
    "shm": ("posix", "sysv", "cma", "knem", "xpmem"),
    "mm": ("posix", "sysv", "xpmem"),
}
_RDMA_TLS = ("rc_verbs", "rc_mlx5", "dc_mlx5")
_REACH_REMOTE = (*_RDMA_TLS, "ud_verbs", "ud_mlx5", "tcp")
_REACH_LOCAL = ("cuda_ipc", "posix", "sysv", "cma", "tcp")


@dataclass(frozen=True)
class Stack:
    mode: str = "push"
    backends: tuple[str, ...] = ("UCX",)
    ucx_tls: str | None = None
    kv_buffer_device: str = "cuda"


def tls_allows(tls: str | None, transport: str) -> bool | None:
    """Does ``UCX_TLS`` let UCX use ``transport``? None when UCX_TLS is unset."""
    if tls is None or not tls.strip():
        return None
    text = tls.strip()
    exclude = text.startswith("^")
    items = [t.strip().lower() for t in text.lstrip("^").split(",") if t.strip()]
    named = any(t in ("all", transport) or transport in _ALIASES.get(t, ()) for t in items)
    return not named if exclude else named


def stack_checks(
    inv: Inventory,
    pair: PlannedPair,
    choice: PathChoice,
    stack: Stack,
    per_rank: int | None,
) -> tuple[str, list[PreflightWarning]]:
    """(fallback reason or "", warnings) for one pair."""
    out: list[PreflightWarning] = []
    fallback = ""
    path = choice.path
    exp = choice.expected_bps

    def cost(bps: float | None) -> str:
        if bps is None or per_rank is None:
            return ""
        return f"{per_rank / bps * 1e3:,.0f} ms per prompt's {per_rank / 1e6:,.1f} MB"

    def warn(code: str, sev: Severity, msg: str) -> None:
        out.append(PreflightWarning(code, sev, msg, (pair.name,)))

    fb_cost = cost(FALLBACK_BPS)
    is_efa = any(n.kind == "efa" for n in inv.nics) and not pair.same_host
    if is_efa and "LIBFABRIC" not in stack.backends:
        fallback = "EFA with the UCX backend"
        warn(
            "EFA_WITH_UCX",
            "warning",
            f"EFA NICs but NIXL backends {list(stack.backends)}: UCX on EFA moved "
            f"≈0.3 GB/s in public reports (nixl#909) instead of {_bps(exp)}; {fb_cost}. "
            'Do: set fleet.nixl_backends = ["LIBFABRIC"]',
        )
    has_rdma = any(n.active is not False for n in inv.nics)
    if (
        pair.same_host
        and stack.mode == "pull"
        and path in (PathClass.HOST_STAGED, PathClass.PCIE_P2P)
        and not has_rdma
    ):
        fallback = fallback or "pull mode on one host without NVLink or RDMA"
        warn(
            "NIXL_PULL_TCP_FALLBACK",
            "warning",
            f"pull mode between GPUs with no NVLink ({path.value}) on a host without RDMA: "
            f"NIXL/UCX READ has fallen back to TCP here ({FALLBACK_RANGE}; vllm#52607: pull "
            f"0.5 GB/s vs push 49 GB/s) instead of {_bps(exp)}; {fb_cost}. "
            'Do: use fleet.mode = "push", then measure',
        )
    fallback = fallback or _tls_check(stack, choice, pair, warn, fb_cost)
    _path_notes(inv, pair, choice, stack, warn, cost)
    return fallback, out


def _tls_check(stack: Stack, choice: PathChoice, pair: PlannedPair, warn: _Warn, fb: str) -> str:
    tls = stack.ucx_tls
    if tls_allows(tls, "tcp") is None:
        return ""
    reach = _REACH_LOCAL if pair.same_host else _REACH_REMOTE
    if not any(tls_allows(tls, t) for t in reach):
        warn(
            "UCX_TLS_NO_TRANSPORT",
            "error",
            f"UCX_TLS={tls} leaves no transport that reaches the "
            f"{'same' if pair.same_host else 'other'} host ({', '.join(reach)}): transfers "
            "cannot complete. Do: add cuda_ipc (same host) or rc,dc (InfiniBand/RoCE) or tcp",
        )
        return "UCX_TLS allows no usable transport"
    path = choice.path
    needed: tuple[str, ...] = ()
    if pair.same_host and path in (PathClass.NVLINK, PathClass.PCIE_P2P):
        needed = ("cuda_ipc",)
    elif path in (PathClass.RDMA_IB, PathClass.RDMA_ROCE, PathClass.RDMA_HOST_STAGED):
        needed = _RDMA_TLS
    if needed and not any(tls_allows(tls, t) for t in needed):
        warn(
            "UCX_TLS_EXCLUDES",
            "warning",
            f"UCX_TLS={tls} excludes {' / '.join(needed)}, which {path.value} needs: UCX "
            f"falls back to a copy path ({FALLBACK_RANGE}); {fb}. Do: add "
            f"{'cuda_ipc' if needed == ('cuda_ipc',) else 'rc,dc'} to fleet.ucx.tls or unset it",
        )
        return f"UCX_TLS excludes {needed[0]}"
    return ""


def _path_notes(
    inv: Inventory,
    pair: PlannedPair,
    choice: PathChoice,
    stack: Stack,
    warn: _Warn,
    cost: _Cost,
) -> None:
    path, exp, cell = choice.path, choice.expected_bps, choice.cell
    if path is PathClass.NVLINK:
        warn(
            "NVLINK",
            "info",
            f"{cell} NVLink path: {_bps(exp)} expected ({cost(exp)}). NIXL uses it only "
            "through UCX cuda_ipc; below 1 GB/s measured it fell back to host copies. Do: keep "
            "cuda_ipc in UCX_TLS and measure once",
        )
    elif path is PathClass.PCIE_P2P and cell in ("PIX", "PXB"):
        warn(
            "P2P_SWITCH_LOCAL",
            "info",
            f"PCIe P2P under one switch ({cell}): {_bps(exp)} expected ({cost(exp)})",
        )
    elif path is PathClass.PCIE_P2P:
        warn(
            "P2P_THROUGH_CPU",
            "warning",
            f"PCIe P2P crosses the CPU ({cell}): {_bps(exp)} expected ({cost(exp)}), "
            "below switch-local P2P. Do: pair P and D on GPUs under one PCIe switch (PIX/PXB)",
        )
    elif path is PathClass.HOST_STAGED:
        warn(
            "NO_P2P_HOST_STAGED",
            "warning",
            f"no PCIe P2P between the GPUs ({cell or 'path unknown'}; {choice.basis}): KV "
            f"stages through host memory at {_bps(exp)} ({cost(exp)}). Do: pick GPUs with "
            "NVLink or P2P (nvidia-smi topo -p2p r), or check ACS/IOMMU settings",
        )
    elif path is PathClass.TCP:
        warn(
            "CROSS_NODE_TCP",
            "warning",
            f"no RDMA NIC: KV crosses hosts over TCP ({choice.basis}) at {_bps(exp)} "
            f"({cost(exp)}); disaggregation over plain Ethernet is usually worse than "
            "colocated. Do: use RDMA NICs (IB/RoCE/EFA) or keep P and D on one host",
        )
    if path is PathClass.RDMA_HOST_STAGED:
        efa = next((n for n in inv.nics if n.kind == "efa"), None)
        if efa is not None and efa.gdr is False:
            warn(
                "EFA_NO_GDR",
                "warning",
                f"EFA device {efa.name} reports gdr=0: KV is staged through host memory "
                f"({_bps(exp)}, {cost(exp)}). Do: install the EFA driver with GPUDirect RDMA "
                "support and load nvidia_peermem",
            )
        elif inv.gdr.present is False:
            warn(
                "NO_GPUDIRECT_RDMA",
                "warning",
                f"RDMA NIC but no GPUDirect RDMA ({inv.gdr.evidence}): KV is staged through "
                f"host memory ({_bps(exp)}, {cost(exp)}). Do: modprobe nvidia_peermem (or use "
                "a DMA-BUF capable kernel and driver)",
            )
        if cell in ("PHB", "NODE", "SYS"):
            warn(
                "NIC_NOT_LOCAL",
                "warning",
                f"GPU{pair.prefill_gpus[0]} reaches its closest RDMA NIC ({choice.nic}) via "
                f"{cell}; GPUDirect RDMA needs PIX/PXB, so KV is staged ({_bps(exp)}). Do: pin "
                "ranks to GPUs next to a NIC or set UCX_NET_DEVICES",
            )
    if stack.kv_buffer_device == "cpu" and path not in (PathClass.SAME_GPU, PathClass.UNKNOWN):
        warn(
            "KV_IN_HOST_MEMORY",
            "info",
            "kv_buffer_device = cpu: KV is registered in host memory, so every transfer is "
            "host-staged whatever the GPU path",
        )
    version = inv.tools.nixl_version
    topo = inv.topology
    if version == "0.10.0" and topo is not None and pair.same_host and pair.prefill_gpus:
        a, b = topo.gpu(pair.prefill_gpus[0]), topo.gpu(pair.decode_gpus[0])
        if a and b and a.numa is not None and b.numa is not None and a.numa != b.numa:
            warn(
                "NIXL_CROSS_NUMA_BUG",
                "warning",
                f"NIXL 0.10.0 with P on NUMA {a.numa} and D on NUMA {b.numa}: that release "
                "picks the wrong UCX lane across NUMA nodes (rc_mlx5 over cuda_ipc). Do: pin "
                "nixl<0.10 or a fixed release",
            )


def descriptor_check(kv: KvLayout, tokens: int, block_size: int) -> PreflightWarning | None:
    """Huge descriptor counts: one descriptor per block per layer (K and V apart unless MLA)."""
    blocks = -(-tokens // block_size)
    n = blocks * kv.num_layers * (1 if kv.kind == "mla" else 2)
    if n <= DESCRIPTOR_LIMIT:
        return None
    return PreflightWarning(
        "DESCRIPTOR_COUNT",
        "warning",
        f"block size {block_size} gives ≈{n:,} NIXL descriptors per {tokens:,}-token prompt: "
        f"≈{n * POST_S_PER_DESCRIPTOR * 1e3:.0f} ms of descriptor post time per transfer. "
        "Do: use block_size = 128",
    )


def _bps(bps: float | None) -> str:
    return "unknown bandwidth" if bps is None else f"{bps / 1e9:,.2f} GB/s"


if TYPE_CHECKING:
    from collections.abc import Callable

    _Warn = Callable[[str, Severity, str], None]
    _Cost = Callable[[float | None], str]
