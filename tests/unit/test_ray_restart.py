"""The Ray actor's restart policy, run as the plain Python object it is (no Ray) over the
fake engine: the same rules as the local supervisor."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from pdctl.sdk.backends.ray.actor import ActorRecord, InstanceProcess
from pdctl.sdk.shepherd import group_members
from tests.unit.test_launcher import fake_python, state_root
from tests.unit.test_supervisor import make_spec

__all__ = ["fake_python", "state_root"]


def wait_for(actor: InstanceProcess, cond: Any, limit: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while True:
        info = actor.info()
        if cond(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.1)


def ready_actor(python: str, decode: dict[str, Any] | None = None) -> InstanceProcess:
    """decode-0's actor over the fake engine, started and seen ready (stop it after)."""
    spec = make_spec(python, decode)
    spec.router = None
    record = ActorRecord("t", "decode-0", spec.model_dump_json(), "node", "127.0.0.1", 2, {})
    actor = InstanceProcess(record.as_dict())
    actor.start()
    try:
        wait_for(actor, lambda i: i["state"] == "ready")
    except BaseException:
        actor.stop()
        raise
    return actor


def test_actor_restarts_an_exit_0_then_gives_up_on_a_crash_loop(
    fake_python, state_root, monkeypatch
):
    # the fake engine is ready at once: watch it as often (the default is once a second)
    monkeypatch.setattr("pdctl.sdk.backends.ray.actor.WATCH_INTERVAL_S", 0.1)
    actor = ready_actor(fake_python, decode={"max_restarts": 1})
    try:

        def kill_core() -> None:
            assert actor.proc is not None
            pg = actor.proc.pid
            os.kill(max(p for p in group_members(pg) if p != pg), signal.SIGKILL)

        kill_core()  # the fake API server exits 0, as vLLM's does
        info = wait_for(actor, lambda i: i["restarts"] == 1 and i["state"] == "ready")
        assert info["restart_policy"] == "on-failure (max 1 in 300 s)"
        assert "code 0" in info["last_failure"]
        assert actor.plan is not None
        assert actor.plan.engine_id == "decode-0-r1"
        kill_core()
        info = wait_for(actor, lambda i: i["state"] == "failed")
        assert "crash loop: 1 restarts in 300 s; restart policy gave up" in info["last_failure"]
        assert info["restarts"] == 1
    finally:
        actor.stop()
    assert actor.proc is not None
    assert not group_members(actor.proc.pid)


def test_one_missed_readiness_check_is_not_unhealthy_two_in_a_row_are(
    fake_python, state_root, monkeypatch
):
    actor = ready_actor(fake_python)
    try:
        real = actor._check_ready
        answers = iter([(False, "timed out"), (True, ""), (False, "timed out"), (False, "hung")])
        monkeypatch.setattr(actor, "_check_ready", lambda plan: next(answers))
        assert actor.info()["state"] == "ready"  # a busy server missed one check
        assert actor.info()["state"] == "ready"
        assert actor.info()["state"] == "ready"  # the miss before was answered since
        info = actor.info()
        assert (info["state"], info["why"]) == ("unhealthy", "hung")
        monkeypatch.setattr(actor, "_check_ready", real)
        assert actor.info()["state"] == "ready"
    finally:
        actor.stop()
