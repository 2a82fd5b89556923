"""The files of the local Prometheus of ``[observability] prometheus = true``
(``prometheus.yml`` and ``pdctl-rules.yml``), written into the fleet's state directory by
``pdctl up``; its launch plan is :mod:`pdctl.sdk.fleetplan.prometheus`."""

from __future__ import annotations

from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.fleetplan.prometheus import PrometheusFiles
from pdctl.sdk.observability.rules import rule_groups
from pdctl.sdk.observability.scrape import scrape_config
from pdctl.sdk.observability.yamltext import dump
from pdctl.sdk.spec import FleetSpec


def write_prometheus_files(spec: FleetSpec, plan: FleetPlan, files: PrometheusFiles) -> None:
    """Write the scrape configuration and the alert rules the local Prometheus loads."""
    files.home.mkdir(parents=True, exist_ok=True)
    files.rules.write_text(dump(rule_groups(spec)))
    cfg = scrape_config(
        spec, plan, interval=spec.observability.scrape_interval, rule_files=[str(files.rules)]
    )
    files.config.write_text(dump(cfg))
