"""The Ray backend's up/status/down logic against a fake cluster (no Ray needed): what
each actor answer (or its absence, or a dead node) becomes in the status table."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from pdctl.sdk.backends.ray import RayBackend
from pdctl.sdk.backends.ray.actor import ActorRecord
from pdctl.sdk.backends.ray.cluster import RayCluster
from pdctl.sdk.backends.ray.placement import Node
from pdctl.sdk.errors import FleetRunningError, LaunchError, NotRunningError
from tests.unit.test_ray_placement import NODES, ray_demo

Answer = Callable[[], Any]


class Method:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls = 0

    def remote(self) -> Answer:
        self.calls += 1
        return self.answer


class FakeActor:
    def __init__(self, record: dict[str, Any], info: Answer) -> None:
        self.record = record
        self.describe = Method(lambda: record)
        self.info = Method(info)
        self.start = Method(info)
        self.stop = Method(lambda: {"state": "stopped"})


class FakeCluster(RayCluster):
    """Actors by instance name; an answer that raises stands for a failed Ray call."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__("10.0.0.1:6379", "pdctl")
        self.node_list = nodes
        self.actors: dict[str, FakeActor] = {}
        self.killed: list[str] = []
        self.infos: dict[str, Answer] = {}

    def nodes(self) -> list[Node]:
        return self.node_list

    def actor_names(self, fleet: str) -> list[str]:
        return sorted(self.actors)

    def actor(self, fleet: str, instance: str) -> Any | None:
        return self.actors.get(instance)

    def create(
        self, fleet: str, instance: str, record: dict[str, Any], opts: dict[str, Any]
    ) -> Any:
        info = self.infos.get(instance, lambda: {"state": "starting"})
        self.actors[instance] = FakeActor(record, info)
        return self.actors[instance]

    def call(self, refs: dict[str, Any], timeout: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, answer in refs.items():
            try:
                out[name] = answer()
            except Exception as e:
                out[name] = e
        return out

    def kill(self, handle: Any) -> None:
        for name, a in list(self.actors.items()):
            if a is handle:
                self.killed.append(name)
                del self.actors[name]


def ready(**kw: Any) -> Answer:
    return lambda: {"state": "ready", "pid": 42, "started_at": 1.0, "log": "10.0.0.1:x", **kw}


def running_fleet(cluster: FakeCluster) -> RayBackend:
    """A backend whose fleet the fake cluster already runs (all ready)."""
    b = RayBackend(ray_demo(), cluster=cluster, ready_timeout=5, poll_s=0)
    cluster.infos = {n: ready() for n in ("prefill-0", "decode-0", "router")}
    asyncio.run(b.up())
    return b


def states(b: RayBackend) -> dict[str, tuple[str, tuple[str, ...]]]:
    st = asyncio.run(b.status())
    return {i.name: (i.state, i.log_tail) for i in st.instances}


def test_up_pins_each_actor_to_its_node_and_waits_until_ready():
    c = FakeCluster(NODES)
    b = running_fleet(c)
    rec = {n: ActorRecord(**a.record) for n, a in c.actors.items()}
    assert rec["prefill-0"].node_ip == "10.0.0.1"
    assert rec["decode-0"].node_ip == "10.0.0.2"
    assert rec["router"].nodes == {
        "prefill-0": "a" * 56,
        "decode-0": "b" * 56,
        "router": "a" * 56,
    }
    assert all(a.start.calls == 1 for a in c.actors.values())
    assert b.endpoints().by_name("decode-0").url == "http://10.0.0.2:8200"


def test_status_from_another_process_reads_the_record_from_an_actor():
    c = FakeCluster(NODES)
    running_fleet(c)
    other = RayBackend(ray_demo(), cluster=c)
    assert {s for s, _t in states(other).values()} == {"ready"}
    assert other.endpoints().by_name("prefill-0").host == "10.0.0.1"


def test_dead_node_makes_its_instance_gone_with_the_reason():
    c = FakeCluster(NODES)
    b = running_fleet(c)
    del c.actors["decode-0"]
    dead = Node("b" * 56, "10.0.0.2", False, NODES[0].resources, "health check failed")
    c.node_list = [dead, NODES[1]]
    st = states(b)
    assert st["decode-0"][0] == "gone"
    assert "10.0.0.2" in st["decode-0"][1][0]
    assert "died: health check failed" in st["decode-0"][1][0]
    assert st["prefill-0"][0] == "ready"


def test_silent_actor_is_unhealthy_once_it_answered_and_starting_before():
    c = FakeCluster(NODES)
    b = running_fleet(c)

    def silent() -> Any:
        raise TimeoutError("no answer within 10 s")

    c.actors["decode-0"].info = Method(silent)
    assert states(b)["decode-0"][0] == "unhealthy"
    fresh = RayBackend(ray_demo(), cluster=c)
    state, tail = states(fresh)["decode-0"]
    assert state == "starting"
    assert "does not answer" in tail[0]


def test_exited_instance_shows_code_and_log_tail():
    c = FakeCluster(NODES)
    b = running_fleet(c)
    c.actors["prefill-0"].info = Method(
        lambda: {"state": "exited", "exit_code": 1, "log_tail": ["Traceback", "OSError: x"]}
    )
    st = {i.name: i for i in asyncio.run(b.status()).instances}
    assert (st["prefill-0"].state, st["prefill-0"].exit_code) == ("exited", 1)
    assert st["prefill-0"].log_tail[-1] == "OSError: x"


def test_up_refuses_a_running_fleet_and_leaves_it_alone():
    c = FakeCluster(NODES)
    running_fleet(c)
    with pytest.raises(FleetRunningError, match="already running"):
        asyncio.run(RayBackend(ray_demo(), cluster=c).up())
    assert not c.killed


def test_failed_start_takes_everything_down():
    c = FakeCluster(NODES)
    c.infos = {"decode-0": lambda: {"error": "model.path /m does not exist on node 10.0.0.2"}}
    with pytest.raises(LaunchError, match=r"does not exist on node 10\.0\.0\.2"):
        asyncio.run(RayBackend(ray_demo(), cluster=c, poll_s=0).up())
    assert sorted(c.killed) == ["decode-0", "prefill-0", "router"]
    assert not c.actors


def test_ready_timeout_names_the_waiting_instances_and_takes_everything_down():
    c = FakeCluster(NODES)
    c.infos = {"decode-0": lambda: {"state": "starting", "why": "not listening yet"}}
    c.infos |= {n: ready() for n in ("prefill-0", "router")}
    with pytest.raises(LaunchError, match=r"decode-0 starting \(not listening yet\)"):
        asyncio.run(RayBackend(ray_demo(), cluster=c, ready_timeout=0, poll_s=0).up())
    assert not c.actors


def test_down_stops_then_kills_every_actor_and_is_idempotent():
    c = FakeCluster(NODES)
    b = running_fleet(c)
    actors = list(c.actors.values())
    assert asyncio.run(b.down()).startswith("stopped 3 actor(s)")
    assert all(a.stop.calls == 1 for a in actors)
    assert asyncio.run(b.down()).startswith("nothing of fleet 'demo'")
    with pytest.raises(NotRunningError, match="pdctl up --backend ray"):
        asyncio.run(b.status())
