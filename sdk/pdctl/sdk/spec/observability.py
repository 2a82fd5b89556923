"""``[observability]``: the operator's local Prometheus."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from pdctl.sdk.spec.base import Port, _Strict

_DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class ObservabilitySpec(_Strict):
    """The operator's monitoring stack: a local Prometheus scraping the fleet, the router's
    OpenTelemetry traces."""

    prometheus: bool = Field(
        default=False,
        description="`pdctl up` also starts a Prometheus (the `prometheus` binary) scraping "
        "every instance and the router with pdctl's alert rules, supervised like an instance.",
    )
    prometheus_host: str = Field(default="127.0.0.1", description="Where it listens.")
    prometheus_port: Port = Field(default=9090, description="Its HTTP port (UI and API).")
    prometheus_bin: str = Field(
        default="prometheus", description="The Prometheus binary (a name on PATH or a path)."
    )
    scrape_interval: str = Field(
        default="5s", description="Scrape and rule evaluation interval (a Prometheus duration)."
    )
    retention: str = Field(default="15d", description="How long it keeps samples.")

    @field_validator("scrape_interval", "retention")
    @classmethod
    def _duration(cls, v: str) -> str:
        if not _DURATION_RE.match(v):
            raise ValueError(f"{v!r} is not a Prometheus duration; write e.g. '5s', '1m', '15d'")
        return v
