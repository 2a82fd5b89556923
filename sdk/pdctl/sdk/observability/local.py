"""The local Prometheus of ``[observability] prometheus = true``: its configuration files
and command line, written into the fleet's state directory by ``pdctl up``."""

from __future__ import annotations

import shutil
from pathlib import Path

from pdctl.sdk.fleetplan import FleetPlan, InstancePlan, prometheus_plan
from pdctl.sdk.observability.rules import rule_groups
from pdctl.sdk.observability.scrape import scrape_config
from pdctl.sdk.observability.yamltext import dump
from pdctl.sdk.spec import FleetSpec

INSTALL_HINT = (
    "install the distribution's package (scripts/install-prometheus.sh, or "
    "`sudo apt-get install -y prometheus`), set observability.prometheus_bin to its path, "
    "or set observability.prometheus = false"
)


def prometheus_binary(spec: FleetSpec) -> str | None:
    """The Prometheus binary the spec names, resolved on PATH; None when missing."""
    return shutil.which(spec.observability.prometheus_bin)


def local_prometheus(spec: FleetSpec, plan: FleetPlan, state_dir: Path) -> InstancePlan | None:
    """Write ``prometheus.yml`` and ``pdctl-rules.yml`` under ``state_dir/prometheus`` and
    return the supervised process's plan (None when the spec does not ask for one)."""
    o = spec.observability
    if not o.prometheus:
        return None
    home = state_dir / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    rules = home / "pdctl-rules.yml"
    rules.write_text(dump(rule_groups(spec)))
    cfg = home / "prometheus.yml"
    cfg.write_text(
        dump(scrape_config(spec, plan, interval=o.scrape_interval, rule_files=[str(rules)]))
    )
    host = o.prometheus_host if ":" not in o.prometheus_host else f"[{o.prometheus_host}]"
    argv = (
        prometheus_binary(spec) or o.prometheus_bin,
        f"--config.file={cfg}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--storage.tsdb.retention.time={o.retention}",
        f"--web.listen-address={host}:{o.prometheus_port}",
        "--web.enable-lifecycle",
    )
    return prometheus_plan(spec, argv)
