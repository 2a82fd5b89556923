"""``run_preflight``: inventory → KV size → planned pairs → verdicts, in one call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdctl.sdk.fleetplan import build_plan, host_key
from pdctl.sdk.modelinfo import ModelInfoError, read_model_info, text_config
from pdctl.sdk.preflight.evidence import Evidence, parse_evidence
from pdctl.sdk.preflight.inventory import (
    PreflightInputError,
    collect_inventory,
    inventory_from_sources,
    read_input,
)
from pdctl.sdk.preflight.kvpath import PathClass
from pdctl.sdk.preflight.kvsize import KvLayout, kv_layout, prefill_flops, resolve_dtype
from pdctl.sdk.preflight.model import Inventory, PlannedPair
from pdctl.sdk.preflight.report import KvSummary, PreflightReport, PreflightWarning
from pdctl.sdk.preflight.sources import Sources, read_evidence
from pdctl.sdk.preflight.stack import Stack, descriptor_check
from pdctl.sdk.preflight.ucxlog import ucx_warnings
from pdctl.sdk.preflight.verdict import Workload, evaluate_pair, merge_warnings
from pdctl.sdk.spec import FleetSpec

DEFAULT_PROMPT_LEN = 8192
MFU = 0.4
MEASURE_HINT = (
    "measure for real: add --probe (moves the intended prompt's KV through NIXL between "
    "two local processes; pdctl probe --listen/--connect across hosts), or start the pair "
    "(pdctl up), send prompts of the intended length and pass the prefill log's 'KV "
    "Transfer metrics:' line back with --log FILE"
)


def run_preflight(
    spec: FleetSpec | None = None,
    *,
    model: str | None = None,
    prompt_len: int = DEFAULT_PROMPT_LEN,
    prompt_len_p95: int | None = None,
    rate: float | None = None,
    ttft_colocated_s: float | None = None,
    measured_transfer_s: float | None = None,
    peak_tflops: float | None = None,
    kv_dtype: str | None = None,
    mode: str | None = None,
    from_topo: str | Path | None = None,
    sysfs_root: str | Path | None = None,
    logs: Sequence[str | Path] = (),
    inventory: Inventory | None = None,
    evidence_files: Sequence[str | Path] = (),
    sources: Sequence[Sources] = (),
) -> PreflightReport:
    """Check whether disaggregating ``spec`` (or any GPU pair of this host) pays off.

    ``inventory`` replaces the look at the machine (tests, or a TUI that already has one);
    ``evidence_files`` (bundles of ``--collect``, or recorded tool outputs and logs) and
    ``sources`` (already collected texts) replace it with recorded hosts, one inventory
    per host. Raises :class:`~pdctl.sdk.errors.PdctlError` subclasses for unreadable inputs.
    """
    if prompt_len < 1:
        raise PreflightInputError("--prompt-len must be at least 1 token")
    p95 = max(prompt_len, prompt_len_p95 or prompt_len)
    hosts = list(sources) + (read_evidence(evidence_files) if evidence_files else [])
    evidence = Evidence()
    for h in hosts:
        for text in h.logs.values():
            evidence.merge(parse_evidence(text))
    invs = [inventory_from_sources(h) for h in hosts]
    if inventory is not None:
        invs = [inventory, *invs[1:]]
    if not invs:
        invs = [collect_inventory(from_topo=from_topo, sysfs_root=sysfs_root)]
    inv = invs[0]
    for log in logs:
        evidence.merge(parse_evidence(read_input(log, "--log")))
    warnings: list[PreflightWarning] = []
    assumptions: list[str] = []
    cfg, cfg_source = _model_config(spec, model, warnings)
    kv = _kv(cfg, spec, kv_dtype, warnings) if cfg is not None else None
    stack = _stack(spec, mode, assumptions, inv)
    pairs = _plan(spec, invs, warnings, assumptions)
    tp = pairs[0].tp if pairs else 1
    prefill_s, prefill_source = _prefill_time(cfg, prompt_len, ttft_colocated_s, peak_tflops, tp)
    work = Workload(kv, prompt_len, p95, rate, prefill_s, prefill_source, measured_transfer_s)
    results = []
    for pair in pairs:
        result, ws = evaluate_pair(
            _host_inv(invs, pair.prefill_host),
            pair,
            work,
            stack,
            evidence,
            peer=_host_inv(invs, pair.decode_host),
        )
        results.append(result)
        warnings.extend(ws)
    warnings.extend(_global_warnings(inv, spec, kv, prompt_len, stack, evidence, results))
    if pairs and prefill_s is None:
        warnings.append(
            PreflightWarning(
                "NO_PREFILL_TIME",
                "info",
                "no prefill time: verdicts are UNKNOWN. Do: pass --ttft-colocated S (measured "
                "colocated TTFT at this prompt length) or --peak-tflops for an estimate",
            )
        )
    if prefill_s is not None:
        assumptions.append(f"prefill time {prefill_s:.3f} s: {prefill_source}")
    if measured_transfer_s or evidence.measurements:
        assumptions.append("the measured transfer figure is applied to every pair")
    if rate is None and pairs:
        assumptions.append("no --rate: link load not checked")
    kv_summary = KvSummary(
        config=cfg_source,
        kind=kv.kind if kv else None,
        dtype=kv.dtype if kv else None,
        bytes_per_token=kv.bytes_per_token if kv else None,
        prompt_len=prompt_len,
        prompt_len_p95=p95,
        bytes_per_prompt=kv.bytes_for(prompt_len) if kv else None,
        bytes_per_prompt_p95=kv.bytes_for(p95) if kv else None,
        notes=list(kv.notes) if kv else [],
    )
    return PreflightReport(
        inventory=inv,
        kv=kv_summary,
        pairs=results,
        warnings=merge_warnings(warnings),
        mode=stack.mode,
        rate=rate,
        ttft_colocated_s=ttft_colocated_s,
        source=None,
        assumptions=assumptions,
        measure_hint=MEASURE_HINT,
    )


def _model_config(
    spec: FleetSpec | None, model: str | None, warnings: list[PreflightWarning]
) -> tuple[dict[str, Any] | None, str | None]:
    ref = model or (spec.model.path if spec else None)
    if ref is None:
        warnings.append(
            PreflightWarning(
                "NO_MODEL",
                "info",
                "no model given: KV bytes, transfer times and verdicts are unknown. Do: pass "
                "--model DIR|config.json (or -f with a local model.path)",
            )
        )
        return None, None
    try:
        info = read_model_info(ref)
    except ModelInfoError as e:
        raise PreflightInputError(str(e)) from None
    if info is None:
        if model is not None:
            raise PreflightInputError(
                f"--model {model}: no config.json there; give a local model directory or the "
                "path of its config.json"
            )
        warnings.append(
            PreflightWarning(
                "NO_MODEL",
                "info",
                f"model.path {ref!r} is not a local directory: KV size unknown. Do: pass "
                "--model with a local config.json",
            )
        )
        return None, None
    cfg = text_config(info.raw)
    for key in ("torch_dtype", "dtype"):
        if key not in cfg and key in info.raw:
            cfg[key] = info.raw[key]
    return cfg, str(info.config_path)


def _kv(
    cfg: dict[str, Any],
    spec: FleetSpec | None,
    kv_dtype: str | None,
    warnings: list[PreflightWarning],
) -> KvLayout:
    cache = kv_dtype or (spec.model.kv_cache_dtype if spec else "auto")
    dtype, _ = resolve_dtype(cache, spec.model.dtype if spec else "auto", cfg)
    kv = kv_layout(cfg, dtype)
    for note in kv.notes:
        if note.startswith("MLA"):
            warnings.append(PreflightWarning("MLA_CONFIG", "info", note))
    return kv


def _stack(
    spec: FleetSpec | None, mode: str | None, assumptions: list[str], inv: Inventory
) -> Stack:
    if spec is None:
        if mode is None:
            assumptions.append("mode assumed push (pdctl's default); pass --mode pull to check")
        tls = inv.env.get("UCX_TLS")
        return Stack(mode=mode or "push", backends=("UCX",), ucx_tls=tls)
    f = spec.fleet
    return Stack(
        mode=mode or f.mode,
        backends=tuple(f.nixl_backends),
        ucx_tls=f.ucx.tls or f.env.get("UCX_TLS"),
        kv_buffer_device=f.effective_kv_buffer_device,
    )


def _host_inv(invs: list[Inventory], host: str) -> Inventory:
    """The inventory recorded for ``host`` (by name, address or plan label), else the first."""
    return next((inv for inv in invs if _is(inv, host)), invs[0])


def _plan(
    spec: FleetSpec | None,
    invs: list[Inventory],
    warnings: list[PreflightWarning],
    assumptions: list[str],
) -> list[PlannedPair]:
    inv = invs[0]
    topo = inv.topology
    if spec is not None:
        if spec.fleet.platform == "cpu":
            warnings.append(
                PreflightWarning(
                    "CPU_PLATFORM",
                    "info",
                    "fleet.platform = cpu: KV lives in host memory and moves over UCX "
                    "shared memory or TCP; GPU topology checks do not apply",
                )
            )
            return []
        plan = build_plan(spec)
        pairs = [
            PlannedPair(
                f"{p.name} -> {d.name}",
                p.host,
                d.host,
                p.devices,
                d.devices,
                p.tp,
                host_key(p.host) == host_key(d.host),
            )
            for p in plan.role("prefill")
            for d in plan.role("decode")
        ]
        if topo is not None and pairs:
            assumptions.append(
                "spec device indices are read as nvidia-smi indices (set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs the same way)"
            )
        if len(invs) == 1 and any(not p.same_host for p in pairs):
            assumptions.append("every host is assumed to match the inventoried one")
        elif len(invs) > 1:
            hosts = sorted({h for p in pairs for h in (p.prefill_host, p.decode_host)})
            unmatched = [h for h in hosts if not any(_is(i, h) for i in invs)]
            if unmatched:
                assumptions.append(
                    f"no evidence for {', '.join(unmatched)}: assumed to match {inv.host} "
                    "(collect there with pdctl preflight --collect, then pass --evidence)"
                )
        return pairs
    if topo is None:
        return []
    gpus = [g.index for g in topo.gpus]
    here = inv.host if len(invs) > 1 else "this host"
    pairs = [
        PlannedPair(f"GPU{a} -> GPU{b}", here, here, (a,), (b,), 1, True)
        for i, a in enumerate(gpus)
        for b in gpus[i + 1 :]
    ]
    for other in invs[1:]:
        pairs += [
            PlannedPair(
                f"{inv.host} GPU{a} -> {other.host} GPU{a}",
                inv.host,
                other.host,
                (a,),
                (a,),
                1,
                False,
            )
            for a in gpus
        ]
    if len(invs) == 1 and (inv.nics or topo.nic_labels):
        pairs += [
            PlannedPair(f"GPU{a} -> GPU{a} (peer host)", "this host", "peer", (a,), (a,), 1, False)
            for a in gpus
        ]
        assumptions.append("the peer host is assumed to match this one")
    return pairs


def _where(inv: Inventory) -> str:
    return "this machine" if inv.host == "this host" else inv.host


def _is(inv: Inventory, host: str) -> bool:
    return host in (inv.host, *inv.addresses) or host_key(host) == host_key(inv.host)


def _prefill_time(
    cfg: dict[str, Any] | None,
    tokens: int,
    ttft: float | None,
    peak_tflops: float | None,
    tp: int,
) -> tuple[float | None, str]:
    if ttft is not None:
        return ttft, "measured colocated TTFT (given)"
    if peak_tflops and cfg is not None:
        flops = prefill_flops(cfg, tokens)
        if flops is not None:
            s = flops / (peak_tflops * 1e12 * MFU * tp)
            return s, f"estimate {flops:.3g} FLOPs / ({peak_tflops:g} TFLOPS x {MFU} MFU x TP {tp})"
    return None, "unknown"


def _global_warnings(
    inv: Inventory,
    spec: FleetSpec | None,
    kv: KvLayout | None,
    tokens: int,
    stack: Stack,
    ev: Evidence,
    results: list[Any],
) -> list[PreflightWarning]:
    out: list[PreflightWarning] = []
    gpu_fleet = spec is None or spec.fleet.platform == "gpu"
    if inv.topology is None and gpu_fleet:
        looked = ", ".join(f"{c.name} ({c.state})" for c in inv.checks)
        out.append(
            PreflightWarning(
                "NO_GPU",
                "warning",
                f"no NVIDIA GPU found on {_where(inv)}. Checked: {looked}. Paths and verdicts "
                "are unknown. Do: run pdctl preflight on a fleet host, or pass --from-topo "
                "FILE (saved nvidia-smi topo -m) and --sysfs-root DIR",
            )
        )
    nvml = next((c for c in inv.checks if c.name == "NVML"), None)
    if inv.topology is not None and nvml is not None and nvml.state != "ok":
        out.append(
            PreflightWarning(
                "NVML_HIDDEN",
                "info",
                f"nvidia-smi lists {len(inv.topology.gpus)} GPU(s) but NVML is unavailable "
                f"({nvml.detail}): per-pair P2P read/write, PCIe generation and NVSwitch "
                "are unknown. Do: pip install 'pdctl[gpu]' (nvidia-ml-py)",
            )
        )
    for r in results:
        if r.path is PathClass.UNKNOWN and inv.topology is not None:
            out.append(
                PreflightWarning(
                    "GPU_NOT_FOUND",
                    "error",
                    f"{r.name}: {r.path_detail}; the inventory has GPUs "
                    f"{[g.index for g in inv.topology.gpus]}. Do: fix the group's devices",
                    (r.name,),
                )
            )
    have = inv.tools.nixl_backends
    if have is not None:
        missing = [b for b in stack.backends if b not in have]
        if missing:
            out.append(
                PreflightWarning(
                    "NIXL_BACKEND_MISSING",
                    "error",
                    f"NIXL here ships backends {list(have)} but the fleet asks for {missing}: "
                    "agents fail to create the backend. Do: change fleet.nixl_backends or "
                    "install a NIXL build with that plugin",
                )
            )
    if kv is not None and spec is not None:
        block = spec.fleet.effective_block_size
        w = descriptor_check(kv, tokens, block)
        if w is not None:
            out.append(w)
    out.extend(ucx_warnings(ev.ucx))
    return out
