"""pdctl's alerts as Prometheus alerting rules.

Codes, severities, titles and messages come from :mod:`pdctl.sdk.metrics.alerts` (the
table the live monitor evaluates); this module adds each alert's PromQL condition over
the labels the generated scrape configuration sets (``fleet``, ``role``, ``group``,
``instance``). Counter conditions look at the increase over ``window`` (the monitor's
sliding window: 60 s by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.metrics.alerts import RULES, AlertRule, pair_subject
from pdctl.sdk.spec import FleetSpec

BY = "sum by (fleet, role, group, instance)"
PROM_INSTANCE = "{{ $labels.instance }}"
PROM_PAIR = pair_subject("{{ $labels.prefill }}", "{{ $labels.decode }}")
"""The subject of a per-pair alert (PA013), as the live monitor names it."""


def _prom_value(rule: AlertRule) -> str:
    if rule.value_format.endswith("%"):
        return "{{ $value | humanizePercentage }}"
    return '{{ $value | printf "%' + rule.value_format + '" }}'


@dataclass(frozen=True)
class RuleOptions:
    window: str = "1m"
    """Range of the counter conditions (the live monitor's window)."""
    down_for: str = "15s"
    """How long an instance must fail its scrapes before PA006 fires."""
    expected_throughput_bps: float | None = None
    """PA004's reference (``pdctl preflight``); PA004 is left out without it."""
    kv_full: float = 0.9


def expressions(spec: FleetSpec, opt: RuleOptions) -> dict[str, str]:
    """PromQL per alert code, for the alerts that apply to this fleet."""
    f = f'fleet="{spec.fleet.name}"'
    w = opt.window
    mode = spec.fleet.mode

    def inc(metric: str, extra: str = "") -> str:
        sel = f"{f}, {extra}" if extra else f
        return f"{BY} (increase({metric}{{{sel}}}[{w}]))"

    out: dict[str, str] = {}
    if mode in ("push", "pull"):
        out["PA001"] = (
            inc("vllm:prompt_tokens_by_source_total", 'role="decode", source="local_compute"')
            + " > 0 unless "
            + inc(
                "vllm:prompt_tokens_by_source_total",
                'role="decode", source="external_kv_transfer"',
            )
            + " > 0"
        )
    out["PA002"] = inc("vllm:nixl_num_kv_expired_reqs_total") + " > 0"
    failed = '__name__=~"vllm:nixl_num_failed_(transfers|notifications)_total"'
    out["PA003"] = f"{BY} (increase({{{failed}, {f}}}[{w}])) > 0"
    if opt.expected_throughput_bps:
        gbps = opt.expected_throughput_bps / 1e9
        out["PA004"] = (
            f"{BY} (rate(vllm:nixl_bytes_transferred_sum{{{f}}}[{w}])) / 1e9 < {0.25 * gbps:g}"
            f" and {BY} (increase(vllm:nixl_bytes_transferred_count{{{f}}}[{w}])) > 0"
        )
    if mode in ("push", "pull") and spec.router is not None:
        # the router's canary counters, primed at 0 per pair: no absent-series gap
        out["PA013"] = (
            "sum by (fleet, prefill, decode) (increase(pdctl_router_canary_total"
            f'{{{f}, result="diverged"}}[{w}])) > 0'
        )
    if mode == "push" and spec.router is not None:
        out["PA005"] = (
            "sum by (fleet, instance) (increase(pdctl_router_requests_total"
            f'{{{f}, mode="push-sequential"}}[{w}])) > 0'
        )
    out["PA006"] = f'up{{{f}, role!="router"}} == 0'
    out["PA007"] = (
        f'max by (fleet, role, group, instance) (vllm:kv_cache_usage_perc{{{f}, role="decode"}})'
        f" >= {opt.kv_full:g}"
    )
    engines = f'{f}, role!="router"'
    out["PA010"] = (
        f"max by (fleet, role, group, instance) (vllm:kv_cache_usage_perc{{{engines}}}) > 0"
        f" and on (fleet, instance) max by (fleet, role, group, instance) "
        f"(vllm:num_requests_running{{{engines}}}) == 0"
        f" and on (fleet, instance) max by (fleet, role, group, instance) "
        f"(vllm:num_requests_waiting{{{engines}}}) == 0"
    )
    out["PA011"] = f"ceil(changes(up{{{engines}}}[10m]) / 2) >= 2"
    if mode == "push" and spec.fleet.connector == "pdctl":
        out["PA008"] = inc(rv.EXPIRED + "_total") + " > 0"
        out["PA009"] = inc(rv.RECEIVE_FAILURES + "_total") + " > 0"
        out["PA012"] = inc(rv.KV_VERIFY + "_total", f'{rv.RESULT_LABEL}="mismatch"') + " > 0"
    return out


def rule_groups(spec: FleetSpec, opt: RuleOptions | None = None) -> dict[str, Any]:
    """A Prometheus rule file (``groups:``) with one rule per applicable alert."""
    opt = opt or RuleOptions()
    exprs = expressions(spec, opt)
    rules: list[dict[str, Any]] = []
    for rule in RULES:
        expr = exprs.get(rule.code)
        if expr is None:
            continue
        extra = {}
        if rule.code == "PA004" and opt.expected_throughput_bps:
            extra["expected"] = f"{opt.expected_throughput_bps / 1e9:.2f}"
        if rule.code == "PA006":
            extra["detail"] = " (Prometheus cannot scrape it)"
        if rule.code == "PA010":
            extra["detail"] = "5 s or more"
        if rule.code == "PA011":
            extra["detail"] = "10 min"
        rules.append(
            {
                "alert": rule.code,
                "expr": expr,
                "for": {"PA006": opt.down_for, "PA010": "5s"}.get(rule.code, "0s"),
                "labels": {"severity": rule.severity, "code": rule.code},
                "annotations": {
                    "summary": rule.title,
                    "description": rule.message.format(
                        instance=PROM_PAIR if rule.code == "PA013" else PROM_INSTANCE,
                        value=_prom_value(rule),
                        **extra,
                    ),
                },
            }
        )
    return {"groups": [{"name": f"pdctl-{spec.fleet.name}", "rules": rules}]}
