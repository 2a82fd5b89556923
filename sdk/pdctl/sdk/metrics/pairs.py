"""The router's recent requests grouped per prefill/decode pair (the TTFT split's rows)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdctl.sdk.metrics.derive import Scrape, counter_delta
from pdctl.sdk.metrics.flight import segment_stats
from pdctl.sdk.metrics.series import CANARY
from pdctl.sdk.metrics.snapshot import PairMetrics

Pair = tuple[str, str]


def canary_of(scrape: Scrape) -> dict[Pair, dict[str, float]]:
    """The canary's results per (prefill, decode) in one router scrape (every pair the
    router exports, at 0 included)."""
    out: dict[Pair, dict[str, float]] = {}
    for s in scrape.by_name.get(CANARY, ()):
        p, d, res = s.label("prefill"), s.label("decode"), s.label("result")
        if p and d and res:
            out.setdefault((p, d), {})[res] = s.value
    return out


def canary_window(new: Scrape, old: Scrape | None, result: str) -> dict[Pair, float]:
    """Per pair, how many ``result`` canary results the router counted between two of
    its scrapes (a router restart counts from 0); empty with one scrape."""
    if old is None:
        return {}
    before = canary_of(old)
    return {
        pair: counter_delta(got.get(result, 0.0), before.get(pair, {}).get(result)) or 0.0
        for pair, got in canary_of(new).items()
    }


def pairs_of(
    recent: Iterable[dict[str, Any]],
    cutoff: float,
    canary: dict[tuple[str, str], dict[str, float]] | None = None,
) -> tuple[PairMetrics, ...]:
    """Per (prefill, decode): the requests received since ``cutoff`` (Unix time; the
    window the other figures come from: with Prometheus it ends when it was evaluated),
    and ``canary``, the router's canary results per pair since it started (a pair with
    some and no request in the window is listed too)."""
    canary = canary or {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in recent:
        if r.get("prefill") and r.get("decode") and (r.get("received") or 0) >= cutoff:
            groups.setdefault((r["prefill"], r["decode"]), []).append(r)
    for pair in canary:
        groups.setdefault(pair, [])
    out = []
    for (p, d), rs in sorted(groups.items()):
        ttft = sorted(
            r["decode_first_byte_ms"]
            for r in rs
            if r.get("outcome") == "ok" and r.get("decode_first_byte_ms") is not None
        )
        ovl = sorted(
            max(0.0, r["prefill_done_ms"] - r["decode_sent_ms"])
            for r in rs
            if r.get("prefill_done_ms") is not None and r.get("decode_sent_ms") is not None
        )
        out.append(
            PairMetrics(
                p,
                d,
                len(rs),
                sum(r.get("outcome") == "ok" for r in rs),
                sum(r.get("outcome") == "error" for r in rs),
                ttft[len(ttft) // 2] if ttft else None,
                ovl[len(ovl) // 2] if ovl else None,
                segment_stats(r for r in rs if r.get("outcome") == "ok"),
                *_pushed(rs),
                canary.get((p, d), {}),
            )
        )
    return tuple(out)


def _pushed(rs: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """How many of a pair's requests pushed KV, and the digest check's word on them
    (their flights' ``push.bytes`` and ``push.verified``); ``{}`` when no flight
    measured a push."""
    told = [p for r in rs if isinstance(p := r.get("push"), dict) and p.get("bytes") is not None]
    if not told:  # no flight measured a push (no flight series): unknown, not none
        return 0, {}
    pushes = [p for p in told if p["bytes"]]
    verify = {"ok": 0, "mismatch": 0, "unsampled": 0}
    for p in pushes:
        v = p.get("verified")
        verify["ok" if v is True else "mismatch" if v is False else "unsampled"] += 1
    return len(pushes), verify
