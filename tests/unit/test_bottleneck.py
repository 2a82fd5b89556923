"""The per-pair bottleneck verdict from flight-recorder segments: each injected kind is
named with its numbers and advice; too little data, errors and garbage are handled."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pdctl.sdk.router import flightrec as fr
from pdctl.sdk.router.bottleneck import GROUPS, MIN_REQUESTS, matrix, verdict, verdicts


def request(
    spans: list[tuple[str, float]],
    *,
    p: str = "prefill-0",
    d: str = "decode-0",
    outcome: str = "ok",
    push: dict[str, Any] | None = None,
    streaming: float = 50.0,
) -> dict[str, Any]:
    """A /v1/pdctl/requests entry whose segments are ``spans`` back to back."""
    segs, at = [], 0.0
    for name, ms in spans:
        segs.append({"name": name, "start_ms": at, "end_ms": at + ms, "source": "x"})
        at += ms
    ttft = at
    segs.append({"name": fr.STREAMING, "start_ms": at, "end_ms": at + streaming, "source": "r"})
    return {"prefill": p, "decode": d, "outcome": outcome, "ttft_ms": ttft, "segments": segs,
            "push": push or {}}  # fmt: skip


def push_path(
    queue: float, prefill: float, wait: float, write: float, sched: float
) -> list[tuple[str, float]]:
    return [
        (fr.ROUTER, 1.0),
        (fr.PREFILL_QUEUE, queue),
        (fr.PREFILL, prefill),
        (fr.WAIT_REGISTRATION, wait),
        (fr.HANDOFF, 0.5),
        (fr.WRITE, write),
        (fr.NOTIFICATION, 0.3),
        (fr.PICKUP, 0.5),
        (fr.DECODE_SCHEDULE, sched),
        (fr.FIRST_TOKEN, 3.0),
    ]


def noisy(rng: random.Random, base: float) -> float:
    return base * rng.uniform(0.7, 1.3)


def fleet(kind: str, n: int, seed: int) -> list[dict[str, Any]]:
    """Requests of a pair with one bottleneck injected, with noise."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        q, pf, w, wr, sc = 1.0, 15.0, 0.0, 2.0, 2.0
        if kind == "prefill":
            q = noisy(rng, 120.0)
        elif kind == "decode":
            w, sc = noisy(rng, 60.0), noisy(rng, 40.0)
        elif kind == "transfer":
            wr = noisy(rng, 150.0)
        spans = push_path(noisy(rng, q), noisy(rng, pf), w, noisy(rng, wr), noisy(rng, sc))
        nbytes = 4 * 1024 * 1024
        out.append(request(spans, push={"bytes": nbytes, "write_ms": spans[5][1]}))
    return out


@pytest.mark.parametrize(
    ("kind", "segment"),
    [("prefill", fr.PREFILL_QUEUE), ("decode", fr.WAIT_REGISTRATION), ("transfer", fr.WRITE)],
)
def test_each_injected_bottleneck_is_named_in_every_noisy_trial(kind: str, segment: str):
    for seed in range(20):
        v = verdict("prefill-0", "decode-0", fleet(kind, 12, seed), expected_bps=12e9)
        assert v.bottleneck == kind, (seed, v)
        assert v.segment == segment
        assert v.share is not None
        assert 0.4 < v.share <= 1.0
        assert v.headline.startswith(f"{segment} {v.share:.0%}: ")


def test_the_numbers_behind_it():
    v = verdict("p", "d", fleet("transfer", 9, 1), expected_bps=12e9)
    assert set(v.shares) == {"router", "prefill", "decode", "transfer"}
    assert v.shares["transfer"] == v.share
    assert v.ttft_p50_ms is not None
    assert v.transfer_bps is not None
    assert v.transfer_bps < 0.1e9  # 4 MiB in ~150 ms
    assert "against 12 GB/s expected: run preflight" in v.advice
    healthy = verdict("p", "d", fleet("transfer", 9, 1), expected_bps=0.02e9)
    assert "run preflight" not in healthy.advice.split(":")[0]
    assert healthy.bottleneck == "transfer"
    d = v.as_dict()
    assert d["bottleneck"] == "transfer"
    assert d["shares"]["transfer"] == v.share


def test_advice_names_the_fix():
    assert "add prefill" in verdict("p", "d", fleet("prefill", 6, 0)).advice
    dec = verdict("p", "d", fleet("decode", 6, 0)).advice
    assert "add decode" in dec
    assert "max_num_seqs" in dec


def test_a_non_streamed_answer_is_called_generation_not_a_decode_bottleneck():
    rs = [request([(fr.ROUTER, 1), (fr.PREFILL, 10), (fr.GENERATION, 90)]) for _ in range(5)]
    v = verdict("p", "d", rs)
    assert v.bottleneck == "generation"
    assert "stream" in v.advice


def test_too_few_requests_and_errors():
    rs = [
        *fleet("prefill", MIN_REQUESTS - 1, 0),
        {"prefill": "p", "decode": "d", "outcome": "error", "error": "boom"},
        {"prefill": "p", "decode": "d", "outcome": "running"},
    ]
    v = verdict("p", "d", rs)
    assert v.bottleneck is None
    assert v.share is None
    assert "too few" in v.advice
    assert (v.requests, v.errors) == (MIN_REQUESTS, 1)  # the running one is not counted
    assert v.error_rate == pytest.approx(1 / v.requests)
    assert v.headline == v.advice


@pytest.mark.parametrize(
    "junk",
    [
        {"outcome": "ok", "ttft_ms": "x", "segments": []},
        {"outcome": "ok", "ttft_ms": 0, "segments": [{"name": fr.PREFILL}]},
        {"outcome": "ok", "ttft_ms": 5.0, "segments": "nope"},
        {
            "outcome": "ok",
            "ttft_ms": 5.0,
            "segments": [1, {"name": 3}, {"name": "??", "start_ms": 0, "end_ms": 1}],
        },
        {"outcome": "ok", "ttft_ms": 5.0, "segments": [], "push": {"bytes": True, "write_ms": 0}},
    ],
)
def test_garbage_is_skipped_never_raises(junk: dict[str, Any]):
    v = verdict("p", "d", [junk] * 5 + fleet("decode", 4, 2))
    assert v.bottleneck == "decode"
    assert v.requests == 9


def test_every_ttft_segment_has_a_group():
    ttft_segments = set(fr.LEGEND) - {fr.STREAMING}
    assert ttft_segments <= set(GROUPS)


def test_pairs_and_the_matrix():
    rs = (
        fleet("prefill", 5, 0)
        + [dict(r, decode="decode-1") for r in fleet("transfer", 5, 1)]
        + [dict(r, prefill="prefill-1") for r in fleet("decode", 5, 2)]
        + [{"prefill": None, "decode": "decode-0", "outcome": "ok"}]
    )
    vs = verdicts(rs, expected_bps=12e9)
    got = {(v.prefill, v.decode): v.bottleneck for v in vs}
    assert got == {
        ("prefill-0", "decode-0"): "prefill",
        ("prefill-0", "decode-1"): "transfer",
        ("prefill-1", "decode-0"): "decode",
    }
    rows, cols, cells = matrix(vs)
    assert rows == ["prefill-0", "prefill-1"]
    assert cols == ["decode-0", "decode-1"]
    assert ("prefill-1", "decode-1") not in cells
