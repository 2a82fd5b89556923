"""The launch plan: the exact argv/env of each instance, ports and devices."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from pdctl.sdk.fleetplan import build_plan, compress_ranges, cpu_binding
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES, spec_dict


def plan_of(**kw):
    return build_plan(FleetSpec(**spec_dict(**kw)))


def flag(argv, name):
    i = argv.index(name)
    return argv[i + 1]


def test_push_roles_and_explicit_engine_ids():
    plan = plan_of()
    p, d = plan.instances
    assert (p.role, d.role) == ("prefill", "decode")
    pk = json.loads(flag(p.argv, "--kv-transfer-config"))
    dk = json.loads(flag(d.argv, "--kv-transfer-config"))
    assert pk["kv_connector"] == dk["kv_connector"] == "PdctlPushConnector"
    assert pk["kv_connector_module_path"] == "pdctl.connector.push"
    assert (pk["kv_role"], dk["kv_role"]) == ("kv_producer", "kv_consumer")
    assert pk["engine_id"] == p.engine_id == "prefill-0"
    assert dk["engine_id"] == d.engine_id == "decode-0"
    assert pk["kv_buffer_device"] == "cuda"
    extra = pk["kv_connector_extra_config"]
    assert extra["kv_lease_duration"] == dk["kv_connector_extra_config"]["kv_lease_duration"]
    assert isinstance(extra["kv_lease_duration"], int)
    assert p.argv[:3] == ("vllm", "serve", "org/some-model")
    assert flag(p.argv, "--block-size") == "128"
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert d.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_stock_connector_stays_selectable():
    for mode, cls in (("push", "NixlPushConnector"), ("pull", "NixlConnector")):
        plan = plan_of(fleet={"mode": mode, "connector": "stock"})
        for inst in plan.instances:
            k = json.loads(flag(inst.argv, "--kv-transfer-config"))
            assert k["kv_connector"] == cls
            assert "kv_connector_module_path" not in k
            assert not any(key.startswith("pdctl_") for key in k["kv_connector_extra_config"])


def test_pull_uses_nixl_connector():
    plan = plan_of(fleet={"mode": "pull"})
    for inst in plan.instances:
        k = json.loads(flag(inst.argv, "--kv-transfer-config"))
        assert k["kv_connector"] == "PdctlPullConnector"
        assert "push_registration_timeout" not in k["kv_connector_extra_config"]
        assert k["engine_id"] == inst.engine_id


def test_colocated_has_no_connector():
    plan = plan_of(fleet={"mode": "colocated"})
    for inst in plan.instances:
        assert inst.role == "colocated"
        assert "--kv-transfer-config" not in inst.argv
        assert inst.engine_id is None
        assert inst.side_channel_port is None
        assert not any(k.startswith("VLLM_NIXL") for k in inst.env)


def test_cpu_entrypoint_and_binding():
    spec = load_spec(EXAMPLES / "cpu-1p1d.toml", environ={}).spec
    plan = build_plan(spec)
    p, d = plan.instances
    assert p.argv[:4] == (sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model")
    extra = json.loads(flag(p.argv, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra["pdctl_nixl_progress_thread"] is False
    assert extra["pdctl_reserve_kv_core"] is False
    untuned = build_plan(
        spec.model_copy(update={"fleet": spec.fleet.model_copy(update={"cpu_tuning": False})})
    )
    k = json.loads(flag(untuned.instances[0].argv, "--kv-transfer-config"))
    assert "pdctl_nixl_progress_thread" not in k["kv_connector_extra_config"]
    assert not p.argv[4].startswith("~")
    assert json.loads(flag(p.argv, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
    assert (p.env["VLLM_CPU_OMP_THREADS_BIND"], d.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    assert p.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "--no-enable-prefix-caching" in p.argv
    assert "CUDA_VISIBLE_DEVICES" not in p.env


def test_connector_options_reach_pdctls_connector_only():
    opts = {"pdctl_reserve_kv_core": True, "pdctl_flight_records": 512}
    for inst in plan_of(fleet={"connector_options": opts}).instances:
        extra = json.loads(flag(inst.argv, "--kv-transfer-config"))["kv_connector_extra_config"]
        assert extra["pdctl_reserve_kv_core"] is True
        assert extra["pdctl_flight_records"] == 512
    stock = plan_of(fleet={"connector": "stock", "connector_options": opts})
    for inst in stock.instances:
        extra = json.loads(flag(inst.argv, "--kv-transfer-config"))["kv_connector_extra_config"]
        assert "pdctl_flight_records" not in extra


def test_dp_spaces_side_channel_ports_and_suffixes_engine_ids():
    plan = plan_of(
        prefill=[{"count": 2, "dp": 2, "devices": [0, 1, 2, 3]}], decode=[{"devices": [4]}]
    )
    p0, p1, d = plan.instances
    assert p0.side_channel_ports == (5600, 5601)
    assert p1.side_channel_ports == (5602, 5603)
    assert d.side_channel_ports == (5604,)
    assert p0.engine_ids == ("prefill-0_dp0", "prefill-0_dp1")
    assert flag(p0.argv, "--data-parallel-size") == "2"


def test_auto_ports_avoid_explicit_ones_declared_later():
    plan = plan_of(
        prefill=[{"devices": [0]}],
        decode=[{"devices": [1], "http_port": 8100, "side_channel_port": 5600}],
    )
    p, _d = plan.instances
    assert p.http_port != 8100
    assert p.side_channel_port != 5600


def test_auto_devices_follow_on_per_host():
    plan = plan_of(prefill=[{"count": 2, "tp": 2}], decode=[{"tp": 4}])
    assert [i.devices for i in plan.instances] == [(0, 1), (2, 3), (4, 5, 6, 7)]


def test_group_names_with_several_groups():
    plan = plan_of(prefill=[{"devices": [0]}, {"devices": [1]}], decode=[{"devices": [2]}])
    assert [i.name for i in plan.instances] == ["prefill-a-0", "prefill-b-0", "decode-0"]


def test_shell_line_round_trips():
    inst = plan_of().instances[0]
    words = shlex.split(inst.shell())
    assert words[0] == "env"
    assert tuple(words[1 + len(inst.env) :]) == inst.argv


def test_extra_args_and_env_layering():
    plan = plan_of(
        fleet={"vllm_args": ["--enforce-eager"], "env": {"A": "1", "B": "1"}},
        prefill=[
            {"devices": [0], "vllm_args": ["--max-num-batched-tokens", "2048"], "env": {"B": "2"}}
        ],
    )
    p = plan.instances[0]
    assert p.argv[-3:] == ("--enforce-eager", "--max-num-batched-tokens", "2048")
    assert (p.env["A"], p.env["B"]) == ("1", "2")


@pytest.mark.parametrize(
    ("cores", "ranks", "want"),
    [
        ((0,), 1, ("0", 1)),
        ((0, 1, 2, 3), 1, ("0-3", 4)),
        ((0, 1, 2, 3), 2, ("0-1|2-3", 2)),
    ],
)
def test_cpu_binding(cores, ranks, want):
    assert cpu_binding(cores, ranks) == want


def test_compress_ranges():
    assert compress_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_embedded_demo_spec_is_the_cpu_example():
    from pdctl.sdk.paths import demo_spec_text

    assert demo_spec_text() == (EXAMPLES / "cpu-1p1d.toml").read_text()


def test_with_engine_id_rewrites_argv_and_config():
    from pdctl.sdk.fleetplan import with_engine_id

    p = plan_of().instances[0]
    q = with_engine_id(p, "prefill-0-r1")
    assert q.engine_id == "prefill-0-r1"
    assert json.loads(flag(q.argv, "--kv-transfer-config"))["engine_id"] == "prefill-0-r1"
    assert (
        q.argv[: q.argv.index("--kv-transfer-config")]
        == p.argv[: p.argv.index("--kv-transfer-config")]
    )


def test_a_local_cpu_fleet_on_loopback_keeps_ucx_listeners_on_lo():
    """UCX opens TCP listeners on every interface unless told otherwise; a CPU fleet
    whose engines all bind loopback is given UCX_NET_DEVICES=lo (what `pdctl audit`
    found open on the demo fleet)."""
    cpu = {"mode": "push", "platform": "cpu"}
    groups = {
        "prefill": [{"host": "127.0.0.1", "cpu_cores": [0]}],
        "decode": [{"host": "localhost", "cpu_cores": [1]}],
    }
    for inst in plan_of(fleet=cpu, **groups).instances:
        assert inst.env["UCX_NET_DEVICES"] == "lo"
    # the operator's choice wins, in either place it can be made
    mine = plan_of(fleet={**cpu, "ucx": {"net_devices": "eth1"}}, **groups)
    assert {i.env["UCX_NET_DEVICES"] for i in mine.instances} == {"eth1"}
    env = plan_of(fleet={**cpu, "ucx": {"env": {"UCX_NET_DEVICES": "all"}}}, **groups)
    assert {i.env["UCX_NET_DEVICES"] for i in env.instances} == {"all"}
    # an engine reachable from elsewhere, or a GPU fleet: UCX chooses
    wide = {**groups, "decode": [{"host": "10.0.0.2", "cpu_cores": [1]}]}
    assert all("UCX_NET_DEVICES" not in i.env for i in plan_of(fleet=cpu, **wide).instances)
    assert all("UCX_NET_DEVICES" not in i.env for i in plan_of().instances)
