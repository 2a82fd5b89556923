"""The router's shedding, admissions and TTFT prediction error over the monitor's window
(metrics/overload.py), from payloads the router's own registry exposes."""

from __future__ import annotations

import pytest

from pdctl.sdk.metrics import Scrape, parse
from pdctl.sdk.metrics.monitor import FleetMonitor, RouterAdmission, Target
from pdctl.sdk.metrics.overload import (
    NO_PREDICTIONS,
    UNSCRAPED,
    admission_of,
    window_admission,
)
from pdctl.sdk.metrics.panels import NO_ROUTER_METRICS, ONE_SCRAPE, panels_doc
from pdctl.sdk.router.admission import Admission
from pdctl.sdk.router.predictor import Predictor
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.spec.admission import AdmissionSpec

ROUTER = Target("router", "router", "http://router")
DECODE = Target("decode-0", "decode", "http://decode")


class Router:
    """The router's admission and predictor metrics, in its own registry."""

    def __init__(self, admission: bool = True) -> None:
        self.registry = Registry()
        spec = AdmissionSpec()
        self.admission = Admission(spec, [], [], self.registry) if admission else None
        self.predictor = Predictor(spec, self.registry)

    def shed(self, reason: str, klass: str, n: int) -> None:
        assert self.admission is not None
        self.admission.shed.inc(reason, klass, by=n)

    def admit(self, klass: str, queued: bool, n: int) -> None:
        assert self.admission is not None
        self.admission.admitted.inc(klass, "true" if queued else "false", by=n)

    def predicted(self, error: float, n: int) -> None:
        for _ in range(n):
            self.predictor.error.observe(error)
        self.predictor.predictions.inc("known", by=n)

    def text(self) -> str:
        return self.registry.expose().decode()

    def scrape(self, at: float) -> Scrape:
        return Scrape(parse(self.text()), at)


def busy_window() -> tuple[Scrape, Scrape]:
    """Two scrapes 10 s apart: before, 5 shed and 3 predictions with 90 % error; between,
    29 decode_saturated + 3 slo_unreachable shed, 50 admitted (20 queued first), 4
    predictions with 12 % error and 1 placed without."""
    r = Router()
    r.shed("decode_saturated", "batch", 5)
    r.admit("standard", False, 7)
    r.predicted(0.9, 3)
    old = r.scrape(100.0)
    r.shed("decode_saturated", "batch", 20)
    r.shed("decode_saturated", "standard", 9)
    r.shed("slo_unreachable", "standard", 3)
    r.admit("standard", False, 30)
    r.admit("interactive", True, 20)
    r.predicted(0.12, 4)
    r.predictor.predictions.inc("unknown")
    return r.scrape(110.0), old


def test_two_scrapes_give_exact_rates_by_reason_and_class():
    adm = window_admission(*busy_window())
    assert adm.span_s == 10.0
    assert adm.shed_by_reason == {
        "decode_saturated": pytest.approx(2.9),
        "draining": 0.0,
        "prefill_saturated": 0.0,
        "slo_unreachable": pytest.approx(0.3),
    }
    assert adm.shed_per_s == pytest.approx(3.2)
    assert adm.shed_by_class == {
        "batch": pytest.approx(2.0),
        "interactive": 0.0,
        "standard": pytest.approx(1.2),
    }
    assert adm.admitted_per_s == pytest.approx(5.0)
    assert adm.queued_admitted_per_s == pytest.approx(2.0)
    assert adm.missing == {}


def test_prediction_error_p50_from_the_windows_buckets_only():
    new, old = busy_window()
    adm = window_admission(new, old)
    # the window's 4 observations lie in (0.10, 0.15]: rank 2 of 4 is halfway through it
    assert adm.prediction_error_p50 == pytest.approx(0.125)
    assert adm.predictions == 4
    assert adm.predictions_by_result == {"known": 4.0, "unknown": 1.0}
    # since the router started (7 observations, rank 3.5 of them): another answer
    assert window_admission(new, None).prediction_error_p50 == pytest.approx(0.14375)


def test_one_scrape_gives_no_rate_and_says_why():
    new, _ = busy_window()
    adm = window_admission(new, None)
    assert adm.span_s is None
    assert (adm.shed_per_s, adm.admitted_per_s, adm.queued_admitted_per_s) == (None, None, None)
    assert (adm.shed_by_reason, adm.shed_by_class, adm.predictions_by_result) == ({}, {}, {})
    assert adm.missing == {"shed": ONE_SCRAPE, "admitted": ONE_SCRAPE}


def test_no_prediction_in_the_window_is_not_a_zero_error():
    r = Router()
    r.predicted(0.3, 2)
    old = r.scrape(0.0)
    r.shed("draining", "batch", 1)
    adm = window_admission(r.scrape(5.0), old)
    assert adm.prediction_error_p50 is None
    assert adm.predictions == 0
    assert adm.missing == {"prediction_error": NO_PREDICTIONS}
    assert adm.shed_by_reason["draining"] == pytest.approx(0.2)


def test_admission_off_exports_no_shed_series_and_says_so():
    r = Router(admission=False)
    old = r.scrape(0.0)
    adm = window_admission(r.scrape(1.0), old)
    assert (adm.shed_per_s, adm.admitted_per_s) == (None, None)
    assert "pdctl_router_shed_total" in adm.missing["shed"]
    assert "enabled = false" in adm.missing["shed"]
    assert "pdctl_router_admitted_total" in adm.missing["admitted"]


def test_a_router_restart_counts_from_zero():
    before = Router()
    before.shed("decode_saturated", "batch", 40)
    after = Router()
    after.shed("decode_saturated", "batch", 6)
    adm = window_admission(after.scrape(2.0), before.scrape(0.0))
    assert adm.shed_by_reason["decode_saturated"] == pytest.approx(3.0)


def test_without_a_router_or_its_scrapes():
    assert admission_of([(DECODE, [])]) is None
    unscraped = admission_of([(DECODE, []), (ROUTER, [])])
    assert unscraped == RouterAdmission(
        missing=dict.fromkeys(("shed", "admitted", "prediction_error"), UNSCRAPED)
    )


def test_the_monitors_snapshot_and_its_json_carry_the_figures():
    from pdctl.cli.metricsview import snapshot_doc

    r = Router()
    mon = FleetMonitor([ROUTER, DECODE])
    mon.ingest("router", r.text(), at=50.0)
    r.shed("prefill_saturated", "interactive", 8)
    r.admit("batch", True, 4)
    mon.ingest("router", r.text(), at=54.0)
    snap = mon.snapshot()
    assert snap.admission is not None
    assert snap.admission.shed_per_s == pytest.approx(2.0)
    assert snap.admission.admitted_per_s == pytest.approx(1.0)
    doc = snapshot_doc(snap)
    assert doc["admission"]["shed_by_reason"]["prefill_saturated"] == pytest.approx(2.0)
    assert doc["admission"]["prediction_error_p50"] is None
    assert doc["panels"]["admission"] == {
        "shown": ["shed", "admitted"],
        "missing": {"prediction_error": NO_PREDICTIONS},
    }


def test_panels_without_a_router():
    mon = FleetMonitor([DECODE])
    snap = mon.snapshot()
    assert snap.admission is None
    assert set(panels_doc(snap)["admission"]["missing"].values()) == {NO_ROUTER_METRICS}
