"""Ports picked for fleets started on the fly stay out of the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pdctl.sdk import freeports as ports


def test_ports_are_outside_the_ephemeral_range_and_distinct() -> None:
    lo, hi = ports.ephemeral_range()
    got = ports.free_ports(20) + ports.free_ports(20)
    assert len(set(got)) == 40, "a port was handed out twice"
    assert all(not (lo <= p <= hi) for p in got)
    assert all(ports.LOWEST <= p <= ports.HIGHEST for p in got)


def test_a_listening_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))
        s.listen()
        taken = s.getsockname()[1]
        monkeypatch.setattr(ports, "candidate_span", lambda: (taken, taken + 1))
        assert ports.free_ports(1) == [taken + 1] or taken + 1 in ports._handed
        with pytest.raises(RuntimeError, match="free ports"):
            ports.free_ports(1, attempts=50)


def test_span_is_the_larger_side(tmp_path: Path) -> None:
    assert ports.candidate_span((32768, 60999)) == (20000, 32767)
    assert ports.candidate_span((20000, 40000)) == (40001, 65535)
    assert ports.candidate_span((1024, 65535)) == (20000, 65535)
    f = tmp_path / "range"
    f.write_text("20000\t30000\n")
    assert ports.ephemeral_range(f) == (20000, 30000)
    f.write_text("garbage")
    assert ports.ephemeral_range(f) == ports.DEFAULT_EPHEMERAL
    assert ports.ephemeral_range(tmp_path / "absent") == ports.DEFAULT_EPHEMERAL
