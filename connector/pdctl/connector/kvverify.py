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
other). Not yet covered: heterogeneous TP (a WRITE then carries part of each block),
PP prefills (each stage writes some layers), host-buffer staging, hybrid/multi-group
caches. Lint rule PD044 names the uncovered layouts of a spec.

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

from pdctl.connector import kvdigest
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
        self._lock = threading.Lock()
        self.detected = 0
        self._spoiled: set[str] = set()
        """D, engine thread: received requests the ``zero`` failpoint already judged."""

    # ------------------------------------------------------------------ layouts

    def _covered(self, remote_tp: int) -> bool:
        """Whether this worker's side of a transfer with a peer at ``remote_tp`` is one
        this check covers (see the module)."""
        w = self.worker
        return (
            int(remote_tp) == int(getattr(w, "world_size", 1))
            and int(getattr(w, "pp_size", 1)) == 1
            and not getattr(w, "use_host_buffer", False)
            and not getattr(w, "_has_mamba", False)
            and int(getattr(w, "_physical_blocks_per_logical_kv_block", 1)) == 1
        )

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
        if (
            not self._covered(int(reg_data.get("remote_tp_size") or 1))
            or int(reg_data.get("remote_pp_size") or 1) != 1
        ):
            self.report(UNSUPPORTED, req_id)
            return
        reg_data[ASK_KEY] = 1
        with self._lock:
            self.asked_ids.add(req_id)

    # ------------------------------------------------------------------ prefill: digest

    @contextlib.contextmanager
    def writing(self, request_id: str, dst_engine_id: str) -> Iterator[None]:
        """P, writer thread: one WRITE of ``request_id`` is being built and posted."""
        ok = self.asked
        if ok:
            try:
                topo = self.worker.transfer_topo
                info = topo.get_engine_info(dst_engine_id)
                ok = (
                    self._covered(info.remote_tp_size)
                    and topo.block_size_ratio(info.remote_block_size) == 1
                    and int(info.remote_physical_blocks_per_logical) == 1
                )
            except Exception:
                ok = False
        self._write.state = {"rid": request_id, "ok": ok, "pairs": None}
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
                kw["notif_msg"] = kvdigest.encode(state["pairs"], notif)
            return make_prepped_xfer(*args, **kw)

        return tagged

    # ------------------------------------------------------------------ decode: check

    def strip(self, notifs: Sequence[bytes]) -> list[bytes]:
        """D, engine thread: vLLM's notifications with the digests taken off (kept per
        request)."""
        out: list[bytes] = []
        for notif in notifs:
            parsed = kvdigest.decode(notif)
            if parsed is None:
                out.append(notif)
                continue
            digests, plain = parsed
            rid = plain.decode("utf-8", "replace").rpartition(":")[0]
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
        failed: list[str] = []
        for rid in asked:
            expected = self.expected.pop(rid, None)
            meta = metadata.get(rid)
            if meta is None:  # aborted or failed meanwhile
                continue
            if expected is None:
                self.report(MISSING, rid)
                continue
            bad = self._compare(rid, meta, expected)
            if bad:
                failed.append(rid)
        for rid in [r for r in self.expected if r not in metadata]:
            del self.expected[rid]
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

    def _compare(self, rid: str, meta: Any, expected: dict[int, int]) -> bool:
        awaited = _single_group(getattr(meta, "local_physical_block_ids", None) or ())
        if awaited is None:
            awaited = []
        if self.corrupt is not None and self.corrupt.flips(rid) and expected:
            self._flip(min(expected))
        caches = self._caches()
        ids = sorted(expected)
        got = dict(zip(ids, kvdigest.block_digests(caches, ids), strict=True))
        wrong = [b for b in ids if got[b] != expected[b]]
        unwritten = sorted(set(awaited) - set(expected))
        foreign = sorted(set(expected) - set(awaited))
        if not (wrong or unwritten or foreign):
            self.report(OK, rid)
            return False
        self.detected += 1
        self.report(MISMATCH, rid)
        _log.error(
            "pdctl: KV of %s does not match what the prefill sent: blocks %s differ, %s "
            "not written, %s written but not awaited (of %d); failing the receive "
            "(kv_load_failure_policy decides: recompute or error)",
            rid,
            wrong,
            unwritten,
            foreign,
            len(awaited),
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
