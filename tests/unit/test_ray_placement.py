"""Ray backend without a cluster: spec settings, placement over recorded node lists, the
spec rewritten for the nodes, and that importing the backend does not import Ray."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from pdctl.sdk.backends import open_backend
from pdctl.sdk.backends.ray import Node, PlacementError, RayBackend, demands, place, resolve
from pdctl.sdk.backends.ray.placement import ray_options
from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.spec import FleetSpec, RayGroup
from pdctl.sdk.specload import load_spec
from tests.conftest import spec_dict

HEAD = "node:__internal_head__"
# two entries as ray.nodes() returns them (trimmed), from a local two-node cluster
RAW_NODES: list[dict[str, Any]] = [
    {
        "NodeID": "b" * 56,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.2",
        "Resources": {"CPU": 1.0, "node_b": 1.0, "memory": 1e9, "node:10.0.0.2": 1.0},
        "DeathReasonMessage": "",
    },
    {
        "NodeID": "a" * 56,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": 1.0, "node_a": 1.0, HEAD: 1.0, "node:10.0.0.1": 1.0},
        "DeathReasonMessage": "",
    },
]
NODES = [Node.from_ray(n) for n in RAW_NODES]


def ray_demo(*overrides: str) -> FleetSpec:
    base = [
        "backend.kind=ray",
        "backend.ray.groups.prefill.resources.node_a=1",
        "backend.ray.groups.decode.resources.node_b=1",
        # placed on a node's address the router needs an admin key (PD045): not the point here
        "router.insecure_control=true",
    ]
    return load_spec("<demo>", [*base, *overrides], text=demo_spec_text()).spec


def gpu_spec(ray: dict[str, Any], **kw: Any) -> FleetSpec:
    d = spec_dict(**kw)
    d["backend"] = {"kind": "ray", "ray": ray}
    return FleetSpec(**d)


def gpu_node(node_id: str, ip: str, gpus: float, head: bool = False) -> Node:
    res = {"CPU": 8.0, "GPU": gpus, **({HEAD: 1.0} if head else {})}
    return Node(node_id, ip, True, res)


# ---------------------------------------------------------------- spec


def test_set_overrides_reach_the_ray_groups():
    spec = ray_demo("backend.ray.address=10.0.0.1:6379", "backend.ray.groups.router.num_cpus=0.5")
    ray = spec.backend.ray
    assert ray is not None
    assert ray.address == "10.0.0.1:6379"
    assert ray.groups["decode"].resources == {"node_b": 1}
    assert ray.groups["router"].num_cpus == 0.5


@pytest.mark.parametrize(("name", "fix"), [("CPU", "num_cpus"), ("GPU", "num_gpus")])
def test_managed_resources_point_at_their_setting(name: str, fix: str):
    with pytest.raises(ValidationError, match=fix):
        RayGroup(resources={name: 1})


def test_negative_resource_is_refused():
    with pytest.raises(ValidationError, match="node_a"):
        RayGroup(resources={"node_a": -1})


def test_instances_ask_for_cpus_gpus_and_custom_resources():
    spec = gpu_spec(
        {"num_cpus": 2, "groups": {"decode": {"resources": {"nvl": 1}}}},
        prefill=[{"tp": 2}],
        decode=[{}],
    )
    assert ray_options(spec, "prefill", 2) == {"CPU": 2, "GPU": 2}
    assert ray_options(spec, "decode", 1) == {"CPU": 2, "GPU": 1, "nvl": 1}
    assert ray_options(spec, "router") == {"CPU": 0, "GPU": 0}
    cpu = ray_demo()
    assert ray_options(cpu, "prefill") == {"CPU": 1.0, "GPU": 0.0, "node_a": 1}


def test_demands_cover_every_instance_and_the_router():
    ds = demands(ray_demo())
    assert [(d.group, d.instances) for d in ds] == [
        ("prefill", ("prefill-0",)),
        ("decode", ("decode-0",)),
        ("router", ("router",)),
    ]


# ---------------------------------------------------------------- placement


def test_custom_resources_choose_the_nodes_and_the_router_goes_to_the_head():
    p = place(ray_demo(), NODES)
    assert p.node_of("prefill").ip == "10.0.0.1"
    assert p.node_of("decode").ip == "10.0.0.2"
    assert p.node_of("router").is_head


def test_missing_custom_resource_names_instance_resource_and_nodes():
    spec = ray_demo("backend.ray.groups.decode.resources.node_c=1")
    with pytest.raises(PlacementError) as e:
        place(spec, NODES)
    msg = str(e.value)
    assert "'decode'" in msg
    assert "decode-0" in msg
    assert "node_c" in msg
    assert "10.0.0.1" in msg
    assert "10.0.0.2" in msg
    assert "ray start --resources" in msg


def test_capacity_is_counted_across_groups_and_instances():
    both_on_a = ray_demo("backend.ray.groups.decode.resources.node_a=1")
    with pytest.raises(PlacementError, match="'decode'"):
        place(both_on_a, NODES)  # node_a is 1 and prefill took it
    spec = gpu_spec({}, prefill=[{"count": 2, "tp": 2}], decode=[{"tp": 4}])
    nodes = [gpu_node("h" * 56, "10.0.0.1", 0, head=True), gpu_node("g" * 56, "10.0.0.3", 8)]
    p = place(spec, nodes)
    assert p.node_of("prefill").ip == p.node_of("decode").ip == "10.0.0.3"
    with pytest.raises(PlacementError, match="GPU 4"):
        place(spec, [*nodes[:1], gpu_node("g" * 56, "10.0.0.3", 6)])


def test_dead_nodes_are_not_used():
    dead = [Node(n.node_id, n.ip, n.node_id.startswith("b") is False, n.resources) for n in NODES]
    with pytest.raises(PlacementError, match="node_b"):
        place(ray_demo(), dead)
    with pytest.raises(PlacementError, match="no live node"):
        place(ray_demo(), [Node("x" * 56, "10.0.0.9", False, {"CPU": 4.0})])


def test_a_routable_host_pins_its_group_to_that_node():
    spec = gpu_spec({}, prefill=[{"host": "10.0.0.3"}], decode=[{}])
    nodes = [gpu_node("h" * 56, "10.0.0.1", 4, head=True), gpu_node("g" * 56, "10.0.0.3", 4)]
    p = place(spec, nodes)
    assert p.node_of("prefill").ip == "10.0.0.3"
    assert p.node_of("decode").ip == "10.0.0.1"
    with pytest.raises(PlacementError, match=r"no live node has the address 10\.0\.0\.7"):
        place(gpu_spec({}, prefill=[{"host": "10.0.0.7"}], decode=[{}]), nodes)


# ---------------------------------------------------------------- resolve


def test_resolved_spec_binds_and_advertises_node_addresses():
    spec = ray_demo()
    resolved = resolve(spec, place(spec, NODES))
    plan = build_plan(resolved)
    p, d = plan.instances
    assert (p.host, p.side_channel_host, p.url) == ("10.0.0.1", "10.0.0.1", "http://10.0.0.1:8100")
    assert (d.host, d.side_channel_host) == ("10.0.0.2", "10.0.0.2")
    assert d.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    i = d.argv.index("--host")
    assert d.argv[i + 1] == "10.0.0.2"
    assert resolved.router is not None
    assert resolved.router.host == "10.0.0.1"
    # everything else is the spec's own: ports, cores, transfer settings
    before = build_plan(spec)
    assert [i.ports() for i in plan.instances] == [i.ports() for i in before.instances]
    assert [i.cpu_cores for i in plan.instances] == [i.cpu_cores for i in before.instances]
    assert [i.kv_transfer_config for i in plan.instances] == [
        i.kv_transfer_config for i in before.instances
    ]


def test_resolved_gpu_spec_leaves_device_choice_to_ray():
    spec = gpu_spec({}, prefill=[{"devices": [3]}], decode=[{"devices": [3]}])
    nodes = [gpu_node("h" * 56, "10.0.0.1", 4, head=True)]
    resolved = resolve(spec, place(spec, nodes))
    assert [g.devices for g in (*resolved.prefill, *resolved.decode)] == [None, None]
    assert len({i.devices for i in build_plan(resolved).instances}) == 2


def test_explicit_routable_side_channel_host_is_kept():
    spec = gpu_spec({}, prefill=[{"side_channel_host": "192.168.5.5"}], decode=[{}])
    resolved = resolve(spec, place(spec, [gpu_node("h" * 56, "10.0.0.1", 4, head=True)]))
    assert resolved.prefill[0].side_channel_host == "192.168.5.5"
    assert resolved.decode[0].side_channel_host == "10.0.0.1"


# ---------------------------------------------------------------- wiring


def test_open_backend_builds_the_ray_backend():
    b = open_backend(ray_demo(), ready_timeout=5, grace=1)
    assert isinstance(b, RayBackend)
    assert b.kind == "ray"


def test_importing_the_ray_backend_does_not_import_ray():
    code = (
        "import sys, pdctl.sdk, pdctl.sdk.backends, pdctl.sdk.backends.ray\n"
        "from pdctl.sdk.backends import open_backend\n"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
