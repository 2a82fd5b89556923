"""Every lint rule: one spec that triggers it and one close variant that does not."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.errors import LintFailed
from pdctl.sdk.lint import RULES, lint, require_clean
from pdctl.sdk.spec import FleetSpec
from tests.conftest import spec_dict

Case = Callable[[Path], dict[str, Any]]


def _gpu(**kw: Any) -> dict[str, Any]:
    return spec_dict(**kw)


def _cpu(**kw: Any) -> dict[str, Any]:
    d = spec_dict(
        fleet={"platform": "cpu", "block_size": 32},
        prefill=[{"host": "127.0.0.1", "cpu_cores": [0]}],
        decode=[{"host": "127.0.0.1", "cpu_cores": [1]}],
    )
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return d


def _two_hosts(sc_host: str | None) -> dict[str, Any]:
    p: dict[str, Any] = {"host": "10.0.0.1", "devices": [0]}
    if sc_host:
        p["side_channel_host"] = sc_host
    return _gpu(prefill=[p], decode=[{"host": "10.0.0.2", "devices": [0]}])


def _mla_model(model_dir: Callable[..., Path], mla: bool) -> str:
    cfg: dict[str, Any] = {
        "model_type": "deepseek_v3" if mla else "llama",
        "num_attention_heads": 8,
    }
    if mla:
        cfg["kv_lora_rank"] = 512
    return str(model_dir(cfg))


def _kv_model(model_dir: Callable[..., Path], kv_heads: int) -> str:
    cfg = {"model_type": "llama", "num_attention_heads": 16, "num_key_value_heads": kv_heads}
    return str(model_dir(cfg))


def _kube(k8s: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """A GPU spec on the k8s backend (no devices: the device plugin picks them)."""
    kw.setdefault("prefill", [{}])
    kw.setdefault("decode", [{}])
    d = _gpu(**kw)
    d["backend"] = {"kind": "k8s", "k8s": {"image": "img:1", **(k8s or {})}}
    return d


def _on_ray(groups: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """A spec on the ray backend (``groups``: backend.ray.groups)."""
    d = _gpu(**kw)
    d["backend"] = {"kind": "ray", "ray": {"groups": groups or {}}}
    return d


# code -> (triggering spec, clean spec); model_dir passed for rules that read config.json
CASES: dict[str, tuple[Callable[[Any], dict[str, Any]], Callable[[Any], dict[str, Any]]]] = {
    "PD001": (
        lambda md: _gpu(prefill=[{"devices": [0], "http_port": 18000}]),
        lambda md: _gpu(prefill=[{"devices": [0], "http_port": 18001}]),
    ),
    "PD003": (
        lambda md: _two_hosts("127.0.0.1"),
        lambda md: _two_hosts(None),
    ),
    "PD004": (
        lambda md: _gpu(prefill=[{"host": "0.0.0.0", "devices": [0]}]),
        lambda md: _gpu(
            prefill=[{"host": "0.0.0.0", "side_channel_host": "127.0.0.1", "devices": [0]}]
        ),
    ),
    "PD005": (  # push P TP1 -> D TP4 on 2 KV heads: decode's KV replicated, refused
        lambda md: _gpu(
            model={"path": _kv_model(md, 2)},
            prefill=[{"devices": [0]}],
            decode=[{"tp": 4, "devices": [1, 2, 3, 4]}],
        ),
        lambda md: _gpu(
            model={"path": _kv_model(md, 4)},
            prefill=[{"devices": [0]}],
            decode=[{"tp": 4, "devices": [1, 2, 3, 4]}],
        ),
    ),
    "PD006": (
        lambda md: _gpu(decode=[{"pp": 2, "devices": [1, 2]}]),
        lambda md: _gpu(prefill=[{"pp": 2, "devices": [1, 2]}], decode=[{"devices": [3]}]),
    ),
    "PD007": (  # push: prefill validates; its block size must be a multiple of decode's
        lambda md: _gpu(decode=[{"devices": [1], "block_size": 256}]),
        lambda md: _gpu(decode=[{"devices": [1], "block_size": 64}]),
    ),
    "PD008": (
        lambda md: _cpu(fleet={"block_size": 16}),
        lambda md: _cpu(fleet={"block_size": 64}),
    ),
    "PD009": (
        lambda md: _gpu(fleet={"block_size": 16}),
        lambda md: _gpu(fleet={"block_size": 128}),
    ),
    "PD010": (
        lambda md: _gpu(prefill=[{"devices": [0], "engine_id": ""}]),
        lambda md: _gpu(prefill=[{"devices": [0], "engine_id": "p-{index}"}]),
    ),
    "PD011": (
        lambda md: _gpu(prefill=[{"count": 2, "devices": [0, 2], "engine_id": "p"}]),
        lambda md: _gpu(prefill=[{"count": 2, "devices": [0, 2], "engine_id": "p{index}"}]),
    ),
    "PD012": (
        lambda md: _gpu(
            prefill=[{"count": 2, "tp": 2, "devices": [0, 2, 3]}], decode=[{"devices": [4, 5]}]
        ),
        lambda md: _gpu(
            prefill=[{"count": 2, "tp": 2, "devices": [0, 2, 3, 6]}], decode=[{"devices": [4, 5]}]
        ),
    ),
    "PD013": (
        lambda md: _gpu(decode=[{"devices": [0]}]),
        lambda md: _gpu(decode=[{"devices": [1]}]),
    ),
    "PD014": (
        lambda md: _gpu(fleet={"kv_lease_duration_s": 30, "push_registration_timeout_s": 480}),
        lambda md: _gpu(fleet={"kv_lease_duration_s": 480, "push_registration_timeout_s": 480}),
    ),
    "PD015": (
        lambda md: _gpu(decode=[{"devices": [1], "mode": "pull"}]),
        lambda md: _gpu(decode=[{"devices": [1], "mode": "push"}]),
    ),
    "PD016": (
        lambda md: _gpu(decode=[{"devices": [1], "vllm_args": ["--block-size=16"]}]),
        lambda md: _gpu(decode=[{"devices": [1], "vllm_args": ["--max-num-batched-tokens=2048"]}]),
    ),
    "PD017": (
        lambda md: _cpu(fleet={"kv_buffer_device": "cuda"}),
        lambda md: _cpu(fleet={"kv_buffer_device": "cpu"}),
    ),
    "PD018": (
        lambda md: _gpu(decode=[]),
        lambda md: _gpu(decode=[], fleet={"mode": "colocated"}),
    ),
    "PD019": (
        lambda md: _gpu(model={"path": "/nonexistent/model/dir"}),
        lambda md: _gpu(model={"path": str(md())}),
    ),
    "PD020": (
        lambda md: _cpu(fleet={"ucx": {"tls": "shm"}}),
        lambda md: _cpu(fleet={"ucx": {"tls": "shm,tcp"}}),
    ),
    "PD021": (
        lambda md: _gpu(router={"api_key": {"env": "PDCTL_TEST_SURELY_UNSET_KEY"}}),
        lambda md: _gpu(router={"api_key": {"env": "PDCTL_TEST_SET_KEY"}}),
    ),
    "PD022": (
        lambda md: _gpu(router={"concurrent": False}),
        lambda md: _gpu(router={"concurrent": False}, fleet={"mode": "pull"}),
    ),
    "PD023": (
        lambda md: _cpu(fleet={"connector": "stock"}),
        lambda md: _cpu(fleet={"connector": "stock", "cpu_tuning": False}),
    ),
    "PD024": (
        lambda md: _kube(prefill=[{"side_channel_host": "127.0.0.1"}]),
        lambda md: _kube(prefill=[{"host": "0.0.0.0"}]),
    ),
    "PD025": (
        lambda md: _kube({"gpu_resource": ""}),
        lambda md: _kube({"gpu_resource": ""}, fleet={"platform": "cpu", "block_size": 32}),
    ),
    "PD026": (
        lambda md: _kube(decode=[{"devices": [1]}]),
        lambda md: _kube(decode=[{"tp": 2}]),
    ),
    "PD027": (
        lambda md: _kube(prefill=[{"cpu_cores": [0, 1]}]),
        lambda md: _kube({"cpu": "2"}),
    ),
    "PD028": (
        lambda md: _kube(fleet={"nixl_backends": ["LIBFABRIC"]}),
        lambda md: _kube(
            {"rdma_resources": {"vpc.amazonaws.com/efa": 32}},
            fleet={"nixl_backends": ["LIBFABRIC"]},
        ),
    ),
    "PD029": (
        lambda md: _kube(fleet={"name": "My_Fleet"}),
        lambda md: _kube(fleet={"name": "my-fleet"}),
    ),
    "PD030": (
        lambda md: _kube({"gpus_per_node": 8}, prefill=[{"tp": 12}], decode=[{"tp": 12}]),
        lambda md: _kube({"gpus_per_node": 8}, prefill=[{"tp": 8, "pp": 2}], decode=[{"tp": 16}]),
    ),
    "PD031": (
        lambda md: _kube(model={"path": "~/models/tiny"}),
        lambda md: _kube(model={"path": "/models/tiny"}),
    ),
    "PD032": (
        lambda md: _on_ray(prefill=[{"side_channel_host": "127.0.0.1"}]),
        lambda md: _on_ray(prefill=[{"host": "127.0.0.1"}]),
    ),
    "PD033": (
        lambda md: _on_ray({"decode": {"num_gpus": 0}}),
        lambda md: _on_ray({"decode": {"num_gpus": 0.5}}),
    ),
    "PD034": (
        lambda md: _on_ray({"decode-a": {"resources": {"node_b": 1}}}),
        lambda md: _on_ray({"decode": {"resources": {"node_b": 1}}}),
    ),
    "PD035": (
        lambda md: _on_ray(prefill=[{}], decode=[{"devices": [1]}]),
        lambda md: _on_ray(prefill=[{}], decode=[{}]),
    ),
    "PD036": (
        lambda md: _gpu(observability={"prometheus": True, "prometheus_bin": "/no/prometheus"}),
        lambda md: _gpu(observability={"prometheus": True, "prometheus_bin": sys.executable}),
    ),
    "PD037": (
        lambda md: _kube(observability={"prometheus": True}),
        lambda md: _kube(observability={"prometheus": False}),
    ),
    "PD042": (
        lambda md: _cpu(fleet={"connector_options": {"pdctl_failpoint_write": "fail"}}),
        lambda md: _cpu(fleet={"connector_options": {"pdctl_nixl_sync_mode": "rw"}}),
    ),
    "PD044": (
        lambda md: _gpu(
            prefill=[{"tp": 6, "devices": list(range(6)), "vllm_args": ["-dcp", "2"]}],
            decode=[{"tp": 6, "devices": list(range(6, 12)), "vllm_args": ["-dcp=3"]}],
        ),
        lambda md: _gpu(
            prefill=[{"tp": 6, "devices": list(range(6)), "vllm_args": ["-dcp", "2"]}],
            decode=[
                {
                    "tp": 6,
                    "devices": list(range(6, 12)),
                    "vllm_args": ["--decode-context-parallel-size", "6"],
                }
            ],
        ),
    ),
    "PD043": (
        lambda md: _cpu(fleet={"connector_options": {"pdctl_nixl_sync_mode": "none"}}),
        lambda md: _cpu(fleet={"connector_options": {"pdctl_nixl_sync_mode": "strict"}}),
    ),
    "PD048": (
        lambda md: _cpu(fleet={"connector_options": {"pdctl_kv_verify_rate": "often"}}),
        lambda md: _cpu(fleet={"connector_options": {"pdctl_kv_verify_rate": 0.5}}),
    ),
    "PD049": (
        lambda md: _cpu(router={"canary": {"rate": 0.1}}, fleet={"mode": "colocated"}),
        lambda md: _cpu(router={"canary": {"rate": 0.1}}),
    ),
    "PD045": (
        lambda md: _gpu(router={"host": "0.0.0.0"}),
        lambda md: _gpu(
            router={
                "host": "0.0.0.0",
                "keys": [{"name": "ops", "role": "admin", "env": "PDCTL_TEST_SET_KEY"}],
            }
        ),
    ),
    "PD046": (
        lambda md: _gpu(router={"keys": [{"name": "k", "value": "inline-secret"}]}),
        lambda md: _gpu(router={"keys": [{"name": "k", "env": "PDCTL_TEST_SET_KEY"}]}),
    ),
    "PD047": (
        lambda md: _kube({"network_policies": False}),
        lambda md: _kube(),
    ),
    "PD039": (
        lambda md: _cpu(router={"policy": "cache_aware"}, fleet={"kv_events": False}),
        lambda md: _cpu(router={"policy": "cache_aware"}),
    ),
    "PD040": (
        lambda md: _cpu(
            router={"policy": "cache_aware"}, decode=[{"env": {"PYTHONHASHSEED": "1"}}]
        ),
        lambda md: _cpu(router={"policy": "cache_aware"}, fleet={"env": {"PYTHONHASHSEED": "1"}}),
    ),
    "PD050": (
        lambda md: _kube(
            {
                "rdma_resources": {"rdma/ib": 1},
                "pod_patch": [{"op": "remove", "path": "/spec/containers/0/securityContext"}],
            }
        ),
        lambda md: _kube({"rdma_resources": {"rdma/ib": 1}}),
    ),
    # [router.admission]: more cases of each in test_lint_admission.py
    "PD052": (
        lambda md: _gpu(router={"request_timeout_s": 5, "admission": {"max_queue_wait_s": 5}}),
        lambda md: _gpu(router={"request_timeout_s": 5, "admission": {"max_queue_wait_s": 4}}),
    ),
    "PD053": (
        lambda md: _gpu(router={"admission": {"scrape_interval_s": 0}}),
        lambda md: _gpu(router={"admission": {"scrape_interval_s": 0.5, "stale_after_s": 2}}),
    ),
    "PD054": (
        lambda md: _gpu(decode=[{"devices": [1], "vllm_args": ["--max-num-seqs", "16"]}]),
        lambda md: _gpu(
            decode=[{"devices": [1], "vllm_args": ["--max-num-seqs", "16"]}],
            router={
                "admission": {
                    "decode_in_flight_per_instance": 16,
                    "prefill_in_flight_per_instance": 16,
                }
            },
        ),
    ),
    "PD055": (
        lambda md: _gpu(prefill=[{"devices": [0], "vllm_args": ["--scheduling-policy=priority"]}]),
        lambda md: _gpu(fleet={"vllm_args": ["--scheduling-policy=priority"]}),
    ),
}

ENV = {"PDCTL_TEST_SET_KEY": "secret"}


def codes(d: dict[str, Any]) -> set[str]:
    return {f.code for f in lint(FleetSpec(**d), check_bound_ports=False, environ=ENV).findings}


def test_every_rule_has_a_case():
    # PD051: values the spec refuses when read (test_lint_admission.py builds them)
    assert {r.code for r in RULES} == set(CASES) | {"PD002", "PD038", "PD041", "PD051"}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_triggers(code, model_dir):
    trigger, _ = CASES[code]
    assert code in codes(trigger(model_dir))


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_stays_quiet(code, model_dir):
    _, clean = CASES[code]
    assert code not in codes(clean(model_dir))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pd002_port_already_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = FleetSpec(**_gpu(router={"port": port}))
        # only this port's finding: other listeners on the machine may hold the spec's
        found = [f for f in lint(spec).findings if f.code == "PD002" and str(port) in f.message]
        assert found
        assert found[0].field == "router.port"
    port = _free_port()
    spec = FleetSpec(**_gpu(router={"port": port}))
    assert not [f for f in lint(spec).findings if f.code == "PD002" and str(port) in f.message]


def test_pd002_skipped_when_asked():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        spec = FleetSpec(**_gpu(router={"port": s.getsockname()[1]}))
        report = lint(spec, check_bound_ports=False)
    assert "PD002" not in {f.code for f in report.findings}
    assert any("PD002" in n for n in report.notes)


def test_findings_name_field_cost_and_fix(model_dir):
    for code, (trigger, _) in CASES.items():
        for f in lint(
            FleetSpec(**trigger(model_dir)), check_bound_ports=False, environ=ENV
        ).findings:
            if f.code == code:
                assert all((f.field, f.message, f.cost, f.fix)), f


def test_dp_side_channel_ranges_collide_with_explicit_ports():
    d = _gpu(
        prefill=[{"devices": [0, 1], "dp": 2, "side_channel_port": 6000}],
        decode=[{"devices": [2], "side_channel_port": 6001}],
    )
    assert "PD001" in codes(d)


def test_exit_codes(monkeypatch):
    # PD041 warns unless the vLLM installed here has the fix: not what this test is about
    from pdctl.sdk.lint import cache as cache_rules

    monkeypatch.setattr(cache_rules, "push_prefix_fix_present", lambda: True)
    clean = lint(FleetSpec(**_gpu()), check_bound_ports=False)
    assert clean.exit_code() == 0
    assert clean.exit_code(strict=True) == 0
    warn = lint(FleetSpec(**_gpu(fleet={"block_size": 16})), check_bound_ports=False)
    assert warn.exit_code() == 0
    assert warn.exit_code(strict=True) == 1
    err = lint(FleetSpec(**_gpu(decode=[{"devices": [0]}])), check_bound_ports=False)
    assert err.exit_code() == 2


def test_require_clean_refuses_errors():
    report = lint(FleetSpec(**_gpu(decode=[{"devices": [0]}])), check_bound_ports=False)
    with pytest.raises(LintFailed, match="PD013"):
        require_clean(report)
    ok = lint(FleetSpec(**_gpu()), check_bound_ports=False)
    assert require_clean(ok) is ok.plan


def test_pd038_router_traces_without_opentelemetry(monkeypatch):
    import importlib.util

    traced = _gpu(router={"port": 18000, "otlp_endpoint": "http://c:4318"})
    assert "PD038" not in codes(traced)  # OpenTelemetry is installed here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    assert "PD038" in codes(traced)
    assert "PD038" not in codes(_gpu(router={"port": 18000}))


def test_failpoints_pass_lint_only_where_tests_allow_them():
    d = _cpu(fleet={"connector_options": {"pdctl_failpoint_write": "fail"}})
    allowed = lint(FleetSpec(**d), check_bound_ports=False, environ={"PDCTL_ALLOW_FAILPOINTS": "1"})
    assert "PD042" not in {f.code for f in allowed.findings}


def test_unknown_sync_mode_is_an_error_naming_the_field():
    d = _cpu(fleet={"connector_options": {"pdctl_nixl_sync_mode": "fast"}})
    (f,) = [f for f in lint(FleetSpec(**d), check_bound_ports=False).findings if f.code == "PD043"]
    assert f.severity == "error"
    assert f.field == "fleet.connector_options.pdctl_nixl_sync_mode"


def _cache_findings(d: dict[str, Any]) -> list[Any]:
    return lint(FleetSpec(**d), check_bound_ports=False, environ=ENV).findings


def test_pd040_hash_algo_block_size_and_seed():
    cache = {"policy": "cache_aware"}
    xx = _cpu(router=cache, fleet={"prefix_caching_hash_algo": "xxhash"})
    assert "fleet.prefix_caching_hash_algo" in {f.field for f in _cache_findings(xx)}
    seeded = _cpu(
        router=cache, fleet={"prefix_caching_hash_algo": "xxhash", "env": {"PYTHONHASHSEED": "7"}}
    )
    assert "PD040" not in {f.code for f in _cache_findings(seeded)}
    sizes = _cpu(router=cache, decode=[{"host": "127.0.0.1", "cpu_cores": [1], "block_size": 64}])
    assert "block_size" in {f.field for f in _cache_findings(sizes) if f.code == "PD040"}
    # not cache_aware: nothing to agree on
    assert "PD040" not in codes(_cpu(decode=[{"env": {"PYTHONHASHSEED": "1"}}]))


def test_pd041_push_decode_prefix_caching_without_the_fix(monkeypatch):
    from pdctl.sdk.lint import cache

    monkeypatch.setattr(cache, "push_prefix_fix_present", lambda: False)
    on = _cpu(fleet={"enable_prefix_caching": True})
    (f,) = [f for f in _cache_findings(on) if f.code == "PD041"]
    assert f.severity == "warning"
    assert "--no-enable-prefix-caching" in f.fix
    assert "PD041" in codes(_cpu())  # vLLM's default is prefix caching on
    assert "PD041" not in codes(_cpu(fleet={"enable_prefix_caching": False}))
    off_on_decode = _cpu(
        fleet={"enable_prefix_caching": True},
        decode=[
            {"host": "127.0.0.1", "cpu_cores": [1], "vllm_args": ["--no-enable-prefix-caching"]}
        ],
    )
    assert "PD041" not in codes(off_on_decode)
    assert "PD041" not in codes(_cpu(fleet={"mode": "pull", "enable_prefix_caching": True}))
    monkeypatch.setattr(cache, "push_prefix_fix_present", lambda: True)
    assert "PD041" not in codes(on)


def test_push_prefix_fix_detected_in_installed_vllm():
    pytest.importorskip("vllm")  # only located, never imported by the rule
    from pdctl.sdk.lint.cache import push_prefix_fix_present

    assert push_prefix_fix_present() is True


def test_kv_event_ports_are_planned_and_checked():
    from pdctl.sdk.fleetplan import build_plan

    d = _cpu(router={"policy": "cache_aware"})
    plan = build_plan(FleetSpec(**d))
    ports = [i.kv_events_port for i in plan.instances]
    assert ports == [5557, 5559]
    for i in plan.instances:
        cfg = i.argv[i.argv.index("--kv-events-config") + 1]
        assert f'"endpoint":"tcp://*:{i.kv_events_port}"' in cfg
        assert f'"replay_endpoint":"tcp://*:{i.kv_events_ports[1]}"' in cfg
    # an explicit HTTP port on the way: automatic KV event ports step around it
    d["prefill"][0]["http_port"] = 5558
    plan = build_plan(FleetSpec(**d))
    assert all(5558 not in i.kv_events_ports for i in plan.instances)
    # off by default without cache_aware
    assert all(i.kv_events_port is None for i in build_plan(FleetSpec(**_cpu())).instances)


def pd049(d: dict[str, Any]) -> list[Any]:
    found = lint(FleetSpec(**d), check_bound_ports=False, environ=ENV).findings
    return [f for f in found if f.code == "PD049"]


def test_canary_notes_its_cost_and_warns_of_prompts_sent_off_host():
    high = pd049(_cpu(router={"canary": {"rate": 0.5}}))
    assert [(f.severity, f.field) for f in high] == [("info", "router.canary.rate")]
    assert "50% more greedy load" in high[0].cost
    ref = {"rate": 0.05, "target": "reference", "reference_url": "http://10.0.0.9:8000"}
    off_host = pd049(_cpu(router={"canary": ref}))
    assert [(f.severity, f.field) for f in off_host] == [("warning", "router.canary.reference_url")]
    local = {**ref, "reference_url": "http://127.0.0.1:9000"}
    assert "PD049" not in codes(_cpu(router={"canary": local}))
    assert "PD049" not in codes(_cpu())  # off by default


def test_canary_notes_its_tolerance_on_heterogeneous_tp_pairs():
    hetero = _gpu(
        prefill=[{"host": "127.0.0.1", "devices": [0, 1], "tp": 2}],
        router={"canary": {"rate": 0.05}},
    )
    (note,) = pd049(hetero)
    assert (note.severity, note.field) == ("info", "router.canary.tie_tolerance")
    assert "TP2→TP1" in note.message
    assert "0.05" in note.message
    assert pd049(_gpu(router={"canary": {"rate": 0.05}})) == []  # equal TP: exact


def test_kv_verify_notes_the_layouts_it_does_not_cover():
    hetero = _gpu(prefill=[{"host": "127.0.0.1", "devices": [0, 1], "tp": 2}])
    found = lint(FleetSpec(**hetero), check_bound_ports=False, environ=ENV).findings
    notes = [f for f in found if f.code == "PD048"]
    assert notes, [f.code for f in found]
    assert all(f.severity == "info" for f in notes)
    assert any("heterogeneous TP" in f.message for f in notes)
    off = _gpu(
        prefill=[{"host": "127.0.0.1", "devices": [0, 1], "tp": 2}],
        fleet={"connector_options": {"pdctl_kv_verify_rate": 0}},
    )
    assert "PD048" not in codes(off)
    assert "PD048" not in codes(_cpu())  # equal TP, no PP: covered


def pd048(kv_heads: int | None, p_tp: int, d_tp: int, mla: bool = False) -> list[str]:
    model: dict[str, Any] = {"path": "org/some-model", "served_name": "m", "mla": mla}
    if kv_heads is not None:
        model["kv_heads"] = kv_heads
    d = _gpu(
        model=model,
        prefill=[{"host": "127.0.0.1", "devices": list(range(p_tp)), "tp": p_tp}],
        decode=[{"host": "127.0.0.2", "devices": list(range(d_tp)), "tp": d_tp}],
    )
    found = lint(FleetSpec(**d), check_bound_ports=False, environ=ENV).findings
    return [f.message for f in found if f.code == "PD048"]


def test_kv_verify_covers_prefill_tp_a_multiple_of_decode_tp_within_the_kv_heads():
    assert pd048(8, 2, 1) == []  # 2 head slices per decode block
    assert pd048(8, 8, 2) == []
    assert pd048(2, 2, 1) == []  # the CPU demo's tiny model at P TP2 → D TP1
    (replicated,) = pd048(8, 16, 8)
    assert "prefill TP16 → decode TP8" in replicated
    assert "above the model's 8 KV heads" in replicated
    (wider,) = pd048(8, 1, 2)
    assert "decode TP above prefill TP" in wider
    (mla,) = pd048(None, 2, 1, mla=True)
    assert "MLA across TP sizes" in mla
    (unknown,) = pd048(None, 2, 1)  # a hub model lint cannot read: said, not assumed
    assert "set model.kv_heads" in unknown


def test_kv_verify_lint_agrees_with_the_connectors_head_slices():
    from pdctl.connector.kvslice import covered  # pure Python: what the connector checks

    seen = set()
    for heads, p_tp, d_tp in product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16)):
        if p_tp < d_tp:
            continue
        noted = pd048(heads, p_tp, d_tp)
        assert (noted == []) == covered(p_tp, d_tp, heads), (heads, p_tp, d_tp, noted)
        seen.add(noted == [])
    assert seen == {True, False}
