"""What a fleet hands to the operator's monitoring stack: Prometheus scrape configuration,
alert rules and Grafana dashboards, all derived from the spec, the plan and pdctl's own
alert table."""

from pdctl.sdk.observability.dashboards import Dashboard, Panel, Query, dashboards, grafana_json
from pdctl.sdk.observability.rules import RuleOptions, rule_groups
from pdctl.sdk.observability.scrape import (
    ScrapeTarget,
    file_sd,
    pod_monitor,
    scrape_config,
    scrape_targets,
)
from pdctl.sdk.observability.yamltext import dump as to_yaml

__all__ = [
    "Dashboard",
    "Panel",
    "Query",
    "RuleOptions",
    "ScrapeTarget",
    "dashboards",
    "file_sd",
    "grafana_json",
    "pod_monitor",
    "rule_groups",
    "scrape_config",
    "scrape_targets",
    "to_yaml",
]
