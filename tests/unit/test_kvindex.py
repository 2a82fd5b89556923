"""The prefix index: block hashes against vLLM's own hashing, the per-instance index and
its states, cache-aware selection, and the KV event subscriber over real ZMQ sockets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pdctl.sdk.kvindex import BlockHasher, CacheIndex, event_key
from pdctl.sdk.kvindex.index import InstanceIndex
from pdctl.sdk.router.httpclient import Pools
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies.cache_aware import CacheAwarePolicy
from pdctl.sdk.router.replies import RouteError
from tests import extras

PROMPT = [(i * 7919) % 32000 for i in range(1000)]


# ---------------------------------------------------------------- hashing vs vLLM


@pytest.fixture
def vllm_hashing(monkeypatch: pytest.MonkeyPatch):
    kcu = extras.internal("vllm.v1.core.kv_cache_utils")
    hashing = extras.internal("vllm.utils.hashing")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def chain(algo: str, tokens: list[int], bs: int) -> list[bytes]:
        fn = hashing.get_hash_fn_by_name(algo)
        kcu.init_none_hash(fn)
        out: list[bytes] = []
        parent = None
        for i in range(len(tokens) // bs):
            parent = kcu.hash_block_tokens(fn, parent, tokens[i * bs : (i + 1) * bs], None)
            out.append(parent)
        return out

    return kcu, chain


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("bs", [16, 32, 128])
def test_digests_match_vllm(vllm_hashing, algo: str, bs: int):
    _, chain = vllm_hashing
    theirs = chain(algo, PROMPT, bs)
    ours = BlockHasher(bs, algo).digests(PROMPT)
    assert ours == theirs
    assert len(ours) == len(PROMPT) // bs


def test_seeded_digests_match_vllm(vllm_hashing, monkeypatch: pytest.MonkeyPatch):
    _, chain = vllm_hashing
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    assert BlockHasher(32, "sha256", "1234").digests(PROMPT) == chain("sha256", PROMPT, 32)
    assert BlockHasher(32, "sha256", None).digests(PROMPT) != chain("sha256", PROMPT, 32)


def test_event_keys_match_vllm_int_hashes(vllm_hashing, monkeypatch: pytest.MonkeyPatch):
    kcu, chain = vllm_hashing
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    published = [kcu.maybe_convert_block_hash(h) for h in chain("sha256", PROMPT, 32)]
    assert all(isinstance(p, int) for p in published)
    assert BlockHasher(32).keys(PROMPT) == published
    # the raw-digest form of the events maps to the same keys
    assert [event_key(h) for h in chain("sha256", PROMPT, 32)] == published


def test_hasher_only_full_blocks_and_prefix_property():
    h = BlockHasher(32)
    assert h.keys(PROMPT[:31]) == []
    a, b = h.keys(PROMPT[:100]), h.keys(PROMPT[:64] + [1, 2, 3] * 20)
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert h.first_key(PROMPT[:32]) == a[0]
    assert h.keys(PROMPT, limit=3) == h.keys(PROMPT)[:3]


def test_hasher_refuses_what_it_cannot_reproduce():
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        BlockHasher(32, "xxhash")
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        BlockHasher(32, "md5")
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher(0)


# ---------------------------------------------------------------- index


def clock(start: float = 100.0) -> tuple[list[float], Callable[[], float]]:
    now = [start]
    return now, lambda: now[0]


def test_exact_overlap_is_the_leading_run():
    idx = InstanceIndex("p", state="EXACT", speculative_s=0.0)
    idx.store([1, 2, 3, 5])
    assert idx.overlap([1, 2, 3, 4, 5], 0.0) == 3
    assert idx.overlap([2, 3], 0.0) == 2
    assert idx.overlap([9, 1], 0.0) == 0
    idx.remove([2])
    assert idx.overlap([1, 2, 3], 0.0) == 1
    idx.clear()
    assert idx.overlap([1], 0.0) == 0
    assert (idx.stored, idx.removed, idx.cleared) == (4, 1, 1)


def test_states_decide_what_routed_history_counts():
    now, c = clock()
    ci = CacheIndex(["p0", "p1"], speculative_s=2.0, clock=c)
    ci.routed("p0", [1, 2, 3], 0)
    # FALLBACK: the routing history is the whole view, however old
    now[0] += 1000
    assert ci.overlaps(["p0", "p1"], [1, 2, 3, 4]) == {"p0": 3, "p1": 0}
    # EXACT: only history younger than speculative_s counts next to the events
    ci["p0"].set_state("EXACT", "events flowing")
    assert ci.overlaps(["p0"], [1, 2, 3]) == {"p0": 0}
    ci.routed("p0", [1, 2], 0)
    assert ci.overlaps(["p0"], [1, 2, 3]) == {"p0": 2}
    ci["p0"].store([3])
    assert ci.overlaps(["p0"], [1, 2, 3]) == {"p0": 3}
    now[0] += 3
    assert ci.overlaps(["p0"], [1, 2, 3]) == {"p0": 0}  # block 1 was never stored
    # DEGRADED: events plus all history
    ci["p0"].set_state("DEGRADED", "lagging")
    assert ci.overlaps(["p0"], [1, 2, 3]) == {"p0": 3}


def test_routed_history_is_bounded_lru():
    _, c = clock()
    ci = CacheIndex(["p"], routed_capacity=3, clock=c)
    ci.routed("p", [1, 2, 3], 0)
    ci.routed("p", [4], 0)
    assert list(ci["p"].routed) == [2, 3, 4]
    ci.routed("p", [2], 1)
    assert list(ci["p"].routed) == [3, 4, 2]


def test_hit_tally_and_summary():
    _, c = clock()
    ci = CacheIndex(["p0", "p1"], clock=c)
    assert ci.hit_rate("p0") is None
    ci.routed("p0", [1, 2, 3, 4], 0)
    ci.routed("p0", [1, 2, 3, 4], 4)
    assert ci.hit_rate("p0") == 0.5
    s = ci.summary()
    assert s["p0"]["state"] == "FALLBACK"
    assert s["p0"]["predicted_hit_rate"] == 0.5
    assert s["p1"]["predicted_hit_rate"] is None


def test_set_state_reports_changes_only():
    idx = InstanceIndex("p")
    assert idx.set_state("EXACT", "a") is True
    assert idx.set_state("EXACT", "b") is False
    assert idx.reason == "b"


# ---------------------------------------------------------------- selection


def ups(*loads: int) -> list[Upstream]:
    pools = Pools()
    out = []
    for i, n in enumerate(loads):
        u = Upstream(f"p{i}", "prefill", f"http://127.0.0.1:{9000 + i}", pools.get("http://x"))
        u.outstanding = n
        out.append(u)
    return out


def test_cache_aware_takes_the_best_score_ties_by_load():
    pool = ups(3, 0, 0)
    policy = CacheAwarePolicy(itertools.count())
    assert policy.choose(pool, scores={"p0": 0.9, "p1": 0.1, "p2": 0.1}).name == "p0"
    pool[2].outstanding = 1
    assert policy.choose(pool, scores={"p0": 0.0, "p1": 0.5, "p2": 0.5}).name == "p1"
    # no scores (no token ids): least loaded
    assert policy.choose(pool).name == "p1"
    # the best one is excluded or unhealthy: the next best
    assert policy.choose(pool, (pool[0],), {"p0": 1, "p1": 0, "p2": 0.5}).name == "p2"
    pool[2].healthy = False
    assert policy.choose(pool, (pool[0],), {"p0": 1, "p1": 0, "p2": 0.5}).name == "p1"
    with pytest.raises(RouteError):
        policy.choose(pool, (pool[0], pool[1]), {"p0": 1})


# ---------------------------------------------------------------- subscriber


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return int(port)
    raise RuntimeError("no free port pair")


async def until(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


@pytest.fixture
async def fake_pub():
    extras.require("zmq", "msgspec")
    from tests.fakes.kvpub import FakePublisher

    pub = FakePublisher(free_port_pair())
    pub.start()
    yield pub
    await pub.stop()


@contextlib.asynccontextmanager
async def following(pub, idx: InstanceIndex, **kw: Any) -> AsyncIterator[tuple[Any, list[str]]]:
    """A subscriber on ``pub`` for ``idx``, started and synced (EXACT); (it, its states)."""
    from pdctl.sdk.kvindex.subscriber import EventSubscriber

    states: list[str] = []
    sub = EventSubscriber(
        idx,
        "127.0.0.1",
        pub.port,
        replay_after_s=0.1,
        replay_timeout_s=0.3,
        on_state=lambda i, s: states.append(s),
        **kw,
    )
    sub.start()
    try:
        await until(lambda: idx.state == "EXACT")
        yield sub, states
    finally:
        await sub.stop()


async def test_subscriber_replays_history_then_follows_live(fake_pub):
    from tests.fakes.kvpub import removed, stored

    h = BlockHasher(4)
    toks = list(range(12))
    keys = h.keys(toks)
    await fake_pub.publish([stored(keys[:2], toks[:8], 4)])  # before the router came up
    idx = InstanceIndex("p0")
    async with following(fake_pub, idx, check=h.first_key) as (sub, states):
        assert idx.exact == set(keys[:2])
        await until(lambda: sub.batches == 1)
        await fake_pub.publish([stored(keys[2:], toks[8:], 4, parent=keys[1])])
        await until(lambda: keys[2] in idx.exact)
        await fake_pub.publish([removed([keys[0]])])
        await until(lambda: keys[0] not in idx.exact)
        assert idx.hash_mismatches == 0
        assert states[:2] == ["DEGRADED", "EXACT"]


async def test_subscriber_fills_a_gap_from_the_replay_socket(fake_pub):
    from tests.fakes.kvpub import stored

    idx = InstanceIndex("p0")
    async with following(fake_pub, idx) as (sub, _):
        await fake_pub.publish([stored([1], [0] * 4, 4)])
        await until(lambda: 1 in idx.exact)
        await fake_pub.publish([stored([2], [0] * 4, 4, parent=1)], drop=True)  # lost live
        await fake_pub.publish([stored([3], [0] * 4, 4, parent=2)])
        await until(lambda: 3 in idx.exact)
        assert 2 in idx.exact  # recovered from the replay
        assert sub.gaps >= 1
        assert idx.state == "EXACT"


async def test_subscriber_degrades_when_the_publisher_goes_and_recovers(fake_pub):
    from tests.fakes.kvpub import CLEARED, stored

    idx = InstanceIndex("p0")
    async with following(fake_pub, idx) as (_, states):
        await fake_pub.publish([stored([7], [0] * 4, 4)])
        await until(lambda: 7 in idx.exact)
        fake_pub.replay_answers = False  # the stream is dead: nothing answers
        await until(lambda: idx.state == "DEGRADED")
        assert "did not answer" in idx.reason
        fake_pub.replay_answers = True
        await until(lambda: idx.state == "EXACT")
        await fake_pub.publish([CLEARED])
        await until(lambda: not idx.exact)
        assert states.count("DEGRADED") == 2
        assert states[-1] == "EXACT"


async def test_subscriber_counts_hash_mismatches(fake_pub):
    from tests.fakes.kvpub import stored

    h = BlockHasher(4, seed="other")
    idx = InstanceIndex("p0")
    async with following(fake_pub, idx, check=h.first_key):
        await fake_pub.publish([stored([BlockHasher(4).first_key([1, 2, 3, 4])], [1, 2, 3, 4], 4)])
        await until(lambda: idx.stored == 1)
        assert idx.hash_mismatches == 1


async def test_subscriber_follows_a_restarted_publisher(fake_pub):
    from tests.fakes.kvpub import stored

    idx = InstanceIndex("p0")
    async with following(fake_pub, idx) as (sub, _):
        for k in range(5):
            await fake_pub.publish([stored([10 + k], [0] * 4, 4)])
        await until(lambda: 14 in idx.exact)
        fake_pub.seq = 0  # a new process numbers from 0 again, with an empty cache
        fake_pub.buffer.clear()
        await fake_pub.publish([stored([99], [0] * 4, 4)])
        await until(lambda: 99 in idx.exact)
        assert 10 not in idx.exact
        assert sub.restarts == 1


async def test_subscriber_reads_vllms_own_publisher():
    """vLLM's ZmqEventPublisher (its wire format, replay socket and int hashes) into the
    index, with the keys the router computes for the same tokens."""
    ke = extras.internal("vllm.distributed.kv_events")
    kcu = extras.internal("vllm.v1.core.kv_cache_utils")
    hashing = extras.internal("vllm.utils.hashing")
    kcu.init_none_hash(hashing.sha256)
    toks = list(range(100, 164))
    digests = BlockHasher(32).digests(toks)
    port = free_port_pair()
    pub = ke.ZmqEventPublisher(
        0, endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{port + 1}"
    )
    try:

        def batch(*events: object) -> object:
            return ke.KVEventBatch(ts=1.0, events=list(events))

        def stored(i: int, parent: object) -> object:
            return ke.BlockStored(
                block_hashes=[kcu.maybe_convert_block_hash(digests[i])],
                parent_block_hash=parent,
                token_ids=toks[i * 32 : (i + 1) * 32],
                block_size=32,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            )

        pub.publish(batch(stored(0, None)))  # before the subscriber: replayed
        idx = InstanceIndex("p0")
        async with following(SimpleNamespace(port=port), idx, check=BlockHasher(32).first_key):
            await until(lambda: bool(idx.exact))
            assert idx.exact == {BlockHasher(32).keys(toks)[0]}
            pub.publish(batch(stored(1, kcu.maybe_convert_block_hash(digests[0]))))
            await until(lambda: len(idx.exact) == 2)
            assert idx.overlap(BlockHasher(32).keys(toks), 0.0) == 2
            assert idx.hash_mismatches == 0
            pub.publish(batch(ke.AllBlocksCleared()))
            await until(lambda: not idx.exact)
    finally:
        pub.shutdown()
