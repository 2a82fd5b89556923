"""Grafana dashboards for a pdctl fleet: overview, rendezvous, transfers, latency, router.

Every query uses only series that vLLM 0.32/0.33 exports, pdctl's connector exports
(``pdctl:*``) or the router exports (``pdctl_router_*``), selected by the labels of the
generated scrape configuration. Queries use Grafana's ``$fleet`` variable and
``$__rate_interval``; :func:`expand` substitutes both as Grafana would, so a test can run
every panel's query against Prometheus itself.

Every counter a query reads is exported at 0 from start-up for its known label values
(the router primes its counters, the connector its labelled ``pdctl:*`` counters), so a
healthy fleet shows 0 retries or expiries, not "No data".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.metrics import rendezvous as rv

F = 'fleet="$fleet"'
RI = "$__rate_interval"
FRONT = 'role=~"decode|colocated"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("pdctl",))


def _q(expr: str, legend: str) -> Query:
    return Query(expr, legend)


def _quantiles(
    metric: str, sel: str, by: str, qs: tuple[float, ...] = (0.5, 0.99)
) -> tuple[Query, ...]:
    legend_by = " ".join("{{" + b.strip() + "}}" for b in by.split(",") if b.strip())
    return tuple(
        _q(
            f"histogram_quantile({q:g}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"p{q * 100:g} {legend_by}".strip(),
        )
        for q in qs
    )


def _rate(metric: str, sel: str, by: str, legend: str) -> Query:
    return _q(f"sum by ({by}) (rate({metric}{{{sel}}}[{RI}]))", legend)


def overview() -> Dashboard:
    return Dashboard(
        "pdctl-overview",
        "pdctl / fleet overview",
        (
            Panel("Instances up", "none", (_q(f"up{{{F}}}", "{{instance}} ({{role}})"),)),
            Panel(
                "Finished requests / s by role",
                "reqps",
                (_rate("vllm:request_success_total", F, "role", "{{role}}"),),
            ),
            Panel(
                "Running and waiting requests",
                "none",
                (
                    _q(
                        f"sum by (instance) (vllm:num_requests_running{{{F}}})",
                        "running {{instance}}",
                    ),
                    _q(
                        f"sum by (instance) (vllm:num_requests_waiting{{{F}}})",
                        "waiting {{instance}}",
                    ),
                ),
            ),
            Panel(
                "KV cache usage",
                "percentunit",
                (_q(f"max by (instance) (vllm:kv_cache_usage_perc{{{F}}})", "{{instance}}"),),
            ),
            Panel(
                "Decode prompt tokens by source / s",
                "short",
                (
                    _rate(
                        "vllm:prompt_tokens_by_source_total",
                        f'{F}, role="decode"',
                        "instance, source",
                        "{{instance}} {{source}}",
                    ),
                ),
                "external_kv_transfer is KV received from prefill; local_compute on decode "
                "is prefill work done twice (alert PA001).",
            ),
            Panel(
                "Generated tokens / s",
                "short",
                (_rate("vllm:generation_tokens_total", F, "instance", "{{instance}}"),),
            ),
        ),
    )


def latency() -> Dashboard:
    def front(metric: str) -> tuple[Query, ...]:
        return _quantiles(metric, f"{F}, {FRONT}", "instance", (0.5, 0.9, 0.99))

    return Dashboard(
        "pdctl-latency",
        "pdctl / latency",
        (
            Panel("TTFT (engine)", "s", front("vllm:time_to_first_token_seconds")),
            Panel("Inter-token latency", "s", front("vllm:inter_token_latency_seconds")),
            Panel("TPOT", "s", front("vllm:request_time_per_output_token_seconds")),
            Panel("End-to-end latency", "s", front("vllm:e2e_request_latency_seconds")),
            Panel(
                "Prefill time on prefill instances",
                "s",
                _quantiles("vllm:request_prefill_time_seconds", f'{F}, role="prefill"', "instance"),
            ),
            Panel(
                "Queue time",
                "s",
                _quantiles("vllm:request_queue_time_seconds", F, "instance"),
            ),
            Panel(
                "TTFT at the router",
                "s",
                _quantiles("pdctl_router_ttft_seconds", F, "mode"),
            ),
        ),
    )


def transfers() -> Dashboard:
    nixl = "vllm:nixl_"
    return Dashboard(
        "pdctl-transfers",
        "pdctl / KV transfers",
        (
            Panel(
                "KV bytes / s by initiator",
                "Bps",
                (_rate(nixl + "bytes_transferred_sum", F, "instance", "{{instance}}"),),
                "NIXL records on the WRITE initiator: prefill in push mode, decode in pull.",
            ),
            Panel(
                "Transfers / s by initiator",
                "ops",
                (_rate(nixl + "bytes_transferred_count", F, "instance", "{{instance}}"),),
            ),
            Panel(
                "Transfer time",
                "s",
                _quantiles(nixl + "xfer_time_seconds", F, "instance"),
            ),
            Panel(
                "Post time",
                "s",
                _quantiles(nixl + "post_time_seconds", F, "instance"),
            ),
            Panel(
                "Failed transfers, failed notifications, expired leases",
                "short",
                (
                    _q(
                        f"sum by (instance) (increase({nixl}num_failed_transfers_total"
                        f"{{{F}}}[{RI}]))",
                        "failed transfers {{instance}}",
                    ),
                    _q(
                        f"sum by (instance) (increase({nixl}num_failed_notifications_total"
                        f"{{{F}}}[{RI}]))",
                        "failed notifications {{instance}}",
                    ),
                    _q(
                        f"sum by (instance) (increase({nixl}num_kv_expired_reqs_total"
                        f"{{{F}}}[{RI}]))",
                        "expired leases {{instance}}",
                    ),
                ),
            ),
            Panel(
                "Requests / s per P→D pair",
                "reqps",
                (
                    _rate(
                        "pdctl_router_pair_requests_total",
                        F,
                        "prefill, decode, outcome",
                        "{{prefill}} → {{decode}} {{outcome}}",
                    ),
                ),
                "From the router: which prefill handed KV to which decode.",
            ),
            Panel(
                "Hand-off per P→D pair (decode first byte after prefill done)",
                "s",
                _quantiles("pdctl_router_pair_handoff_seconds", F, "prefill, decode"),
                "Transfer plus decode admission, as the router sees it.",
            ),
        ),
    )


def rendezvous() -> Dashboard:
    return Dashboard(
        "pdctl-rendezvous",
        "pdctl / push rendezvous",
        (
            Panel(
                "Waiting on prefill",
                "none",
                (
                    _q(
                        f"sum by (instance) ({rv.REGISTRATIONS_WAITING}{{{F}}})",
                        "registrations {{instance}}",
                    ),
                    _q(
                        f"sum by (instance) ({rv.PREFILLS_WAITING}{{{F}}})", "prefills {{instance}}"
                    ),
                    _q(f"sum by (instance) ({rv.WRITES_IN_FLIGHT}{{{F}}})", "writes {{instance}}"),
                ),
            ),
            Panel(
                "Matches / s by first arrival",
                "ops",
                (_rate(rv.MATCHES + "_total", F, "instance, order", "{{instance}} {{order}}"),),
            ),
            Panel("Match wait", "s", _quantiles(rv.MATCH_WAIT, F, "instance")),
            Panel("Match to WRITE done", "s", _quantiles(rv.MATCH_TO_DONE, F, "instance")),
            Panel(
                "Pushed bytes / s",
                "Bps",
                (_rate(rv.BYTES_PUSHED + "_total", F, "instance", "{{instance}}"),),
            ),
            Panel(
                "Decode: registration to notified",
                "s",
                _quantiles(rv.REGISTRATION_TO_NOTIFIED, F, "instance"),
            ),
            Panel(
                "Decode: awaiting notifications",
                "none",
                (_q(f"sum by (instance) ({rv.AWAITING_NOTIFICATIONS}{{{F}}})", "{{instance}}"),),
            ),
            Panel(
                "Expired entries and receive failures",
                "short",
                (
                    _q(
                        f"sum by (instance, side) (increase({rv.EXPIRED}_total{{{F}}}[{RI}]))",
                        "expired {{side}} {{instance}}",
                    ),
                    _q(
                        f"sum by (instance) (increase({rv.RECEIVE_FAILURES}_total{{{F}}}[{RI}]))",
                        "receive failures {{instance}}",
                    ),
                    _rate(
                        rv.REGISTRATIONS_SENT + "_total",
                        F,
                        "instance",
                        "registrations sent {{instance}}",
                    ),
                ),
            ),
        ),
    )


def router() -> Dashboard:
    r = "pdctl_router_"
    up = "exported_instance"
    return Dashboard(
        "pdctl-router",
        "pdctl / router",
        (
            Panel(
                "Requests / s by mode and outcome",
                "reqps",
                (
                    _rate(r + "requests_total", F, "mode, outcome", "{{mode}} {{outcome}}"),
                    _q(
                        f"sum by (role) (rate({r}retries_total{{{F}}}[{RI}]))",
                        "retries {{role}}",
                    ),
                ),
            ),
            Panel("Router TTFT", "s", _quantiles(r + "ttft_seconds", F, "mode")),
            Panel("Router end-to-end", "s", _quantiles(r + "e2e_seconds", F, "mode")),
            Panel("Prefill leg", "s", _quantiles(r + "prefill_leg_seconds", F, up)),
            Panel(
                "Leg overlap and decode after prefill",
                "s",
                (
                    *_quantiles(r + "leg_overlap_seconds", F, "mode", (0.5,)),
                    *_quantiles(r + "decode_first_byte_after_prefill_seconds", F, "mode", (0.5,)),
                ),
            ),
            Panel(
                "Output canary per P→D pair (replays / interval)",
                "short",
                (
                    _q(
                        f"sum by (prefill, decode, result) (increase({r}canary_total"
                        f"{{{F}}}[{RI}]))",
                        "{{prefill}} → {{decode}} {{result}}",
                    ),
                    _q(
                        f"sum by (reason) (increase({r}canary_dropped_total{{{F}}}[{RI}]))",
                        "dropped {{reason}}",
                    ),
                ),
                "router.canary: greedy answers replayed on one instance alone and compared "
                "(docs/router.md). diverged raises PA013; every pair is exported at 0, so a "
                "healthy fleet shows flat zero lines.",
            ),
            Panel(
                "Outstanding per upstream",
                "none",
                (_q(f"sum by ({up}) ({r}outstanding{{{F}}})", "{{" + up + "}}"),),
            ),
            Panel(
                "Upstream health and breakers",
                "none",
                (
                    _q(f"max by ({up}) ({r}instance_up{{{F}}})", "up {{" + up + "}}"),
                    _q(f"max by ({up}) ({r}breaker_open{{{F}}})", "breaker {{" + up + "}}"),
                ),
            ),
        ),
    )


def dashboards() -> tuple[Dashboard, ...]:
    return (overview(), rendezvous(), transfers(), latency(), router())


def expand(expr: str, fleet: str, rate_interval: str = "1m") -> str:
    """The query as Grafana sends it to Prometheus."""
    return expr.replace("$fleet", fleet).replace("$__rate_interval", rate_interval)


def grafana_json(d: Dashboard, fleet: str | None = None) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or provision it from a file),
    with a Prometheus data-source variable and a ``fleet`` variable."""
    ds = {"type": "prometheus", "uid": "${datasource}"}
    panels: list[dict[str, Any]] = []
    for n, p in enumerate(d.panels):
        panels.append(
            {
                "id": n + 1,
                "type": "timeseries",
                "title": p.title,
                "description": p.description,
                "datasource": ds,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + k),
                        "datasource": ds,
                        "expr": q.expr,
                        "legendFormat": q.legend,
                    }
                    for k, q in enumerate(p.queries)
                ],
            }
        )
    fleet_var: dict[str, Any] = {
        "name": "fleet",
        "label": "fleet",
        "type": "query",
        "datasource": ds,
        "query": {"query": "label_values(up, fleet)", "refId": "fleet"},
        "refresh": 2,
    }
    if fleet is not None:
        fleet_var["current"] = {"text": fleet, "value": fleet}
    return {
        "uid": d.uid,
        "title": d.title,
        "tags": list(d.tags),
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                },
                fleet_var,
            ]
        },
        "panels": panels,
    }
