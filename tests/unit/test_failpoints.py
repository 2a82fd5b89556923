"""The connector's failpoints and decode's peer watch: values, selection, probing (no
vLLM, no NIXL: both modules are pure Python)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pdctl.connector.failpoints import (
    HANDSHAKE_TIMEOUT_S,
    SideChannelCut,
    WriteDelay,
    failing_transfer,
    failpoint_match,
)
from pdctl.connector.peerwatch import FORGET_S, PeerWatch, tcp_accepts


def test_write_failpoint_values():
    assert failpoint_match("fail") == ""
    assert failpoint_match("match:chaos") == "chaos"
    with pytest.raises(ValueError, match="pdctl_failpoint_write"):
        failpoint_match("match:")


def test_failing_transfer_refuses_only_matching_writes():
    writing = ["cmpl-ok-0"]
    transfer = failing_transfer(lambda *a: "posted", lambda: writing[0], "chaos")
    assert transfer(1) == "posted"
    writing[0] = "cmpl-chaos-0"
    with pytest.raises(RuntimeError, match="failpoint"):
        transfer(1)


def test_write_delay_values(tmp_path: Path):
    assert WriteDelay.parse("1500") == WriteDelay(1.5)
    assert WriteDelay.parse("20:match:slow") == WriteDelay(0.02, match="slow")
    switch = tmp_path / "on"
    d = WriteDelay.parse(f"100:while:{switch}")
    assert d == WriteDelay(0.1, while_path=str(switch))
    for bad in ("", "0", "-5", "soon", "10:match:", "10:when:x"):
        with pytest.raises(ValueError, match="pdctl_failpoint_write_delay"):
            WriteDelay.parse(bad)


def test_write_delay_selection(tmp_path: Path):
    assert WriteDelay(1.0).applies("cmpl-any-0")
    assert WriteDelay(1.0, match="slow").applies("cmpl-slow-0")
    assert not WriteDelay(1.0, match="slow").applies("cmpl-fast-0")
    switch = tmp_path / "on"
    d = WriteDelay(1.0, while_path=str(switch))
    assert not d.applies("cmpl-any-0")
    switch.write_text("on")
    assert d.applies("cmpl-any-0")


def test_side_channel_cut_values_and_switch(tmp_path: Path):
    assert SideChannelCut.parse("refused").fails_after_s() == 0.0
    assert SideChannelCut.parse("blackholed").fails_after_s() == HANDSHAKE_TIMEOUT_S
    for bad in ("sometimes", "refused:while:", "refused:match:x"):
        with pytest.raises(ValueError, match="pdctl_failpoint_side_channel"):
            SideChannelCut.parse(bad)
    switch = tmp_path / "cut"
    cut = SideChannelCut.parse(f"refused:while:{switch}")
    assert cut.fails_after_s() is None  # off while the file is absent
    switch.write_text("on\n")
    assert cut.fails_after_s() == 0.0  # the configured mode
    switch.write_text("blackholed\n")
    assert cut.fails_after_s() == HANDSHAKE_TIMEOUT_S  # the file picks the mode


def test_peer_watch_reports_an_address_after_consecutive_misses():
    up = {("h", 1): True, ("h", 2): False}
    w = PeerWatch(0.5, misses=2, probe=lambda a, _t: up[a])
    w._thread = object()  # type: ignore[assignment]  # no thread: rounds run by hand
    assert w.dead(up, now=0.0) == set()
    w.probe_once(now=0.1)
    assert w.dead(up, now=0.2) == set()  # one miss is not enough
    w.probe_once(now=0.3)
    assert w.dead(up, now=0.4) == {("h", 2)}
    up[("h", 2)] = True
    w.probe_once(now=0.5)
    assert w.dead(up, now=0.6) == set()  # back: forgiven


def test_peer_watch_forgets_addresses_nobody_asks_about():
    probed: list[tuple[str, int]] = []

    def probe(a: tuple[str, int], _t: float) -> bool:
        probed.append(a)
        return False

    w = PeerWatch(0.5, probe=probe)
    w._thread = object()  # type: ignore[assignment]
    w.dead([("h", 1)], now=0.0)
    w.probe_once(now=1.0)
    assert probed == [("h", 1)]
    w.probe_once(now=FORGET_S + 1.0)
    assert probed == [("h", 1)]  # not asked about since: no connection made


def test_tcp_accepts_a_listener_and_not_a_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = s.getsockname()
        assert tcp_accepts(addr, 1.0)
    assert not tcp_accepts(addr, 1.0)
