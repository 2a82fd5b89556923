"""Watching a fleet where its backend put it: `pdctl metrics`, `status --once` and the UI
scrape the addresses the backend reports, not the spec's loopback hosts."""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk import backends
from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES


def demo() -> FleetSpec:
    return load_spec(EXAMPLES / "cpu-1p1d.toml", environ={}).spec


def test_local_fleets_are_watched_as_written(model_dir):
    spec = demo()
    spec.model.path = str(model_dir())  # lint wants the local model the example names
    seen, plan = backends.observed(spec)
    assert seen is spec
    assert [i.url for i in plan.instances] == [i.url for i in build_plan(spec).instances]


def test_other_backends_report_where_instances_run(monkeypatch: pytest.MonkeyPatch):
    spec = demo().model_copy(deep=True)
    spec.backend = spec.backend.model_copy(update={"kind": "ray"})
    placed = spec.model_copy(deep=True)
    placed.prefill[0].host = "10.0.0.7"
    placed.decode[0].host = "10.0.0.8"

    class Placed:
        def __init__(self, s: FleetSpec, **kw: Any) -> None:
            self.spec = s

        def resolved(self) -> FleetSpec:
            return placed

        def endpoints(self) -> Any:
            return build_plan(placed)

    monkeypatch.setitem(backends.FACTORIES, "ray", Placed)
    seen, plan = backends.observed(spec)
    assert seen is placed
    assert [i.host for i in plan.instances] == ["10.0.0.7", "10.0.0.8"]
