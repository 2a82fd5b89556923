"""The KV transfer model of each mode: the profile's measured path, or preflight's path
model on a ``nvidia-smi topo -m`` text (pure).

With a topology, preflight classifies the P→D path of the first planned pair (P on GPUs
``0..tp-1``, D on ``tp..2tp-1``), applies its stack checks per mode (pull on one host
without NVLink or RDMA is predicted to fall back to a TCP-speed path) and, when the
profile holds a measurement, uses the measurement (as preflight does with ``--log``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pdctl.sdk.plan.latency import Transfer
from pdctl.sdk.plan.profile import Profile, ProfileError, fit, nnls
from pdctl.sdk.preflight.evidence import Evidence
from pdctl.sdk.preflight.model import Inventory, PlannedPair
from pdctl.sdk.preflight.stack import Stack
from pdctl.sdk.preflight.topo import parse_topo
from pdctl.sdk.preflight.verdict import OVERHEAD_S, Workload, evaluate_pair


def transfers(
    profile: Profile,
    isl: int,
    *,
    topology: str | Path | None = None,
    gpu_name: str | None = None,
    kv_bps: float | None = None,
) -> dict[str, Transfer] | None:
    """``{"push": …, "pull": …}``, or None when nothing tells the KV path."""
    kv = profile.kv.layout()
    per_token = kv.per_rank(isl, profile.tp) / isl
    measured = profile.kv_path
    if kv_bps is not None:
        t = Transfer(per_token, kv_bps, OVERHEAD_S, "given", f"--kv-gbps {kv_bps / 1e9:g}")
        return {"push": t, "pull": t}
    if topology is None:
        served = served_path(profile)
        if served is not None:
            return {"push": served, "pull": served}
        if measured is None:
            return None
        t = Transfer(
            per_token, measured.bytes_per_s, measured.overhead_s, "measured", measured.source
        )
        return {"push": t, "pull": t}
    return {
        mode: _from_topology(profile, isl, mode, topology, gpu_name) for mode in ("push", "pull")
    }


def served_path(profile: Profile) -> Transfer | None:
    """The KV path as a real 1P1D pair serves it: measured disaggregated TTFT minus the
    fitted prefill time and one decode step, fitted as ``overhead + bytes / bandwidth``
    (None with fewer than two prompt lengths)."""
    if len({d.input_len for d in profile.disagg}) < 2:
        return None
    curves = fit(profile)
    kv = profile.kv.layout()
    rows, extra = [], []
    for d in profile.disagg:
        rows.append([1.0, float(kv.per_rank(d.input_len, profile.tp))])
        base = curves.prefill_s(d.input_len) + curves.step_s(1, d.input_len)
        extra.append(max(d.ttft_s - base, 1e-6))
    overhead, per_byte = nnls(rows, extra)
    lens = "/".join(str(d.input_len) for d in profile.disagg)
    return Transfer(
        kv.per_rank(1, profile.tp),
        1 / per_byte if per_byte > 0 else 1e15,
        overhead,
        "measured P/D",
        f"1P1D {profile.disagg[0].mode} TTFT at {lens} tokens minus prefill and one decode "
        f"step: {overhead * 1e3:.1f} ms + bytes / "
        + (f"{1e-9 / per_byte:.3g} GB/s" if per_byte > 0 else "(no per-byte cost seen)"),
    )


def _from_topology(
    profile: Profile, isl: int, mode: str, topology: str | Path, gpu_name: str | None
) -> Transfer:
    path = Path(topology)
    try:
        topo = parse_topo(path.read_text(encoding="utf-8"), source=str(path))
    except OSError as e:
        raise ProfileError(f"--topology {path}: cannot read it ({e})") from None
    name = gpu_name or (profile.hardware if profile.platform == "gpu" else None)
    topo.gpus = [replace(g, name=name) for g in topo.gpus]
    tp = profile.tp
    if len(topo.gpus) < 2 * tp:
        raise ProfileError(
            f"--topology {path}: {len(topo.gpus)} GPUs, a P/D pair at TP {tp} needs {2 * tp}"
        )
    pair = PlannedPair(
        "P0->D0",
        "this host",
        "this host",
        tuple(g.index for g in topo.gpus[:tp]),
        tuple(g.index for g in topo.gpus[tp : 2 * tp]),
        tp,
        True,
    )
    kv = profile.kv.layout()
    per_rank = kv.per_rank(isl, tp)
    m = profile.kv_path
    given = per_rank / m.bytes_per_s + m.overhead_s if m is not None else None
    work = Workload(kv, isl, isl, None, None, "plan", given)
    result, _ = evaluate_pair(Inventory(topology=topo), pair, work, Stack(mode=mode), Evidence())
    if result.bandwidth_bps is None or result.transfer_s is None:
        raise ProfileError(
            f"--topology {path}: the P->D path is {result.path} ({result.path_detail}); its "
            "bandwidth is unknown — pass --gpu-name with the GPU's product name, --kv-gbps, "
            "or measure it with pdctl profile (probe)"
        )
    overhead = max(0.0, result.transfer_s - per_rank / result.bandwidth_bps)
    return Transfer(
        per_rank / isl,
        result.bandwidth_bps,
        overhead,
        str(result.path),
        result.bandwidth_source,
    )
