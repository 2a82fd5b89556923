"""The router's admission settings changeable at run time (``POST /v1/pdctl/admission``),
as a front end asks for them: each setting's name and kind, typed values read from
text, and the setting a router's refusal names.

The router is the one judge of a value (:mod:`pdctl.sdk.router.admission`, whose list of
settings is this one); here a value is only read as the integer or number it must be.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AdmissionSetting:
    name: str
    integer: bool
    help: str


ADMISSION_FIELDS: tuple[AdmissionSetting, ...] = (
    AdmissionSetting(
        "prefill_in_flight_per_instance", True, "requests in their prefill stage per prefill"
    ),
    AdmissionSetting(
        "decode_in_flight_per_instance", True, "requests admitted and not done per decode"
    ),
    AdmissionSetting("max_queued", True, "requests the router queues at most (0: never)"),
    AdmissionSetting("max_queue_wait_s", False, "seconds a queued request waits, then 503"),
    AdmissionSetting(
        "max_waiting_per_instance", True, "vLLM's waiting queue that saturates one (0: off)"
    ),
    AdmissionSetting("max_kv_usage", False, "vLLM's KV usage 0-1 that saturates one (0: off)"),
)
"""Every setting ``POST /v1/pdctl/admission`` takes, in ``[router.admission]`` order."""

ADMISSION_SETTINGS: tuple[str, ...] = tuple(s.name for s in ADMISSION_FIELDS)


def admission_changes(
    current: Mapping[str, Any], entered: Mapping[str, str]
) -> tuple[dict[str, int | float], dict[str, str]]:
    """The settings whose ``entered`` text differs from ``current`` (what
    ``GET /v1/pdctl/state`` shows under ``admission``), typed, and the ones that cannot
    be read, each with why. Empty text keeps the current value."""
    changes: dict[str, int | float] = {}
    errors: dict[str, str] = {}
    for s in ADMISSION_FIELDS:
        text = entered.get(s.name, "").strip()
        if not text:
            continue
        value: int | float
        try:
            value = int(text) if s.integer else float(text)
        except ValueError:
            errors[s.name] = f"{s.name} must be {'a whole number' if s.integer else 'a number'}"
            continue
        if value != current.get(s.name):
            changes[s.name] = value
    return changes, errors


_QUOTED = re.compile(r"'([a-z_]+)'")


def refused_setting(message: str) -> str | None:
    """The admission setting a router's refusal names (``'max_queued' must be an
    integer >= 0``), or None when it names none of them."""
    for name in _QUOTED.findall(message):
        if name in ADMISSION_SETTINGS:
            return str(name)
    found = [s for s in ADMISSION_SETTINGS if re.search(rf"\b{s}\b", message)]
    return found[0] if len(found) == 1 else None
