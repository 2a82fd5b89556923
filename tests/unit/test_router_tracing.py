"""Trace context through the router: the client's traceparent (or a new one) on both legs,
one span per leg under the route span, exported over OTLP/HTTP when configured."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.tracing import Tracer, parse_traceparent
from pdctl.sdk.spec import FleetSpec
from tests.conftest import spec_dict
from tests.otlp import OtlpReceiver
from tests.unit.test_router import body, event_loop_policy, rig

__all__ = ["event_loop_policy"]  # the module's uvloop policy, as in test_router

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_parse_traceparent():
    assert parse_traceparent(INCOMING) == (TRACE, "00f067aa0ba902b7", "01")
    for bad in (None, "", "garbage", f"01-{TRACE}-00f067aa0ba902b7-01", f"00-{'0' * 32}-1-01"):
        assert parse_traceparent(bad) is None


def test_without_an_endpoint_ids_only():
    t = Tracer(None).begin(INCOMING)
    assert t.trace_id == TRACE
    p, d = t.start("prefill"), t.start("decode")
    ids = {parse_traceparent(x.traceparent) for x in (t.root, p, d)}
    assert len(ids) == 3
    assert all(i is not None and i[0] == TRACE for i in ids)
    assert t.header("prefill") == p.traceparent
    assert t.header("render") == t.root.traceparent  # no open render leg: the route span
    fresh = Tracer(None).begin("not a header")
    assert fresh.trace_id != TRACE
    assert fresh.flags == "01"


@pytest.mark.parametrize("incoming", [INCOMING, None], ids=["client-trace", "new-trace"])
async def test_both_legs_carry_the_trace(incoming):
    pcfg = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.05)
    async with rig("push", prefill=pcfg) as t, httpx.AsyncClient() as c:
        headers = {"traceparent": incoming} if incoming else {}
        r = await c.post(t.url + "/v1/completions", json=body(), headers=headers)
        assert r.status_code == 200, r.text
        (preq,), (dreq,) = t.p.state.requests, t.d.state.requests
        p, d = parse_traceparent(preq["traceparent"]), parse_traceparent(dreq["traceparent"])
        assert p is not None
        assert d is not None
        assert p[0] == d[0]
        assert p[1] != d[1]  # each leg its own span
        if incoming:
            assert p[0] == TRACE


async def test_spans_exported_with_parent_links():
    with OtlpReceiver() as rx:
        pcfg = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.05)
        async with (
            rig("push", prefill=pcfg, router={"otlp_endpoint": rx.url}) as t,
            httpx.AsyncClient() as c,
        ):
            r = await c.post(
                t.url + "/v1/completions", json=body(), headers={"traceparent": INCOMING}
            )
            assert r.status_code == 200, r.text
            (preq,), (dreq,) = t.p.state.requests, t.d.state.requests
        # leaving the rig stops the router, which flushes its spans
        for _ in range(100):
            if len(rx.trace(TRACE)) >= 3:
                break
            await asyncio.sleep(0.05)
        spans = {s.name: s for s in rx.trace(TRACE)}
        assert rx.errors == []
        assert set(spans) == {"route", "prefill leg", "decode leg"}
        route = spans["route"]
        assert route.parent_id == "00f067aa0ba902b7"
        assert route.service == "pdctl-router"
        assert route.attributes["pdctl.outcome"] == "ok"
        assert spans["prefill leg"].parent_id == route.span_id
        assert spans["decode leg"].parent_id == route.span_id
        assert spans["prefill leg"].attributes["pdctl.instance"] == "prefill-0"
        # what each engine was sent is its leg's span: engine spans become its children
        assert parse_traceparent(preq["traceparent"]) == (
            TRACE,
            spans["prefill leg"].span_id,
            "01",
        )
        assert parse_traceparent(dreq["traceparent"])[1] == spans["decode leg"].span_id  # type: ignore[index]


def test_spec_renders_the_engines_otlp_endpoint():
    spec = FleetSpec.model_validate(spec_dict(router={"otlp_endpoint": "http://c:4318/"}))
    for inst in build_plan(spec).instances:
        i = inst.argv.index("--otlp-traces-endpoint")
        assert inst.argv[i + 1] == "http://c:4318/v1/traces"
        assert inst.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
        assert f"pdctl.instance={inst.name}" in inst.env["OTEL_RESOURCE_ATTRIBUTES"]
    plain = FleetSpec.model_validate(spec_dict())
    assert all("--otlp-traces-endpoint" not in i.argv for i in build_plan(plain).instances)
    with pytest.raises(ValueError, match="otlp_endpoint"):
        FleetSpec.model_validate(spec_dict(router={"otlp_endpoint": "c:4318"}))


def test_router_does_not_import_opentelemetry_without_an_endpoint():
    code = (
        "import sys\n"
        "from pdctl.sdk.router.tracing import Tracer\n"
        "Tracer(None).begin(None).start('prefill')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
