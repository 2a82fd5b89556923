"""Proof that the KV that arrived is the KV that was sent: sampled per-block digests.

For a sampled share of requests (``pdctl_kv_verify_rate`` in
``kv_connector_extra_config``, on the decode; default :data:`DEFAULT_RATE`) the decode
asks for a digest in its registration (:data:`ASK_KEY`, one more key in vLLM's
``PUSH_REG`` payload; a stock prefill ignores it). The prefill computes the digest
(:mod:`pdctl.connector.kvdigest`) of exactly the blocks each WRITE sends — after vLLM's
own prefix-cache trim, paired with the destination block ids that WRITE targets — and
carries the pairs in front of that WRITE's completion notification
(``pdkv1|<block>=<digest>,...|<vLLM's notification>``: it arrives with the data, never
before). The decode strips the digests before vLLM reads the notification, and after the
last notification of the request, before vLLM hears the receive is finished, recomputes
each digest over its own destination blocks. A mismatch fails the receive (vLLM's
``kv_load_failure_policy`` answers: recompute, or an error) and is logged with the
block ids; every verified request is counted in ``pdctl:kv_verify_total{result}``.

Results: ``ok``; ``mismatch`` (a block's bytes differ, or the prefill wrote fewer or
other blocks than the decode awaits); ``missing`` (asked, but the prefill sent no digest:
a stock connector, or a layout the prefill does not digest); ``unsupported`` (a layout
this check does not cover, not asked). Covered: equal TP on both sides (one WRITE per
rank pair; every decode rank checks its own shard), equal block sizes, one KV cache
group, KV registered in place (no host staging buffer), a prefill without pipeline
parallelism. MLA at equal TP is covered (its latent pages are block-major like any
other).

Prefill TP > decode TP (``P_TP = k x D_TP``, ``P_TP`` at most the model's KV heads, not
MLA) is covered too: vLLM writes each of the ``k`` prefill ranks' whole block into its
head slice of the decode's block (:mod:`pdctl.connector.kvslice` has the arithmetic and
names vLLM's code). Each prefill rank digests its own pages and tags its notification
with its slice (``pdkv1|@<index>/<k>,<block>=<digest>,...|``); the decode keeps the
digests per slice, and once vLLM has counted all ``k`` notifications it digests each
slice of each destination block (the run of the page that rank wrote) and compares. A
slice that differs, a slice no notification vouched for, or a slice whose blocks are not
the ones awaited fails the receive like any mismatch.

Not yet covered: decode TP > prefill TP (a WRITE then carries part of a prefill block),
a prefill TP above the KV heads (several ranks write the same slice), MLA across TPs,
PP prefills (each stage writes some layers), host-buffer staging, hybrid/multi-group
caches. Lint rule PD048 names the uncovered layouts of a spec.

The decode checks on the engine thread, inside vLLM's transfer-results call (the one
place where vLLM lets a connector turn a finished receive into a failed one): the cost is
one read of the request's blocks per sampled request (see benchmarks/kv_verify.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pdctl.connector import kvdigest, kvslice
from pdctl.connector.failpoints import FAILPOINT_KV_CORRUPT, KvCorrupt

_log = logging.getLogger("vllm.pdctl.connector")

RATE = "pdctl_kv_verify_rate"
DEFAULT_RATE = 0.01
ASK_KEY = "pdctl_kv_verify"
"""Registration key: the decode asks the prefill for digests of this request's WRITE."""
OK = "ok"
MISMATCH = "mismatch"
MISSING = "missing"
UNSUPPORTED = "unsupported"
RESULTS = (OK, MISMATCH, MISSING, UNSUPPORTED)


def parse_rate(raw: object) -> float:
    try:
        rate = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError(
            f"kv_connector_extra_config.{RATE} = {raw!r}: use a share between 0 and 1 "
            f"(0 turns verification off; the default is {DEFAULT_RATE})"
        )
    return rate


def _single_group(ids: Any) -> list[int] | None:
    """The block ids of a one-group id list, None for several groups."""
    if ids and isinstance(ids[0], (list, tuple)):
        return [int(b) for b in ids[0]] if len(ids) == 1 else None
    return [int(b) for b in ids or ()]


class KvVerifier:
    """One worker's digest state: the prefill's WRITE side and the decode's check."""

    def __init__(self, worker: Any, cfg: Any, report: Callable[[str, str], None]) -> None:
        self.worker = worker
        self.rate = parse_rate(cfg.get_from_extra_config(RATE, DEFAULT_RATE))
        spec = str(cfg.get_from_extra_config(FAILPOINT_KV_CORRUPT, "") or "")
        self.corrupt = KvCorrupt.parse(spec) if spec else None
        if self.corrupt is not None:
            _log.warning("pdctl: failpoint %s = %r is on", FAILPOINT_KV_CORRUPT, spec)
        self.report = report
        """Counts one result of one request (telemetry; never raises)."""
        self.asked = False
        """P, writer thread: the WRITE being posted was asked for digests."""
        self._write = threading.local()
        self.expected: dict[str, dict[int, int] | None] = {}
        """D, engine thread: sampled request → the digests received so far (None: none)."""
        self.asked_ids: set[str] = set()
        """D: requests whose registration asked for digests (writer thread adds)."""
        self.slices_of: dict[str, int] = {}
        """D: asked requests whose prefill has a larger TP → head slices per block (k)."""
        self.sliced: dict[str, dict[tuple[int, int], dict[int, int]]] = {}
        """D, engine thread: sampled request → ``(index, k)`` → that slice's digests."""
        self._lock = threading.Lock()
        self.detected = 0
        self._spoiled: set[str] = set()
        """D, engine thread: received requests the ``zero`` failpoint already judged."""

    # ------------------------------------------------------------------ layouts

    def _slices(self, p_tp: int, d_tp: int) -> int | None:
        """Head slices per decode block of a transfer from a prefill at ``p_tp`` to a
        decode at ``d_tp``, as this worker sees it: 1 at equal TP, ``k`` for
        ``P_TP = k x D_TP``; None for a layout this check does not cover (see the
        module)."""
        w = self.worker
        if not (
            int(getattr(w, "pp_size", 1)) == 1
            and not getattr(w, "use_host_buffer", False)
            and not getattr(w, "_has_mamba", False)
            and int(getattr(w, "_physical_blocks_per_logical_kv_block", 1)) == 1
        ):
            return None
        if int(p_tp) == int(d_tp):
            return 1
        topo = getattr(w, "transfer_topo", None)
        heads = int(getattr(topo, "total_num_kv_heads", 0) or 0)
        if getattr(topo, "is_mla", False) or getattr(w, "use_mla", False):
            return None
        if not kvslice.covered(int(p_tp), int(d_tp), heads):
            return None
        k = int(p_tp) // int(d_tp)
        split = k if int(getattr(w, "world_size", 1)) == int(d_tp) else 1  # decode's pages
        caches = self._caches()
        # every page one contiguous run of elements (what _build_fa_remote addresses as
        # one block of one region); the decode's split in k (vLLM's head-major pages)
        if not caches or any(
            not c[0].is_contiguous() or c[0].numel() % split for c in caches.values()
        ):
            return None
        return k

    def _my_slice(self, dst_engine_id: str, d_tp: int) -> tuple[int, int] | None:
        """P: ``(index, k)`` of the head slice this rank writes in a decode at ``d_tp``;
        None when vLLM's own mapping for that decode says otherwise (logged)."""
        w = self.worker
        topo = w.transfer_topo
        mine = kvslice.head_slice(
            int(topo.tp_rank), int(w.world_size), int(d_tp), int(topo.total_num_kv_heads)
        )
        plan = (getattr(w, "tp_mappings", None) or {}).get(dst_engine_id)
        if mine is None:
            return None
        if plan is not None and (
            int(plan.rank_offset_factor) != mine.index
            or tuple(plan.all_source_ranks) != (mine.dst_rank,)
        ):
            _log.warning(
                "pdctl: vLLM maps this rank to decode rank(s) %s at offset %s, not %d at "
                "%d of %d: its WRITEs are not digested",
                tuple(plan.all_source_ranks),
                plan.rank_offset_factor,
                mine.dst_rank,
                mine.index,
                mine.parts,
            )
            return None
        return mine.index, mine.parts

    def _caches(self) -> dict[str, Any]:
        caches = getattr(self.worker, "device_kv_caches", None) or {}
        return {n: c for n, c in caches.items() if getattr(c, "ndim", 0) > 1}

    # ------------------------------------------------------------------ decode: ask

    def ask(self, req_id: str, reg_data: dict[str, Any], base_id: str = "") -> None:
        """D, writer thread: add the request to the sample (or not) before registering.
        The draw hashes ``base_id`` (vLLM's id without its random suffix:
        ``cmpl-<X-Request-Id>-0``), so it is the same on every rank and for a retry."""
        if self.rate <= 0 or not kvdigest.sampled(base_id or req_id, self.rate):
            return
        p_tp = int(reg_data.get("remote_tp_size") or 1)
        k = self._slices(p_tp, int(getattr(self.worker, "world_size", 1)))
        if k is None or int(reg_data.get("remote_pp_size") or 1) != 1:
            self.report(UNSUPPORTED, req_id)
            return
        reg_data[ASK_KEY] = 1
        with self._lock:
            self.asked_ids.add(req_id)
            if k > 1:
                self.slices_of[req_id] = k

    # ------------------------------------------------------------------ prefill: digest

    @contextlib.contextmanager
    def writing(self, request_id: str, dst_engine_id: str) -> Iterator[None]:
        """P, writer thread: one WRITE of ``request_id`` is being built and posted."""
        ok = self.asked
        part: tuple[int, int] | None = None
        if ok:
            try:
                topo = self.worker.transfer_topo
                info = topo.get_engine_info(dst_engine_id)
                d_tp = int(info.remote_tp_size)
                k = self._slices(int(getattr(self.worker, "world_size", 1)), d_tp)
                ok = (
                    k is not None
                    and topo.block_size_ratio(info.remote_block_size) == 1
                    and int(info.remote_physical_blocks_per_logical) == 1
                )
                if ok and k is not None and k > 1:  # this rank fills one head slice
                    part = self._my_slice(dst_engine_id, d_tp)
                    ok = part is not None
            except Exception:
                ok = False
        self._write.state = {"rid": request_id, "ok": ok, "pairs": None, "part": part}
        try:
            yield
        finally:
            self._write.state = None

    def written(self, remote: Any, local: Any) -> tuple[Any, Any]:
        """P: vLLM's final (destination, source) block ids of the WRITE being built;
        digests the source blocks and returns the ids to write (the corrupting
        failpoint may swap two destinations here)."""
        state = getattr(self._write, "state", None)
        if not state or not state["ok"]:
            return remote, local
        dst, src = _single_group(remote), _single_group(local)
        if dst is None or src is None or len(dst) != len(src):
            return remote, local
        digests = kvdigest.block_digests(self._caches(), src)
        state["pairs"] = list(zip(dst, digests, strict=True))
        if self.corrupt is not None and self.corrupt.swaps(state["rid"]) and len(dst) >= 2:
            _log.warning(
                "pdctl: failpoint %s: WRITE of %s sends block %d into %d and %d into %d",
                FAILPOINT_KV_CORRUPT,
                state["rid"],
                src[0],
                dst[1],
                src[1],
                dst[0],
            )
            swapped = [dst[1], dst[0], *dst[2:]]
            remote = [swapped] if remote and isinstance(remote[0], (list, tuple)) else swapped
        return remote, local

    def tag(self, make_prepped_xfer: Callable[..., Any]) -> Callable[..., Any]:
        """NIXL's ``make_prepped_xfer`` putting the digests in front of the WRITE's
        notification."""

        def tagged(*args: Any, **kw: Any) -> Any:
            state = getattr(self._write, "state", None)
            notif = kw.get("notif_msg")
            if state and state["pairs"] is not None and isinstance(notif, bytes):
                kw["notif_msg"] = kvdigest.encode(state["pairs"], notif, state["part"])
            return make_prepped_xfer(*args, **kw)

        return tagged

    # ------------------------------------------------------------------ decode: check

    def strip(self, notifs: Sequence[bytes]) -> list[bytes]:
        """D, engine thread: vLLM's notifications with the digests taken off (kept per
        request)."""
        out: list[bytes] = []
        for notif in notifs:
            tagged = kvdigest.parse(notif)
            if tagged is None:
                out.append(notif)
                continue
            digests, plain = tagged.digests, tagged.plain
            rid = plain.decode("utf-8", "replace").rpartition(":")[0]
            if tagged.part is not None:  # one prefill rank's head slice
                slices = self.sliced.setdefault(rid, {})
                slices[tagged.part] = {**slices.get(tagged.part, {}), **digests}
            else:
                have = self.expected.get(rid)
                self.expected[rid] = {**(have or {}), **digests} if digests or have else {}
            out.append(plain)
        return out

    def check(self, recving: dict[str, Any], metadata: dict[str, Any]) -> list[str]:
        """D, engine thread, after vLLM counted the notifications: verify every sampled
        request whose receive vLLM now considers done (``recving``: vLLM's
        ``_recving_transfers``). Returns the requests that failed the check."""
        with self._lock:
            asked = [r for r in self.asked_ids if r in recving or r not in metadata]
            self.asked_ids.difference_update(asked)
            slices = {r: self.slices_of.pop(r) for r in asked if r in self.slices_of}
        failed: list[str] = []
        for rid in asked:
            expected = self.expected.pop(rid, None)
            sliced = self.sliced.pop(rid, None)
            meta = metadata.get(rid)
            if meta is None:  # aborted or failed meanwhile
                continue
            if expected is None and sliced is None:
                self.report(MISSING, rid)
                continue
            if rid in slices:  # prefill TP > decode TP: every head slice
                bad = self._compare(rid, meta, sliced or {}, slices[rid])
            else:
                bad = self._compare(rid, meta, {(0, 1): expected or {}}, 1)
            if bad:
                failed.append(rid)
        for rid in [r for r in self.expected if r not in metadata]:
            del self.expected[rid]
        for rid in [r for r in self.sliced if r not in metadata]:
            del self.sliced[rid]
        return failed

    def spoil(self, recving: dict[str, Any], metadata: dict[str, Any]) -> None:
        """D, engine thread, before :meth:`check`: the ``zero`` failpoint zeroes the first
        block of each selected request whose receive is done, checked or not."""
        if self.corrupt is None or self.corrupt.mode != "zero":
            return
        for rid in recving:
            meta = metadata.get(rid)
            if rid in self._spoiled or meta is None:
                continue
            self._spoiled.add(rid)
            blocks = _single_group(getattr(meta, "local_physical_block_ids", None) or ())
            if blocks and self.corrupt.zeroes(rid):
                self._zero(blocks[0], rid)
        self._spoiled &= set(recving) | set(metadata)

    def _zero(self, block: int, rid: str) -> None:
        for cache in self._caches().values():
            cache[block].zero_()
        _log.warning("pdctl: failpoint %s: zeroed block %d of %s", FAILPOINT_KV_CORRUPT, block, rid)

    def _compare(
        self,
        rid: str,
        meta: Any,
        sliced: dict[tuple[int, int], dict[int, int]],
        k: int,
    ) -> bool:
        """D: the check of one request's destination blocks. ``k``: head slices per
        block (1 for a prefill at this TP; ``k`` when a prefill at ``k`` x this TP wrote
        them, one slice per prefill rank); ``sliced``: ``(index, parts)`` → that slice's
        digests (a notification that carried none, or digests of another shape, vouches
        for no slice). Only blocks the request awaits are read: a block id from the wire
        that is not one of them (or not a block at all) is *foreign*, never indexed."""
        awaited = _single_group(getattr(meta, "local_physical_block_ids", None) or ()) or []
        mine = set(awaited)
        blocks = sorted({b for d in sliced.values() for b in d} & mine)
        if self.corrupt is not None and self.corrupt.flips(rid) and blocks:
            self._flip(blocks[0])
        caches = self._caches()
        wrong: dict[int, list[int]] = {}
        unwritten: set[int] = set()
        foreign: set[int] = set()
        for (index, parts), digests in sorted(sliced.items()):
            if parts != k:
                continue  # a slice of another shape vouches for nothing (unvouched below)
            ids = sorted(set(digests) & mine)
            got = kvdigest.block_digests(caches, ids, part=(index, k) if k > 1 else None)
            for b, g in zip(ids, got, strict=True):
                if g != digests[b]:
                    wrong.setdefault(b, []).append(index)
            unwritten |= mine - set(digests)
            foreign |= set(digests) - mine
        unvouched = sorted(set(range(k)) - {i for i, n in sliced if n == k})
        if not (wrong or unwritten or foreign or unvouched):
            self.report(OK, rid)
            return False
        self.detected += 1
        self.report(MISMATCH, rid)
        differing = {b: wrong[b] for b in sorted(wrong)}
        slices = (
            f"; head slices of {k} per block (prefill TP {k}x this one): differing "
            f"{differing}, no digest for {unvouched}"
            if k > 1
            else ""
        )
        _log.error(
            "pdctl: KV of %s does not match what the prefill sent: blocks %s differ, %s "
            "not written, %s written but not awaited (of %d)%s; failing the receive "
            "(kv_load_failure_policy decides: recompute or error)",
            rid,
            sorted(wrong),
            sorted(unwritten),
            sorted(foreign),
            len(awaited),
            slices,
        )
        return True

    def _flip(self, block: int) -> None:
        """The corrupting failpoint on the decode: one byte of ``block`` as the WRITE
        delivered it is flipped before the check."""
        import torch

        for name in sorted(self._caches()):
            cache = self._caches()[name]
            page = cache[block]
            raw = page.reshape(-1).view(torch.uint8) if page.is_contiguous() else None
            if raw is not None and raw.numel():
                raw[raw.numel() // 2] ^= 0x5A
                _log.warning(
                    "pdctl: failpoint %s: flipped a byte of block %d (%s)",
                    FAILPOINT_KV_CORRUPT,
                    block,
                    name,
                )
                return
