"""The supervisor's restart policy against the fake engine: an exit 0 nobody asked for, an
API server up with a dead engine, crash loops, 'never', and the router's notifications.
Real vLLM is exercised by tests/e2e/test_e2e_restart.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import httpx
import pytest

from pdctl.sdk.events import EventSource
from pdctl.sdk.fleet import AsyncFleet, FleetEvent, control, fleet_dir, fleet_status, read_state
from pdctl.sdk.fleet.remote import remote_stop
from pdctl.sdk.fleet.supervisor import RouterNotifier
from pdctl.sdk.shepherd import group_members
from pdctl.sdk.spec import FleetSpec
from tests.conftest import free_ports
from tests.unit.test_launcher import fake_python, state_root

__all__ = ["fake_python", "state_root"]  # fixtures shared with the launcher tests

FAST = {"restart_backoff_s": 0.1}


def make_spec(fake_python: str, decode: dict[str, Any] | None = None, **env: str) -> FleetSpec:
    hp, hd, sp, sd = free_ports(4)
    return FleetSpec(
        model={"path": "org/fake", "served_name": "fake"},
        fleet={"name": "t", "platform": "cpu", "python": fake_python, "env": env},
        prefill=[{"http_port": hp, "side_channel_port": sp, **FAST}],
        decode=[{"http_port": hd, "side_channel_port": sd, **FAST, **(decode or {})}],
        router={"port": free_ports(1)[0]},
    )


class RouterLog:
    """A stand-in router that records the supervisor's notifications."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/pdctl/instance"
        body = json.loads(request.content)
        self.calls.append((body["instance"], body["event"]))
        if self.fail:
            raise httpx.ConnectError("router down")
        return httpx.Response(200, json={"mode": "push", "modes": [], "instances": []})


def fleet_with(spec: FleetSpec, router: RouterLog, monkeypatch: pytest.MonkeyPatch) -> AsyncFleet:
    # with_router=False: no router process; the notifier talks to the recording stand-in
    fleet = AsyncFleet(spec, grace=2, with_router=False)
    notifier = RouterNotifier("http://router", transport=httpx.MockTransport(router.handler))
    monkeypatch.setattr(fleet, "_router_notifier", lambda: notifier)
    return fleet


def engine_core(name: str) -> int:
    """The fake engine's 'engine core' child (the youngest process of the group)."""
    rec = read_state(fleet_dir("t"))
    assert rec is not None
    pg = rec.instance(name).shepherd_pid
    assert pg is not None
    return max(p for p in group_members(pg) if p != pg)


async def until(events: Any, kind: str, limit: float = 20) -> list[FleetEvent]:
    seen: list[FleetEvent] = []
    while True:
        ev = await asyncio.wait_for(anext(events), limit)
        seen.append(ev)
        if ev.kind == kind:
            return seen


async def test_exit_0_after_ready_is_a_failure_and_the_policy_restarts_it(
    fake_python, state_root, monkeypatch
):
    router = RouterLog()
    async with fleet_with(make_spec(fake_python), router, monkeypatch) as fleet:
        events = fleet.events()
        os.kill(engine_core("decode-0"), signal.SIGKILL)  # the API server then exits 0
        seen = await until(events, "restarted")
        kinds = [(e.kind, e.instance) for e in seen]
        exited = next(e for e in seen if e.kind == "exited")
        assert exited.code == 0
        assert "without being asked to" in exited.message
        assert kinds.index(("backoff", "decode-0")) < kinds.index(("starting", "decode-0"))
        assert kinds[-2:] == [("ready", "decode-0"), ("restarted", "decode-0")]
        assert router.calls == [("decode-0", "down"), ("decode-0", "up")]
        st = {s.name: s for s in (await fleet_status("t")).instances}
        d = st["decode-0"]
        assert (d.state, d.restarts) == ("ready", 1)
        assert d.restart_policy == "on-failure (max 5 in 300 s)"
        assert d.last_restart_at is not None
        assert d.last_failure is not None
        assert "code 0" in d.last_failure
        rec = read_state(state_root / "t")
        assert rec is not None
        assert rec.instance("decode-0").engine_id == "decode-0-r1"  # a fresh engine id
        # the same story, kept in the state directory for `pdctl events` and the timeline
        kept = [(e.kind, e.subject) for e in EventSource(state_root / "t").history()]
        for k in ("exited", "backoff", "starting", "ready", "restarted"):
            assert (k, "decode-0") in kept
        assert kept.index(("exited", "decode-0")) < kept.index(("restarted", "decode-0"))


async def test_http_up_with_a_dead_engine_is_stopped_and_restarted(
    fake_python, state_root, monkeypatch
):
    router = RouterLog()
    spec = make_spec(fake_python, FAKE_ENGINE_KEEP_HTTP="1")
    async with fleet_with(spec, router, monkeypatch) as fleet:
        events = fleet.events()
        rec = read_state(state_root / "t")
        assert rec is not None
        old_group = rec.instance("prefill-0").shepherd_pid
        assert old_group is not None
        os.kill(engine_core("prefill-0"), signal.SIGKILL)  # /health turns 503, HTTP stays
        seen = await until(events, "restarted")
        unhealthy = next(e for e in seen if e.kind == "unhealthy")
        assert unhealthy.instance == "prefill-0"
        assert "answered 503 3 times in a row" in unhealthy.message
        assert not any(e.kind == "exited" for e in seen)  # it never exited by itself
        assert not group_members(old_group)  # the half-dead server was stopped
        assert router.calls == [("prefill-0", "down"), ("prefill-0", "up")]
        st = {s.name: s for s in await fleet.status()}
        assert (st["prefill-0"].state, st["prefill-0"].restarts) == ("ready", 1)


async def test_crash_loop_gives_up_with_a_clear_event_and_state(
    fake_python, state_root, monkeypatch
):
    spec = make_spec(fake_python, decode={"max_restarts": 1, "restart_window_s": 600})
    async with fleet_with(spec, RouterLog(), monkeypatch) as fleet:
        events = fleet.events()
        os.kill(engine_core("decode-0"), signal.SIGKILL)
        await until(events, "restarted")
        os.kill(engine_core("decode-0"), signal.SIGKILL)
        seen = await until(events, "gave-up")
        want = "crash loop: 1 restarts in 600 s; restart policy gave up"
        assert seen[-1].message.startswith(want)
        st = {s.name: s for s in (await fleet_status("t")).instances}
        assert (st["decode-0"].state, st["decode-0"].restarts) == ("failed", 1)
        assert st["decode-0"].log_tail  # the log says why
        # an operator's restart starts the count again
        await fleet.restart("decode-0")
        st = {s.name: s for s in await fleet.status()}
        assert (st["decode-0"].state, st["decode-0"].restarts) == ("ready", 2)


async def test_never_leaves_it_exited(fake_python, state_root, monkeypatch):
    router = RouterLog()
    spec = make_spec(fake_python, decode={"restart": "never"})
    async with fleet_with(spec, router, monkeypatch) as fleet:
        events = fleet.events()
        os.kill(engine_core("decode-0"), signal.SIGKILL)
        await until(events, "exited")
        # the policy decision follows the exit without waiting for anything but the
        # router's notification: by the time that is recorded, the state is final
        for _ in range(100):
            if router.calls:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0)
        st = {s.name: s for s in (await fleet_status("t")).instances}
        assert (st["decode-0"].state, st["decode-0"].exit_code) == ("exited", 0)
        assert st["decode-0"].restart_policy == "never"
        assert router.calls == [("decode-0", "down")]
        assert fleet._instances["decode-0"].pending is None


async def test_operator_restart_and_stop_tell_the_router_and_survive_its_absence(
    fake_python, state_root, monkeypatch
):
    router = RouterLog(fail=True)  # every notification fails: supervision goes on
    async with fleet_with(make_spec(fake_python), router, monkeypatch) as fleet:
        await fleet.restart("prefill-0")
        await fleet.stop("decode-0")
        assert router.calls == [("prefill-0", "down"), ("prefill-0", "up"), ("decode-0", "down")]
        st = {s.name: s.state for s in await fleet.status()}
        assert st == {"prefill-0": "ready", "decode-0": "stopped"}
        # another shell's stop through the control socket is journaled with who asked
        await asyncio.to_thread(remote_stop, "t", "prefill-0")
        control = [e for e in EventSource(state_root / "t").history() if e.kind == "control"]
        assert [(e.subject, e.message) for e in control] == [("prefill-0", "stop")]
        assert control[0].actor is not None
        assert "@" in control[0].actor


async def test_routers_word_restarts_a_dead_engine_without_waiting_for_the_rounds(
    fake_python, state_root, monkeypatch
):
    """The router saw an instance fail (``suspect`` on the control socket): the
    supervisor checks its /health at once and one 503 is enough; an instance that
    answers 200 is left alone (the router's word alone never stops anything)."""
    router = RouterLog()
    spec = make_spec(fake_python, FAKE_ENGINE_KEEP_HTTP="1")
    async with fleet_with(spec, router, monkeypatch) as fleet:
        for inst in fleet._instances.values():  # the monitor alone would never act
            inst.liveness.errors_to_fail = 10_000
        sock = state_root / "t" / "control.sock"

        def suspect(name: str) -> bool:
            req = {"cmd": "suspect", "name": name, "why": "answered 500", "by": "router"}
            return bool(control.request(sock, req, 5)["dead"])

        assert not await asyncio.to_thread(suspect, "prefill-0")  # alive: left alone
        assert not await asyncio.to_thread(suspect, "nope")
        events = fleet.events()
        os.kill(engine_core("decode-0"), signal.SIGKILL)  # /health turns 503, HTTP stays
        for _ in range(100):
            if await asyncio.to_thread(suspect, "decode-0"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the supervisor never found decode-0 dead")
        seen = await until(events, "restarted")
        unhealthy = [e for e in seen if e.kind == "unhealthy"]
        assert [e.instance for e in unhealthy] == ["decode-0"]
        assert "the router saw it fail (answered 500)" in unhealthy[0].message
        assert router.calls == [("decode-0", "down"), ("decode-0", "up")]
        st = {s.name: s for s in await fleet.status()}
        assert (st["decode-0"].state, st["decode-0"].restarts) == ("ready", 1)
        assert (st["prefill-0"].state, st["prefill-0"].restarts) == ("ready", 0)
