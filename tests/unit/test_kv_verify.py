"""The KV digest (pure torch) and the connector's digest check with a fake worker: equal
bytes give equal digests whatever the dtype view, one flipped byte or swapped blocks do
not; the prefill tags exactly the WRITE it was asked for, the decode catches a wrong,
misplaced or unwritten block and passes the right ones (no vLLM engine, no NIXL)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

# only the distribution may be missing (a skip, a failure under --strict-skips)
pytest.importorskip("torch", reason="torch is not installed (pip install 'pdctl[cpu]')")

import torch

from pdctl.connector import kvdigest
from pdctl.connector.failpoints import KvCorrupt
from pdctl.connector.kvverify import ASK_KEY, KvVerifier, parse_rate
from pdctl.sdk.metrics import rendezvous as rv


def caches(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"model.layers.{i}.attn": torch.randn(8, 2, 2, 32, 16, generator=g).to(dtype)
        for i in range(3)
    }


def test_equal_bytes_equal_digests_in_any_copy():
    a = caches()
    b = {n: t.clone() for n, t in a.items()}
    assert kvdigest.block_digests(a, [0, 3, 5]) == kvdigest.block_digests(b, [0, 3, 5])
    # the same bytes seen through another dtype and shape: the same digest
    as_int = {n: t.view(torch.int16).reshape(8, -1) for n, t in a.items()}
    assert kvdigest.block_digests(as_int, [1, 2]) == kvdigest.block_digests(a, [1, 2])
    # a non-contiguous block-major view (a strided page) reads the same bytes
    wide = {n: torch.cat([t, t], dim=1)[:, :2] for n, t in a.items()}
    assert kvdigest.block_digests(wide, [4]) == kvdigest.block_digests(a, [4])
    assert all(0 <= d < 2**64 for d in kvdigest.block_digests(a, range(8)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_one_flipped_byte_changes_only_its_block(dtype: torch.dtype):
    a = caches(dtype=dtype)
    ref = kvdigest.block_digests(a, list(range(8)))
    for layer in a:
        for offset in (0, 1, 777, -1):
            b = {n: t.clone() for n, t in a.items()}
            raw = b[layer][5].view(torch.uint8).reshape(-1)
            raw[offset] ^= 1
            got = kvdigest.block_digests(b, list(range(8)))
            assert got[5] != ref[5], (layer, offset)
            assert got[:5] + got[6:] == ref[:5] + ref[6:]


def test_swapped_blocks_layers_and_words_are_seen():
    a = caches()
    ref = kvdigest.block_digests(a, [2, 6])
    b = {n: t.clone() for n, t in a.items()}
    for t in b.values():
        t[[2, 6]] = t[[6, 2]].clone()
    assert kvdigest.block_digests(b, [2, 6]) == ref[::-1]  # each block checked in its slot
    names = sorted(a)
    c = {**a, names[0]: a[names[1]], names[1]: a[names[0]]}  # two layers exchanged
    assert kvdigest.block_digests(c, [2])[0] != ref[0]
    d = {n: t.clone() for n, t in a.items()}
    page = d[names[2]][2].reshape(-1)
    page[[0, 1]] = page[[1, 0]].clone()  # two words moved within a page
    if not torch.equal(page[0], page[1]):
        assert kvdigest.block_digests(d, [2])[0] != ref[0]


def test_wire_form_round_trips_and_leaves_vllm_notifications_alone():
    pairs = [(7, 2**64 - 1), (3, 0), (11, 12345)]
    notif = kvdigest.encode(pairs, b"cmpl-abc-0-1a2b3c4d:1")
    assert kvdigest.decode(notif) == (dict(pairs), b"cmpl-abc-0-1a2b3c4d:1")
    assert kvdigest.decode(b"cmpl-abc-0:1") is None
    assert kvdigest.decode(b"HB:x") is None
    # garbage where the digests belong decodes as none: the check then fails it
    assert kvdigest.decode(b"pdkv1|7=zz|cmpl-abc:1") == ({}, b"cmpl-abc:1")


def test_sampling_is_deterministic_and_near_the_rate():
    ids = [f"cmpl-{i}-0" for i in range(4000)]
    share = sum(kvdigest.sampled(r, 0.1) for r in ids) / len(ids)
    assert 0.08 < share < 0.12
    assert [kvdigest.sampled(r, 0.1) for r in ids] == [kvdigest.sampled(r, 0.1) for r in ids]
    assert all(kvdigest.sampled(r, 1.0) for r in ids[:10])
    assert not any(kvdigest.sampled(r, 0.0) for r in ids[:10])


def test_rate_and_failpoint_values():
    assert parse_rate("0.25") == 0.25
    for bad in ("x", -0.1, 2):
        with pytest.raises(ValueError, match="pdctl_kv_verify_rate"):
            parse_rate(bad)
    assert KvCorrupt.parse("swap") == KvCorrupt("swap")
    assert KvCorrupt.parse("flip:every:3") == KvCorrupt("flip", every=3)
    assert KvCorrupt.parse("zero:every:2") == KvCorrupt("zero", every=2)
    for bad in ("shuffle", "swap:every:0", "swap:every:x", "flip:match:", "swap:nth:2"):
        with pytest.raises(ValueError, match="pdctl_failpoint_kv_corrupt"):
            KvCorrupt.parse(bad)
    every3 = KvCorrupt.parse("swap:every:3")
    assert [every3.swaps("r") for _ in range(6)] == [False, False, True] * 2
    assert not KvCorrupt.parse("flip").swaps("r")
    assert KvCorrupt.parse("swap:match:bad").swaps("cmpl-bad-1") is True


# ---------------------------------------------------------------------- the check


class Cfg:
    def __init__(self, **extra: Any) -> None:
        self.extra = extra

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.extra.get(key, default)


def worker(kv: dict[str, torch.Tensor], tp: int = 1) -> Any:
    info = SimpleNamespace(
        remote_tp_size=tp, remote_block_size=32, remote_physical_blocks_per_logical=1
    )
    topo = SimpleNamespace(get_engine_info=lambda _e: info, block_size_ratio=lambda _b: 1)
    return SimpleNamespace(
        world_size=1,
        pp_size=1,
        use_host_buffer=False,
        _has_mamba=False,
        _physical_blocks_per_logical_kv_block=1,
        device_kv_caches=kv,
        transfer_topo=topo,
    )


def prefill_write(
    v: KvVerifier, asked: bool, dst: list[int], src: list[int], engine: str = "D"
) -> tuple[bytes, list[int]]:
    """What the prefill posts for one WRITE: the notification and the destination ids."""
    posted: dict[str, Any] = {}

    def make_prepped_xfer(*_a: Any, notif_msg: bytes) -> str:
        posted["notif"] = notif_msg
        return "handle"

    tagged = v.tag(make_prepped_xfer)
    v.asked = asked
    with v.writing("cmpl-r1-0-aaaa", engine):
        remote, _local = v.written([list(dst)], [list(src)])
        tagged("WRITE", 1, [], 2, [], notif_msg=b"cmpl-r1-0-bbbb:1")
    v.asked = False
    return posted["notif"], list(remote[0])


def pair(**extra: Any) -> tuple[KvVerifier, KvVerifier, list[str], dict[str, torch.Tensor]]:
    p_kv, d_kv = caches(1), caches(2)
    results: list[str] = []

    def report(result: str, _rid: str) -> None:
        results.append(result)

    p = KvVerifier(worker(p_kv), Cfg(**extra), report)
    d = KvVerifier(worker(d_kv), Cfg(pdctl_kv_verify_rate=1.0, **extra), report)
    return p, d, results, d_kv


def land(
    p_kv: dict[str, torch.Tensor], d_kv: dict[str, torch.Tensor], src: list[int], dst: list[int]
) -> None:
    for name in p_kv:
        d_kv[name][dst] = p_kv[name][src]


def decode_check(d: KvVerifier, notif: bytes, awaited: list[int]) -> list[str]:
    rid = "cmpl-r1-0-bbbb"
    reg: dict[str, Any] = {"remote_tp_size": 1, "remote_pp_size": 1}
    d.ask(rid, reg)
    assert reg[ASK_KEY] == 1
    (plain,) = d.strip([notif])
    assert plain == b"cmpl-r1-0-bbbb:1"
    meta = SimpleNamespace(local_physical_block_ids=[awaited])
    return d.check({rid: []}, {rid: meta})


def test_a_faithful_write_verifies_ok():
    p, d, results, d_kv = pair()
    notif, dst = prefill_write(p, True, dst=[4, 5, 6], src=[1, 2, 3])
    land(p.worker.device_kv_caches, d_kv, [1, 2, 3], dst)
    assert decode_check(d, notif, [4, 5, 6]) == []
    assert results == ["ok"]


def test_an_unasked_write_is_not_tagged():
    p, _d, _r, _kv = pair()
    notif, _ = prefill_write(p, False, dst=[4, 5], src=[1, 2])
    assert notif == b"cmpl-r1-0-bbbb:1"


def test_misplaced_blocks_are_caught_with_their_ids(caplog: pytest.LogCaptureFixture):
    p, d, results, d_kv = pair(pdctl_failpoint_kv_corrupt="swap")
    notif, dst = prefill_write(p, True, dst=[4, 5, 6], src=[1, 2, 3])
    assert dst == [5, 4, 6]  # the failpoint swapped the first two destinations
    land(p.worker.device_kv_caches, d_kv, [1, 2, 3], dst)
    assert decode_check(d, notif, [4, 5, 6]) == ["cmpl-r1-0-bbbb"]
    assert results == ["mismatch"]
    assert "blocks [4, 5] differ" in caplog.text


def test_a_flipped_byte_on_arrival_is_caught():
    p, d, results, d_kv = pair(pdctl_failpoint_kv_corrupt="flip")
    notif, dst = prefill_write(p, True, dst=[4, 5], src=[1, 2])
    land(p.worker.device_kv_caches, d_kv, [1, 2], dst)
    assert decode_check(d, notif, [4, 5]) == ["cmpl-r1-0-bbbb"]
    assert results == ["mismatch"]


def test_the_zero_failpoint_spoils_unchecked_kv_once_per_request(caplog: pytest.LogCaptureFixture):
    d_kv = caches(2)
    d = KvVerifier(
        worker(d_kv), Cfg(pdctl_kv_verify_rate=0, pdctl_failpoint_kv_corrupt="zero:every:2"), print
    )
    assert d.rate == 0  # the check is off: nothing asks for digests
    before = {n: c.clone() for n, c in d_kv.items()}
    metas = {r: SimpleNamespace(local_physical_block_ids=[[4 + k, 6]]) for k, r in enumerate("ab")}
    d.spoil({"a": []}, metas)  # the 1st received request: not selected
    d.spoil({"a": [], "b": []}, metas)  # "a" again is not counted again; "b" is the 2nd
    d.spoil({"b": []}, metas)
    for n, c in d_kv.items():
        assert torch.equal(c[4], before[n][4])  # "a" kept its KV
        assert not c[5].any()  # "b"'s first block zeroed, in every layer
        assert torch.equal(c[6], before[n][6])  # its other blocks kept
    assert caplog.text.count("zeroed block 5 of b") == 1


def test_a_zeroed_block_on_a_checked_request_is_caught():
    p, d, results, d_kv = pair(pdctl_failpoint_kv_corrupt="zero")
    notif, dst = prefill_write(p, True, dst=[4, 5], src=[1, 2])
    land(p.worker.device_kv_caches, d_kv, [1, 2], dst)
    rid = "cmpl-r1-0-bbbb"
    d.spoil({rid: []}, {rid: SimpleNamespace(local_physical_block_ids=[[4, 5]])})
    assert decode_check(d, notif, [4, 5]) == [rid]
    assert results == ["mismatch"]


def test_an_unwritten_block_is_caught(caplog: pytest.LogCaptureFixture):
    p, d, results, d_kv = pair()
    notif, dst = prefill_write(p, True, dst=[4, 5], src=[1, 2])
    land(p.worker.device_kv_caches, d_kv, [1, 2], dst)
    assert decode_check(d, notif, [4, 5, 6]) == ["cmpl-r1-0-bbbb"]
    assert "[6] not written" in caplog.text
    assert results == ["mismatch"]


@pytest.mark.parametrize("bad", [8, 10**9, -1])
def test_a_block_id_from_the_wire_outside_the_cache_fails_the_receive_not_the_engine(
    bad: int, caplog: pytest.LogCaptureFixture
):
    """A notification naming a block the decode does not await (beyond the cache, or
    negative) is answered as a mismatch; the cache is never indexed with it (an index
    error on the engine thread would end the engine)."""
    p, d, results, d_kv = pair()
    notif, dst = prefill_write(p, True, dst=[4, 5], src=[1, 2])
    land(p.worker.device_kv_caches, d_kv, [1, 2], dst)
    tagged = kvdigest.parse(notif)
    assert tagged is not None
    spoilt = kvdigest.encode([*tagged.digests.items(), (bad, 0x1234)], tagged.plain)
    assert decode_check(d, spoilt, [4, 5]) == ["cmpl-r1-0-bbbb"]
    assert results == ["mismatch"]
    assert f"[{bad}] written but not awaited" in caplog.text


def test_no_digest_from_the_prefill_is_missing_not_failed():
    _p, d, results, _kv = pair()
    assert decode_check(d, b"cmpl-r1-0-bbbb:1", [4, 5]) == []
    assert results == ["missing"]


def test_uncovered_layouts_are_neither_asked_nor_tagged():
    # decode TP 2 fed by a prefill at TP 1: each WRITE carries part of a prefill block
    # (prefill TP > decode TP is covered: tests/unit/test_kv_verify_hetero.py)
    _p, d, results, _kv = pair()
    d.worker.world_size = 2
    reg: dict[str, Any] = {"remote_tp_size": 1, "remote_pp_size": 1}
    d.ask("cmpl-x-0", reg)
    assert ASK_KEY not in reg
    assert results == ["unsupported"]
    p = KvVerifier(worker(caches(), tp=2), Cfg(), lambda r, _i: results.append(r))
    notif, _ = prefill_write(p, True, dst=[1], src=[1])
    assert notif == b"cmpl-r1-0-bbbb:1"  # prefill TP 1 → decode TP 2: the prefill declines


def test_every_result_is_a_metric_label():
    from pdctl.connector import kvverify

    assert set(kvverify.RESULTS) == set(rv.KV_VERIFY_RESULTS)
    (m,) = [m for m in rv.METRICS if m.name == rv.KV_VERIFY]
    assert m.values == (rv.KV_VERIFY_RESULTS,)
