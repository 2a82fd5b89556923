"""Run-time changes to admission control (``POST /v1/pdctl/admission``): the body
checked as a whole, then applied to one router process's
:class:`~pdctl.sdk.router.admission.Admission` (every worker applies the same body)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from pdctl.sdk.client.admission import ADMISSION_SETTINGS
from pdctl.sdk.router.saturation import Saturation


class Adjustable(Protocol):
    """What a run-time change sets: the admission's limits and thresholds (this module
    sits below :mod:`~pdctl.sdk.router.admission`, which calls it)."""

    limits: dict[str, int]
    saturation: Saturation
    max_queue_wait_s: float


_INTS = {
    "prefill_in_flight_per_instance": ("prefill", 1),
    "decode_in_flight_per_instance": ("decode", 1),
    "max_queued": ("queue", 0),
    "max_waiting_per_instance": (None, 0),
}
"""Integer settings: (the limit's slot in ``Admission.limits``, or None; the lowest)."""


def change(adm: Adjustable, req: dict[str, Any]) -> tuple[int, str, str] | None:
    """Apply ``req`` to ``adm``: None when done, else the refusal (status, message,
    error type) with nothing of it applied."""
    known = set(ADMISSION_SETTINGS)
    unknown = sorted(set(req) - known)
    if unknown or not req:
        return (
            400,
            f"unknown admission setting(s) {', '.join(unknown) or '(none given)'}; "
            f"send any of: {', '.join(sorted(known))}",
            "invalid_request_error",
        )
    for k, (_, low) in _INTS.items():
        v = req.get(k)
        if k in req and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            return 400, f"'{k}' must be an integer >= {low}", "invalid_request_error"
    kv = _number(req.get("max_kv_usage"))
    if "max_kv_usage" in req and (kv is None or not 0 <= kv <= 1):
        return 400, "'max_kv_usage' must be a number from 0 to 1", "invalid_request_error"
    qw = _number(req.get("max_queue_wait_s"))
    if "max_queue_wait_s" in req and (qw is None or qw <= 0):
        return 400, "'max_queue_wait_s' must be a number > 0", "invalid_request_error"
    for k, (slot, _) in _INTS.items():
        if k in req and slot is not None:
            adm.limits[slot] = int(req[k])
    if "max_waiting_per_instance" in req:
        adm.saturation.thresholds.max_waiting = int(req["max_waiting_per_instance"])
    if kv is not None:
        adm.saturation.thresholds.max_kv_usage = kv
    if qw is not None:
        adm.max_queue_wait_s = qw
    return None


def _number(v: Any) -> float | None:
    """``v`` as a finite number, or None."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None
