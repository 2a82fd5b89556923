"""The ``vllm:*`` metric names pdctl reads: the monitor's series (sdk/metrics), the
Grafana dashboards and the Prometheus alert rules it generates (sdk/observability)."""

from __future__ import annotations

import json
import re
from itertools import product
from pathlib import Path

from pdctl.sdk.observability.dashboards import dashboards, grafana_json
from pdctl.sdk.observability.rules import RuleOptions, rule_groups
from pdctl.sdk.specload import load_spec

SDK = Path(__file__).resolve().parents[2] / "sdk" / "pdctl" / "sdk"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_NAME = re.compile(r"vllm:[a-z0-9_]+(?:\([a-z0-9_|]+\)[a-z0-9_]*)*")
_MONITOR_READS = re.compile(r"""(?:V \+ |window\(|dcount\()"([a-z0-9_]+)\"""")


def _expand(name: str) -> list[str]:
    """``vllm:a_(b|c)_d`` (a PromQL regex) -> ``vllm:a_b_d``, ``vllm:a_c_d``."""
    parts = re.split(r"\(([a-z0-9_|]+)\)", name)
    fixed, choices = parts[0::2], [p.split("|") for p in parts[1::2]]
    return [
        "".join(f + c for f, c in zip(fixed, (*combo, ""), strict=False))
        for combo in product(*choices)
    ]


def metric_names() -> dict[str, set[str]]:
    """name -> where pdctl reads it (names ending in ``_`` are family prefixes)."""
    found: dict[str, set[str]] = {}

    def note(text: str, where: str) -> None:
        for raw in _NAME.findall(text):
            for n in _expand(raw):
                found.setdefault(n, set()).add(where)

    for d in dashboards():
        note(json.dumps(grafana_json(d)), f"dashboard {d.uid}")
    for path in sorted(EXAMPLES.glob("*.toml")):
        spec = load_spec(path, environ={}).spec
        note(json.dumps(rule_groups(spec, RuleOptions(expected_throughput_bps=1e9))), "alerts")
    monitor = (SDK / "metrics" / "monitor.py").read_text()
    note(monitor, "monitor")
    for n in _MONITOR_READS.findall(monitor):
        found.setdefault("vllm:" + n, set()).add("monitor")
    return found
