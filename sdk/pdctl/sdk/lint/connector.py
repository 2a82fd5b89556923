"""Rules PD042-PD043: pdctl connector settings passed through ``fleet.connector_options``."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.lint.core import Finding, LintContext, _f, rule

FAILPOINT_PREFIX = "pdctl_failpoint_"
"""Keys that make the pdctl connector fail on purpose (the chaos suite's WRITE failure)."""
ALLOW_FAILPOINTS_ENV = "PDCTL_ALLOW_FAILPOINTS"
"""Set to 1 by the chaos suite and the tests; nothing else should set it."""
SYNC_MODES = ("strict", "rw", "none")


@rule("PD042", "a connector failpoint outside tests")
def _failpoint(ctx: LintContext) -> Iterator[Finding]:
    if ctx.environ.get(ALLOW_FAILPOINTS_ENV) == "1":
        return
    for key in ctx.spec.fleet.connector_options:
        if key.startswith(FAILPOINT_PREFIX):
            yield _f(
                "PD042",
                "error",
                f"fleet.connector_options.{key}",
                f"{key} makes the pdctl connector fail transfers on purpose",
                "requests fail or recompute although nothing is wrong; it exists for the "
                "chaos suite",
                f"remove fleet.connector_options.{key} (tests set {ALLOW_FAILPOINTS_ENV}=1)",
            )


@rule("PD043", "a NIXL agent sync mode that can crash the engine")
def _sync_mode(ctx: LintContext) -> Iterator[Finding]:
    value = ctx.spec.fleet.connector_options.get("pdctl_nixl_sync_mode")
    if value is None:
        return
    name = str(value).strip().lower()
    if name not in SYNC_MODES:
        yield _f(
            "PD043",
            "error",
            "fleet.connector_options.pdctl_nixl_sync_mode",
            f"pdctl_nixl_sync_mode = {value!r} is not a NIXL sync mode",
            "the connector refuses to start",
            f"use one of {', '.join(SYNC_MODES)} ('strict' is the default)",
        )
    elif name == "none" and ctx.spec.fleet.cpu_tuning:
        yield _f(
            "PD043",
            "warning",
            "fleet.connector_options.pdctl_nixl_sync_mode",
            "pdctl_nixl_sync_mode = 'none' with the NIXL progress thread off",
            "vLLM's writer and engine threads then call UCX at once: prefill segfaulted "
            "under load in this setting (see docs/reliability.md)",
            "remove the key (strict is the default) unless you are reproducing the crash",
        )


KV_VERIFY_RATE = "pdctl_kv_verify_rate"
KV_VERIFY_DEFAULT = 0.01
"""The connector's default share of verified requests (``pdctl.connector.kvverify``)."""


def _hetero_gap(ptp: int, dtp: int, kv_heads: int | None, mla: bool) -> str | None:
    """Why the digest check does not cover prefill TP ``ptp`` → decode TP ``dtp``, or
    None when it does (equal TP; prefill TP a multiple of decode TP within the KV heads:
    ``pdctl.connector.kvslice``)."""
    if ptp == dtp:
        return None
    if ptp < dtp:
        return "decode TP above prefill TP: each WRITE carries part of a prefill block"
    if ptp % dtp:
        return "TP sizes that do not divide"
    if mla:
        return "MLA across TP sizes: every prefill rank writes the whole latent block"
    if kv_heads is None:
        return (
            "KV heads unknown: covered only if prefill TP ≤ the model's KV heads "
            "(set model.kv_heads so lint can tell)"
        )
    if ptp > kv_heads or kv_heads % ptp:
        return (
            f"prefill TP above the model's {kv_heads} KV heads: several prefill ranks "
            "write the same head slice"
        )
    return None


def _uncovered(ctx: LintContext) -> list[str]:
    """Layouts of this spec that the connector's KV digest check does not cover."""
    out: list[str] = []
    model = ctx.model
    kv_heads = (model.num_kv_heads if model else None) or ctx.spec.model.kv_heads
    mla = model.is_mla if model else bool(ctx.spec.model.mla)
    pairs = {(p.tp, d.tp) for p in ctx.spec.prefill for d in ctx.spec.decode}
    for ptp, dtp in sorted(pairs):
        gap = _hetero_gap(ptp, dtp, kv_heads, mla)
        if gap is not None:
            out.append(f"prefill TP{ptp} → decode TP{dtp} (heterogeneous TP: {gap})")
    if any(p.pp > 1 for p in ctx.spec.prefill):
        out.append("a prefill with pp > 1 (each stage writes some layers)")
    if ctx.spec.fleet.platform != "cpu" and ctx.spec.fleet.effective_kv_buffer_device == "cpu":
        out.append("kv_buffer_device = 'cpu' on a GPU (KV staged through a host buffer)")
    return out


@rule("PD048", "KV digest check: a bad rate, or layouts it does not cover")
def _kv_verify(ctx: LintContext) -> Iterator[Finding]:
    """The connector's sampled KV digests (``pdctl.connector.kvverify``): it checks
    equal-block-size, non-PP layouts with KV registered in place, at equal TP or with
    prefill TP a multiple of decode TP within the model's KV heads (each prefill rank
    fills one head slice of the decode's blocks: ``pdctl.connector.kvslice``). Not
    covered, noted here: decode TP above prefill TP (vLLM's push worker,
    ``nixl/push_worker.py`` ``_xfer_blocks_for_req``, then splits a prefill block over
    several WRITEs), a prefill TP above the KV heads or MLA across TP sizes (several
    prefill ranks write the same bytes), PP prefills (each stage writes some layers),
    host-buffer staging."""
    if ctx.spec.fleet.mode != "push" or ctx.spec.fleet.connector != "pdctl":
        return
    field_ = f"fleet.connector_options.{KV_VERIFY_RATE}"
    raw = ctx.spec.fleet.connector_options.get(KV_VERIFY_RATE, KV_VERIFY_DEFAULT)
    try:
        rate = float(raw)
    except (TypeError, ValueError):
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        yield _f(
            "PD048",
            "error",
            field_,
            f"{KV_VERIFY_RATE} = {raw!r} is not a share between 0 and 1",
            "the connector refuses to start",
            f"use a number between 0 (off) and 1 (every request); the default is "
            f"{KV_VERIFY_DEFAULT}",
        )
        return
    if rate == 0:
        return
    for layout in _uncovered(ctx):
        yield _f(
            "PD048",
            "info",
            field_,
            f"the KV digest check does not cover {layout}",
            "those requests are not verified; they count as "
            'pdctl:kv_verify_total{result="unsupported"} (docs/connector.md)',
            "nothing to do unless you need the check on this layout; use equal TP on "
            "prefill and decode, or a prefill TP that is a multiple of the decode's and "
            "at most the model's KV heads, to have it",
        )
