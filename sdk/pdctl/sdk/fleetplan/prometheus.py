"""The launch plan of the local Prometheus of ``[observability] prometheus = true``: which
binary, where its files live under the fleet's state directory, and its command line.

Pure over the spec (the binary is looked up on ``PATH``); the files themselves are written
by :func:`pdctl.sdk.observability.promfiles.write_prometheus_files`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from pdctl.sdk.fleetplan.build import prometheus_plan
from pdctl.sdk.fleetplan.model import InstancePlan
from pdctl.sdk.spec import FleetSpec

INSTALL_HINT = (
    "install the distribution's package (scripts/install-prometheus.sh, or "
    "`sudo apt-get install -y prometheus`), set observability.prometheus_bin to its path, "
    "or set observability.prometheus = false"
)


@dataclass(frozen=True)
class PrometheusFiles:
    """Where the local Prometheus keeps its configuration and data."""

    home: Path

    @classmethod
    def under(cls, state_dir: Path) -> PrometheusFiles:
        return cls(state_dir / "prometheus")

    @property
    def config(self) -> Path:
        return self.home / "prometheus.yml"

    @property
    def rules(self) -> Path:
        return self.home / "pdctl-rules.yml"

    @property
    def data(self) -> Path:
        return self.home / "data"


def prometheus_binary(spec: FleetSpec) -> str | None:
    """The Prometheus binary the spec names, resolved on PATH; None when missing."""
    return shutil.which(spec.observability.prometheus_bin)


def local_prometheus_plan(spec: FleetSpec, files: PrometheusFiles) -> InstancePlan | None:
    """The supervised process's plan over ``files`` (None when the spec does not ask for
    a local Prometheus)."""
    o = spec.observability
    if not o.prometheus:
        return None
    host = o.prometheus_host if ":" not in o.prometheus_host else f"[{o.prometheus_host}]"
    argv = (
        prometheus_binary(spec) or o.prometheus_bin,
        f"--config.file={files.config}",
        f"--storage.tsdb.path={files.data}",
        f"--storage.tsdb.retention.time={o.retention}",
        f"--web.listen-address={host}:{o.prometheus_port}",
        "--web.enable-lifecycle",
    )
    return prometheus_plan(spec, argv)
