"""The flight recorder: the connector's pure event book and ring, the ``/metrics`` round
trip, and the router-side join of a request's timeline into TTFT segments."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from pdctl.connector.flightbook import FlightBook, FlightRing
from pdctl.sdk.metrics import flight as fl
from pdctl.sdk.metrics.flight import InstanceRecord, flight_key, records_of, segment_stats
from pdctl.sdk.metrics.promtext import parse_text
from pdctl.sdk.router import flightrec as fr
from pdctl.sdk.router.timeline import Timeline

RID = "pdctl-" + "ab" * 16


def tl(mode: str = "push", stream: bool = True, **ms: float | None) -> Timeline:
    t = Timeline(id=RID, mode=mode, endpoint="/v1/completions", stream=stream, received=0.0, t0=0.0)
    for k, v in ms.items():
        setattr(t, k, None if v is None else v / 1000)
    return t


def rec(times: dict[str, float], **values: float) -> InstanceRecord:
    """A record from milliseconds since arrival."""
    return InstanceRecord(
        RID, {k: v / 1000 for k, v in times.items()}, {k: float(v) for k, v in values.items()}
    )


P_REG_FIRST = rec(
    {
        fl.ARRIVED: 0,
        fl.SCHEDULED: 2,
        fl.FINISHED: 20,
        fl.REG_ARRIVED: 10,
        fl.BLOCKS_READY: 30,
        fl.WRITE_POSTING: 31,
        fl.WRITE_POSTED: 31.5,
        fl.WRITE_DONE: 40,
    },
    xfer_seconds=0.005,
    bytes=49152,
    descriptors=2,
)
D_PUSH = rec(
    {
        fl.ARRIVED: 0,
        fl.ADMITTED: 4,
        fl.REG_SENT: 6,
        fl.NOTIFIED: 40,
        fl.RECEIVED: 44,
        fl.SCHEDULED: 47,
    }
)


def names(f: fr.Flight) -> list[str]:
    return [s.name for s in f.segments]


def assert_contiguous(f: fr.Flight) -> None:
    assert f.ttft_ms is not None
    assert f.segments[0].start_ms == 0
    for a, b in zip(f.segments, f.segments[1:], strict=False):
        assert a.end_ms == b.start_ms
        assert a.end_ms >= a.start_ms
    in_ttft = [s for s in f.segments if s.name != fr.STREAMING]
    assert abs(sum(s.ms for s in in_ttft) - f.ttft_ms) < 1e-6


# ---------------------------------------------------------------------- connector side


def test_flight_key_finds_the_router_id_inside_vllm_ids() -> None:
    assert flight_key(f"cmpl-{RID}-0-1a2b3c4d") == RID
    assert flight_key("cmpl-abc-0") == "cmpl-abc-0"


def test_book_keeps_first_times_last_for_notifications_and_is_bounded() -> None:
    b = FlightBook(capacity=2)
    b.mark(f"cmpl-{RID}-0", fl.SCHEDULED, 1.0)
    b.mark(f"cmpl-{RID}-0", fl.SCHEDULED, 2.0)  # every later step: ignored
    b.mark(RID, fl.NOTIFIED, 3.0)
    b.mark(RID, fl.NOTIFIED, 4.0)  # a second WRITE's notification: kept
    b.add(RID, fl.BYTES, 10)
    assert b.drain() == [
        [fl.KIND, RID, fl.SCHEDULED, 1.0],
        [fl.KIND, RID, fl.NOTIFIED, 3.0],
        [fl.KIND, RID, fl.NOTIFIED, 4.0],
        [fl.KIND, RID, fl.BYTES, 10.0],
    ]
    assert b.drain() == []
    for k in ("a", "b", "c"):
        b.mark(k, fl.SCHEDULED, 1.0)
    b.drain()
    b.mark(RID, fl.SCHEDULED, 9.0)  # forgotten (capacity 2): marked again
    assert b.drain() == [[fl.KIND, RID, fl.SCHEDULED, 9.0]]


def test_book_off_records_nothing_and_a_failing_hook_turns_it_off() -> None:
    off = FlightBook(capacity=0)
    off.mark(RID, fl.ARRIVED, 1.0)
    assert off.drain() == []
    b = FlightBook(capacity=4)

    def boom() -> None:
        raise RuntimeError("hook bug")

    b.guard(boom)  # does not raise into vLLM
    assert not b.on
    b.mark(RID, fl.ARRIVED, 1.0)
    assert b.drain() == []


def test_ring_publishes_offsets_from_arrival_and_round_trips_through_metrics_text() -> None:
    ring = FlightRing(capacity=8)
    ring.feed(
        [
            [fl.KIND, RID, fl.ARRIVED, 100.0],
            [fl.KIND, RID, fl.FINISHED, 100.25],
            [fl.KIND, RID, fl.XFER_S, 0.002],
            [fl.KIND, RID, fl.XFER_S, 0.003],  # two WRITE handles: summed
            ["c", "pdctl:push_matches", "", 1.0],  # a rendezvous event: not ours
            [fl.KIND, "pdctl-no-arrival", fl.FINISHED, 5.0],  # no zero yet: not published
        ]
    )
    reg = CollectorRegistry()
    reg.register(ring)
    samples, bad = parse_text(generate_latest(reg).decode(), (fl.SECONDS, fl.VALUE))
    assert not bad
    got = records_of(samples)
    assert list(got) == [RID]
    assert got[RID].times == {fl.ARRIVED: 0.0, fl.FINISHED: 0.25}
    assert got[RID].values[fl.XFER_S] == 0.005


def test_ring_forgets_the_oldest_requests() -> None:
    ring = FlightRing(capacity=3)
    for i in range(5):
        ring.feed([[fl.KIND, f"r{i}", fl.ARRIVED, float(i)]])
    assert [k for k, _, _ in ring.snapshot()] == ["r2", "r3", "r4"]


# ---------------------------------------------------------------------- join


def test_push_registration_first_is_itemized_and_write_is_nixl_time() -> None:
    t = tl(
        prefill_sent=0.1,
        decode_sent=0.2,
        prefill_done=25,
        decode_first_byte=60,
        done=80,
    )
    f = fr.join(t, P_REG_FIRST, D_PUSH)
    assert_contiguous(f)
    assert f.complete
    assert f.order == "registration-first"
    assert f.wait_ms == pytest.approx(20)  # the registration waited for the blocks
    assert names(f) == [
        fr.ROUTER,
        fr.PREFILL_QUEUE,
        fr.PREFILL,
        fr.HANDOFF,
        fr.WRITE,
        fr.NOTIFICATION,
        fr.PICKUP,
        fr.DECODE_SCHEDULE,
        fr.FIRST_TOKEN,
        fr.STREAMING,
    ]
    write = next(s for s in f.segments if s.name == fr.WRITE)
    assert abs(write.ms - 5.0) < 1e-9
    assert write.start_ms == pytest.approx(0.1 + 31)  # anchored at the router's prefill send
    pickup = next(s for s in f.segments if s.name == fr.PICKUP)
    assert abs(pickup.ms - 4.0) < 1e-9  # decode's own clock
    assert fr.wait_ms(f) == 0
    d = f.as_dict()
    assert d["push"]["bytes"] == 49152
    assert d["ttft_ms"] == pytest.approx(60)


def test_a_non_streamed_answer_ends_in_generation_not_first_token() -> None:
    """Unstreamed, the first byte is the whole answer: the last segment holds every
    decode step, and is named so."""
    t = tl(stream=False, prefill_sent=0.1, decode_sent=0.2, prefill_done=25, decode_first_byte=95)
    f = fr.join(t, P_REG_FIRST, D_PUSH)
    assert_contiguous(f)
    assert names(f)[-1] == fr.GENERATION
    assert fr.FIRST_TOKEN not in names(f)
    assert fr.GENERATION in fr.LEGEND


def test_sequential_prefill_first_wait_is_split_by_who_held_it() -> None:
    p = rec(
        {
            fl.ARRIVED: 0,
            fl.SCHEDULED: 1,
            fl.FINISHED: 20,
            fl.BLOCKS_READY: 22,
            fl.REG_ARRIVED: 45,
            fl.WRITE_POSTING: 46,
        },
        xfer_seconds=0.004,
    )
    t = tl(
        "push-sequential", prefill_sent=0.1, prefill_done=24, decode_sent=25, decode_first_byte=90
    )
    f = fr.join(t, p, D_PUSH)
    assert_contiguous(f)
    assert f.order == "prefill-first"
    assert f.wait_ms == pytest.approx(23)
    assert names(f)[3:7] == [
        fr.PREFILL_ANSWER,
        fr.ROUTER_TO_DECODE,
        fr.DECODE_ADMISSION,
        fr.REGISTRATION,
    ]
    assert abs(fr.wait_ms(f) - (45.1 - 20.1)) < 1e-9


def test_stock_connector_and_pull_name_what_they_hold_and_never_say_transfer() -> None:
    stock = fr.join(
        tl(prefill_sent=0, decode_sent=0, prefill_done=20, decode_first_byte=70), None, None
    )
    assert_contiguous(stock)
    assert names(stock) == [fr.ROUTER, fr.PREFILL_LEG, fr.DECODE_INCL_WAIT]
    assert not stock.complete  # a record may still come
    pull = fr.join(
        tl("pull", prefill_sent=0, prefill_done=20, decode_sent=21, decode_first_byte=70),
        None,
        None,
    )
    assert names(pull) == [fr.ROUTER, fr.PREFILL_LEG, fr.ROUTER_TO_DECODE, fr.DECODE_INCL_READ]
    colo = fr.join(tl("colocated", decode_sent=0.1, decode_first_byte=30), None, None)
    assert names(colo) == [fr.ROUTER, fr.DECODE]
    for f in (stock, pull, colo):
        assert all("transfer" not in s.name.lower() for s in f.segments)
    assert all("transfer" not in k.lower() for k in fr.LEGEND)
    unsettled = fr.join(tl(prefill_sent=0), None, None)
    assert unsettled.segments == []
    assert unsettled.ttft_ms is None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(fl.TIMES), st.floats(0, 500), max_size=len(fl.TIMES)),
    st.dictionaries(st.sampled_from(fl.TIMES), st.floats(0, 500), max_size=len(fl.TIMES)),
    st.floats(0, 5),
    st.floats(0, 5),
    st.floats(0.01, 1000),
    st.sampled_from(["push", "push-sequential"]),
    st.one_of(st.none(), st.floats(0, 0.2)),
)
def test_segments_are_contiguous_and_sum_to_ttft_whatever_the_clocks_say(
    p: dict[str, float],
    d: dict[str, float],
    ps: float,
    ds: float,
    fb: float,
    mode: str,
    xfer: float | None,
) -> None:
    values = {} if xfer is None else {fl.XFER_S: xfer}
    f = fr.join(
        tl(mode, prefill_sent=ps, decode_sent=ds, prefill_done=min(fb, 20), decode_first_byte=fb),
        rec(p, **values),
        rec(d),
    )
    assert_contiguous(f)
    assert all(s.end_ms <= fb + 1e-9 for s in f.segments)


# ---------------------------------------------------------------------- fill


class _Resp:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self._body = status, body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class _Pool:
    def __init__(self, text: str | None) -> None:
        self.text = text
        self.calls = 0

    async def request(self, method: str, path: str, **_: Any) -> _Resp:
        self.calls += 1
        assert (method, path) == ("GET", "/metrics")
        if self.text is None:
            raise OSError("down")
        return _Resp(200, self.text.encode())


class _Up:
    def __init__(self, name: str, text: str | None) -> None:
        self.name, self.pool = name, _Pool(text)


def _metrics(r: InstanceRecord) -> str:
    lines = [
        f'{fl.SECONDS}{{event="{e}",request_id="{r.request_id}"}} {v}' for e, v in r.times.items()
    ]
    lines += [
        f'{fl.VALUE}{{field="{k}",request_id="{r.request_id}"}} {v}' for k, v in r.values.items()
    ]
    return "\n".join(lines) + "\n"


def test_fill_reads_each_instance_once_and_freezes_complete_flights() -> None:
    p, d = _Up("p0", _metrics(P_REG_FIRST)), _Up("d0", _metrics(D_PUSH))
    rec_ = fr.FlightRecorder([p, d])
    t = tl(prefill_sent=0.1, decode_sent=0.2, prefill_done=25, decode_first_byte=60, done=80)
    t.prefill, t.decode = "p0", "d0"
    running = tl(prefill_sent=0.1)  # not settled: not joined
    asyncio.run(rec_.fill([t, running], now_s=1.0))
    assert t.flight_final
    assert fr.WRITE in names(t.flight)
    assert running.flight is None
    asyncio.run(rec_.fill([t], now_s=2.0))
    assert (p.pool.calls, d.pool.calls) == (1, 1)  # final: never read again
    assert t.as_dict()["segments"][0]["name"] == fr.ROUTER


def test_fill_keeps_trying_until_records_come_then_gives_up() -> None:
    p, d = _Up("p0", None), _Up("d0", "")
    rec_ = fr.FlightRecorder([p, d])
    t = tl(prefill_sent=0, decode_sent=0, prefill_done=20, decode_first_byte=60, done=70)
    t.prefill, t.decode = "p0", "d0"
    asyncio.run(rec_.fill([t], now_s=1.0))
    assert not t.flight_final
    assert names(t.flight)[-1] == fr.STREAMING
    asyncio.run(rec_.fill([t], now_s=0.07 + fr.FREEZE_AFTER_S + 1))
    assert t.flight_final
    assert fr.DECODE_INCL_WAIT in names(t.flight)


def test_segment_stats_per_pair_count_a_missing_segment_as_zero() -> None:
    def entry(ttft: float, write: float | None) -> dict[str, object]:
        segs = [{"name": fr.PREFILL, "start_ms": 0.0, "end_ms": ttft - (write or 0.0)}]
        if write is not None:
            segs.append({"name": fr.WRITE, "start_ms": ttft - write, "end_ms": ttft})
        return {"ttft_ms": ttft, "segments": segs}

    stats = segment_stats(
        [entry(10, 2), entry(20, 4), entry(30, None), {"ttft_ms": None, "segments": []}]
    )
    assert stats["ttft"] == {"p50_ms": 20.0, "p99_ms": 30.0, "requests": 3.0}
    assert stats[fr.WRITE]["p50_ms"] == 2.0  # 0, 2, 4
    assert stats[fr.PREFILL]["p99_ms"] == 30.0


def test_write_keeps_nixls_duration_when_the_anchors_disagree() -> None:
    p = rec(
        {fl.FINISHED: 20, fl.BLOCKS_READY: 21, fl.REG_ARRIVED: 30, fl.WRITE_POSTING: 31},
        xfer_seconds=0.004,
    )
    # decode's clock places its registration after prefill started posting (anchor error)
    d = rec({fl.REG_SENT: 40, fl.NOTIFIED: 45, fl.RECEIVED: 46})
    t = tl("push-sequential", prefill_sent=0, prefill_done=22, decode_sent=0, decode_first_byte=80)
    f = fr.join(t, p, d)
    assert_contiguous(f)
    write = next(s for s in f.segments if s.name == fr.WRITE)
    assert write.ms == pytest.approx(4.0)


def test_flight_says_whether_the_decode_verified_the_kv() -> None:
    t = tl(prefill_sent=0.1, decode_sent=0.2, prefill_done=25, decode_first_byte=60, done=80)
    assert fr.join(t, P_REG_FIRST, D_PUSH).as_dict()["push"]["verified"] is None  # not sampled
    ok = rec({}, kv_verified=1)
    ok.times.update(D_PUSH.times)
    assert fr.join(t, P_REG_FIRST, ok).as_dict()["push"]["verified"] is True
    bad = rec({}, kv_mismatch=1)
    bad.times.update(D_PUSH.times)
    assert fr.join(t, P_REG_FIRST, bad).verified is False
