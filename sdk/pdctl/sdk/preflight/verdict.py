"""Per P→D pair: path, effective bandwidth, transfer time, link load, verdict (pure).

Verdict on ``r = t_transfer / t_prefill`` and link load ``rho = rate x bytes / B_eff``:
r ≤ 0.1 and rho ≤ 0.5 → OK; r ≤ 0.5 → MARGINAL; r > 0.5 or rho > 0.7 → UNLIKELY TO PAY
OFF; r > 1 → DO NOT DISAGGREGATE (at this prompt length).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.sdk.preflight.evidence import Evidence, Measurement
from pdctl.sdk.preflight.kvpath import (
    FALLBACK_BPS,
    FALLBACK_RANGE,
    PathChoice,
    PathClass,
    classify_cross_host,
    classify_same_host,
)
from pdctl.sdk.preflight.kvsize import KvLayout
from pdctl.sdk.preflight.model import Inventory, PlannedPair
from pdctl.sdk.preflight.report import PairResult, PreflightWarning, Severity, Verdict
from pdctl.sdk.preflight.stack import Stack, stack_checks

OVERHEAD_S = 0.005
"""Fixed cost per transfer (handshake-free: descriptor prep, post, notification)."""
FALLBACK_SIGNATURE_BPS = 0.6e9
DEGRADED_FRACTION = 0.3


@dataclass(frozen=True)
class Workload:
    kv: KvLayout | None
    prompt_len: int
    prompt_len_p95: int
    rate: float | None
    prefill_s: float | None
    prefill_source: str
    measured_transfer_s: float | None = None


def verdict_for(ratio: float | None, load: float | None) -> Verdict:
    if ratio is None:
        return Verdict.UNKNOWN
    rho = load or 0.0
    if ratio > 1:
        return Verdict.DO_NOT
    if ratio > 0.5 or rho > 0.7:
        return Verdict.UNLIKELY
    if ratio <= 0.1 and rho <= 0.5:
        return Verdict.OK
    return Verdict.MARGINAL


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def fmt_bps(bps: float) -> str:
    return f"{bps / 1e9:,.2f} GB/s" if bps >= 1e8 else f"{bps / 1e6:,.1f} MB/s"


def fmt_s(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.0f} ms"


def choose_path(inv: Inventory, pair: PlannedPair, peer: Inventory | None = None) -> PathChoice:
    """The worst rank-to-rank path of a pair (rank r of P sends to rank r mod |D| of D).

    Across hosts, P's end is read from ``inv`` and D's from ``peer`` (default: ``inv``)."""
    far = peer or inv
    if inv.topology is None or not pair.prefill_gpus or not pair.decode_gpus:
        return PathChoice(PathClass.UNKNOWN, None, 1.0, "no GPU inventory")
    if not pair.same_host and far.topology is None:
        return PathChoice(PathClass.UNKNOWN, None, 1.0, f"no GPU inventory of {far.host}")
    choices: list[PathChoice] = []
    for r, a in enumerate(pair.prefill_gpus):
        b = pair.decode_gpus[r % len(pair.decode_gpus)]
        if pair.same_host:
            choices.append(classify_same_host(inv.topology, a, b))
            continue
        assert far.topology is not None
        if inv.topology.gpu(a) is None or far.topology.gpu(b) is None:
            missing = a if inv.topology.gpu(a) is None else b
            return PathChoice(PathClass.UNKNOWN, None, 1.0, f"GPU{missing} is not in the inventory")
        choices.extend((classify_cross_host(inv, a), classify_cross_host(far, b)))
    unknown = [c for c in choices if c.path is PathClass.UNKNOWN]
    if unknown:
        return unknown[0]
    return min(choices, key=lambda c: c.expected_bps if c.expected_bps is not None else 1e30)


def evaluate_pair(
    inv: Inventory,
    pair: PlannedPair,
    work: Workload,
    stack: Stack,
    evidence: Evidence,
    peer: Inventory | None = None,
) -> tuple[PairResult, list[PreflightWarning]]:
    choice = choose_path(inv, pair, peer)
    out: list[PreflightWarning] = []
    kv = work.kv
    per_rank = kv.per_rank(work.prompt_len, pair.tp) if kv else None
    per_rank95 = kv.per_rank(work.prompt_len_p95, pair.tp) if kv else None
    expected = choice.expected_bps
    source = (
        f"nominal x {choice.efficiency:g} ({choice.basis})" if expected is not None else "unknown"
    )
    fallback, stack_warnings = stack_checks(inv, pair, choice, stack, per_rank)
    out.extend(stack_warnings)
    if fallback and choice.path is not PathClass.SAME_GPU:
        expected = FALLBACK_BPS
        source = f"predicted NIXL fallback ({FALLBACK_RANGE}): {fallback}"
    if choice.path is PathClass.SAME_GPU:
        expected = None
    bandwidth, transfer = expected, None
    measured = _measurement(evidence, work, per_rank)
    if measured is not None and choice.path is not PathClass.SAME_GPU:
        bandwidth, source = measured.bytes_per_s, f"measured ({measured.detail})"
        out.extend(
            _measured_warnings(
                pair, measured, choice.expected_bps or choice.floor_bps, choice, per_rank
            )
        )
    if choice.path is PathClass.SAME_GPU:
        transfer, transfer95 = 0.0, 0.0
    elif bandwidth and per_rank is not None and per_rank95 is not None:
        extra = 0.0 if measured is not None else OVERHEAD_S
        transfer = per_rank / bandwidth + extra
        transfer95 = per_rank95 / bandwidth + extra
    else:
        transfer95 = None
    ratio = transfer / work.prefill_s if transfer is not None and work.prefill_s else None
    load = None
    if work.rate and per_rank is not None and bandwidth and choice.path is not PathClass.SAME_GPU:
        load = work.rate * per_rank / bandwidth
    verdict = verdict_for(ratio, load) if choice.path is not PathClass.SAME_GPU else Verdict.OK
    result = PairResult(
        name=pair.name,
        prefill_host=pair.prefill_host,
        decode_host=pair.decode_host,
        prefill_gpus=pair.prefill_gpus,
        decode_gpus=pair.decode_gpus,
        tp=pair.tp,
        path=choice.path,
        path_detail=choice.basis,
        expected_bps=expected,
        bandwidth_bps=bandwidth,
        bandwidth_source=source,
        kv_bytes=per_rank,
        kv_bytes_p95=per_rank95,
        transfer_s=transfer,
        transfer_s_p95=transfer95,
        prefill_s=work.prefill_s,
        ratio=ratio,
        link_load=load,
        verdict=verdict,
        same_host=pair.same_host,
        assumptions=choice.assumed,
    )
    out.extend(_verdict_warnings(result, work))
    return result, out


def _measurement(ev: Evidence, work: Workload, per_rank: int | None) -> Measurement | None:
    if work.measured_transfer_s and per_rank:
        s = work.measured_transfer_s
        return Measurement(
            per_rank / s,
            "given",
            f"{fmt_bytes(per_rank)} in {fmt_s(s)} = {fmt_bps(per_rank / s)}",
            transfer_s=s,
        )
    return ev.best("vLLM") or ev.best("nixlbench")


def _measured_warnings(
    pair: PlannedPair,
    m: Measurement,
    expected: float | None,
    choice: PathChoice,
    per_rank: int | None,
) -> list[PreflightWarning]:
    out: list[PreflightWarning] = []
    if expected is None:
        return out
    if m.bytes_per_s <= FALLBACK_SIGNATURE_BPS and expected >= 2 * m.bytes_per_s:
        cost = (
            f"; one prompt's {fmt_bytes(per_rank)} takes {fmt_s(per_rank / m.bytes_per_s)} "
            f"instead of {fmt_s(per_rank / expected)}"
            if per_rank
            else ""
        )
        out.append(
            _w(
                "TCP_FALLBACK_SIGNATURE",
                "warning",
                f"measured {fmt_bps(m.bytes_per_s)} ({m.detail}) matches the NIXL/UCX TCP "
                f"fallback signature ({FALLBACK_RANGE}), not the "
                f"{'' if choice.expected_bps else 'at least '}{fmt_bps(expected)} a "
                f"{choice.path.value} path should give{cost}. Do: check UCX_PROTO_INFO=y logs "
                "for rma(tcp/...) lanes; use push mode on one host, keep cuda_ipc/rc in "
                "UCX_TLS, use the LIBFABRIC backend on EFA",
                pair.name,
            )
        )
    elif m.bytes_per_s < DEGRADED_FRACTION * expected:
        out.append(
            _w(
                "SOFTWARE_PATH_DEGRADED",
                "warning",
                f"measured {fmt_bps(m.bytes_per_s)} is {m.bytes_per_s / expected:.0%} of the "
                f"{fmt_bps(expected)} expected on {choice.path.value} (below 30%): the software "
                "path is degraded. Do: compare UCX lanes (UCX_PROTO_INFO=y) with the expected "
                "transport and check GPUDirect/P2P settings",
                pair.name,
            )
        )
    return out


def _verdict_warnings(p: PairResult, work: Workload) -> list[PreflightWarning]:
    if p.ratio is None or p.transfer_s is None or p.prefill_s is None:
        return []
    at = f"at {work.prompt_len:,} tokens"
    seen = (
        f"transfer {fmt_s(p.transfer_s)} vs prefill {fmt_s(p.prefill_s)} "
        f"(r = {p.ratio:.2f}) {at} on {p.path.value}"
    )
    if p.link_load is not None and p.link_load > 0.7:
        return [
            _w(
                "LINK_SATURATION",
                "error" if p.verdict is Verdict.DO_NOT else "warning",
                f"link load {p.link_load:.2f} at {work.rate:g} req/s ({seen}): above 0.7 "
                "transfers queue and TTFT grows without bound. Do: lower the rate per pair, add "
                "P/D pairs on separate links, or fix the path's bandwidth",
                p.name,
            )
        ]
    if p.verdict is Verdict.DO_NOT:
        return [
            _w(
                "DO_NOT_DISAGGREGATE",
                "error",
                f"{seen}: each request's TTFT grows by about {fmt_s(p.transfer_s)} over "
                "colocated serving. Do: serve colocated at this prompt length (chunked prefill "
                "protects decode), or fix the path first and measure again",
                p.name,
            )
        ]
    if p.verdict is Verdict.UNLIKELY:
        return [
            _w(
                "UNLIKELY_TO_PAY_OFF",
                "warning",
                f"{seen}: the transfer adds more than half a prefill to TTFT. Do: disaggregate "
                "only if prefill badly disrupts decode (long prompts under load); else colocate",
                p.name,
            )
        ]
    if p.verdict is Verdict.MARGINAL:
        return [
            _w(
                "MARGINAL",
                "warning",
                f"{seen}: pays only where decode interference dominates. Do: measure TTFT/ITL "
                "both ways at the real rate before committing",
                p.name,
            )
        ]
    return []


def _w(code: str, severity: Severity, message: str, pair: str) -> PreflightWarning:
    return PreflightWarning(code, severity, message, (pair,))


def merge_warnings(ws: list[PreflightWarning]) -> list[PreflightWarning]:
    """One entry per (code, message); pairs accumulated; errors first, then warnings, infos."""
    merged: dict[tuple[str, str], PreflightWarning] = {}
    for w in ws:
        key = (w.code, w.message)
        prev = merged.get(key)
        if prev is None:
            merged[key] = w
        else:
            pairs = prev.pairs + tuple(p for p in w.pairs if p not in prev.pairs)
            merged[key] = PreflightWarning(w.code, w.severity, w.message, pairs)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(merged.values(), key=lambda w: order[w.severity])
