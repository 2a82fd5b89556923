"""What the router's admission control and TTFT predictor did over the window.

Pure: :func:`admission_of` reads the router's latest scrape and the oldest one of the
monitor's window and gives a :class:`~pdctl.sdk.metrics.snapshot.RouterAdmission`:
requests shed per second by reason and class (``pdctl_router_shed_total``), admitted per
second (``pdctl_router_admitted_total``), and the median relative error of the TTFT
predictions (``pdctl_router_ttft_prediction_error_ratio``, from its buckets' increase).
A figure that cannot be measured is None with the reason in ``missing``: the router was
not scraped, it exports no such series (admission off), one scrape gives no rate, no
prediction was checked in the window. Never a zero that is not a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdctl.sdk.metrics.derive import Scrape, counter_delta, window_of
from pdctl.sdk.metrics.panels import ADMISSION_FIGURES, ONE_SCRAPE
from pdctl.sdk.metrics.series import ADMITTED, PREDICTION_ERROR, PREDICTIONS, SHED
from pdctl.sdk.metrics.snapshot import RouterAdmission, Target

UNSCRAPED = "the router's /metrics has not answered (see the router's row for why)"
ADMISSION_OFF = (
    "the router exports no {name}: its admission control is off "
    "([router.admission] enabled = false) or it predates it"
)
NO_PREDICTOR = "the router exports no {name} (a router without the TTFT predictor)"
NO_PREDICTIONS = (
    "no predictions in the window: no answered request had a TTFT prediction (a pair's "
    "model needs [router.admission] predictor_min_observations requests first)"
)


def admission_of(histories: Iterable[tuple[Target, Sequence[Scrape]]]) -> RouterAdmission | None:
    """The router's admission figures over its scrapes in the window (the first router
    target's); None when there is no router to scrape."""
    routers = [hist for t, hist in histories if t.role == "router"]
    if not routers:
        return None
    for hist in routers:
        if hist:
            return window_admission(hist[-1], hist[0] if len(hist) > 1 else None)
    return RouterAdmission(missing=dict.fromkeys(ADMISSION_FIGURES, UNSCRAPED))


def window_admission(new: Scrape, old: Scrape | None) -> RouterAdmission:
    """The figures between two router scrapes (``old`` None: only ``new``, no rates)."""
    dt = new.at - old.at if old is not None else 0.0
    missing: dict[str, str] = {}

    def counted(name: str, key: str) -> dict[str, float] | None:
        """Per value of label ``key``: the counter's increase over the window (a restart
        counts from 0); None without the series or a window to take a difference over."""
        if not new.has(name) or old is None or dt <= 0:
            return None
        before = old.by_label(name, key)
        return {
            k: counter_delta(v, before.get(k, 0.0)) or 0.0
            for k, v in sorted(new.by_label(name, key).items())
        }

    def per_s(name: str, key: str) -> dict[str, float] | None:
        got = counted(name, key)
        return None if got is None else {k: v / dt for k, v in got.items()}

    by_reason, by_class = per_s(SHED, "reason"), per_s(SHED, "class")
    admitted = per_s(ADMITTED, "queued")
    for fig, name, got in (("shed", SHED, by_reason), ("admitted", ADMITTED, admitted)):
        if got is None:
            missing[fig] = ADMISSION_OFF.format(name=name) if not new.has(name) else ONE_SCRAPE

    err = window_of(new, old, PREDICTION_ERROR)
    p50 = err.quantile(0.5) if err is not None and err.count > 0 else None
    if err is None:
        missing["prediction_error"] = NO_PREDICTOR.format(name=PREDICTION_ERROR)
    elif err.count <= 0:
        missing["prediction_error"] = NO_PREDICTIONS
    elif p50 is None:
        missing["prediction_error"] = "its source gave no median for the window's buckets"
    results = counted(PREDICTIONS, "result")
    return RouterAdmission(
        span_s=dt if old is not None else None,
        shed_per_s=sum(by_reason.values()) if by_reason is not None else None,
        shed_by_reason=by_reason or {},
        shed_by_class=by_class or {},
        admitted_per_s=sum(admitted.values()) if admitted is not None else None,
        queued_admitted_per_s=admitted.get("true", 0.0) if admitted is not None else None,
        prediction_error_p50=p50,
        predictions=err.count if err is not None else None,
        predictions_by_result=results or {},
        missing=missing,
    )
