"""``[observability] prometheus = true`` with fake engines: `up` starts a real Prometheus
as one more supervised process with the generated configuration; `down` stops it."""

from __future__ import annotations

import asyncio
import os
import shutil

import httpx
import pytest

from pdctl.sdk.fleet import AsyncFleet, fleet_status
from tests.conftest import free_ports, port_free
from tests.unit.test_launcher import fake_python, make_spec, state_root

__all__ = ["fake_python", "state_root"]  # fixtures

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,  # a real Prometheus scraping a fleet of fake engines
    pytest.mark.skipif(
        PROMETHEUS is None and not os.environ.get("PDCTL_REQUIRE_PROMETHEUS"),
        reason="prometheus not installed (scripts/install-prometheus.sh installs it)",
    ),
]


async def test_up_starts_and_down_stops_prometheus(fake_python, state_root):
    assert PROMETHEUS, "PDCTL_REQUIRE_PROMETHEUS is set but prometheus is not on PATH"
    spec = make_spec(fake_python)
    (port,) = free_ports(1)
    spec.observability = spec.observability.model_copy(
        update={"prometheus": True, "prometheus_port": port, "scrape_interval": "1s"}
    )
    fleet = AsyncFleet(spec, grace=2, ready_timeout=60)
    await fleet.up()
    try:
        states = {i.name: i.state for i in await fleet.status()}
        assert states == {"prefill-0": "ready", "decode-0": "ready", "prometheus": "ready"}
        st = await fleet_status("t")
        assert "prometheus" in {i.name for i in st.instances}
        home = state_root / "t" / "prometheus"
        assert (home / "prometheus.yml").exists()
        assert (home / "pdctl-rules.yml").exists()
        async with httpx.AsyncClient() as c:
            labels: list[tuple[str, str]] = []
            for _ in range(100):  # Prometheus applies discovered targets every few seconds
                targets = (await c.get(f"http://127.0.0.1:{port}/api/v1/targets")).json()
                labels = sorted(
                    (t["labels"]["instance"], t["labels"]["role"])
                    for t in targets["data"]["activeTargets"]
                )
                if labels:
                    break
                await asyncio.sleep(0.2)
            assert labels == [("decode-0", "decode"), ("prefill-0", "prefill")]
            rules = (await c.get(f"http://127.0.0.1:{port}/api/v1/rules")).json()
            names = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
            assert {"PA006", "PA007"} <= names
    finally:
        await fleet.down()
    assert port_free(port)
