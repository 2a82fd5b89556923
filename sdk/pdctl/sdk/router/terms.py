"""What a request asks of the router beyond its body: its priority class and its
first-byte deadline and SLO (headers, the OpenAI-compatible ``priority`` field, the
spec's default).

* ``pdctl-priority: interactive | standard | batch`` (or vLLM's integer ``priority``
  field in the body: below 0 interactive, 0 standard, above 0 batch; the header wins).
  vLLM serves a lower ``priority`` first where it runs ``--scheduling-policy priority``
  (``vllm/config/scheduler.py``, ``policy``; the request field in
  ``vllm/entrypoints/openai/completion/protocol.py``; an engine scheduling first come,
  first served takes the field and ignores it: ``FCFSRequestQueue`` in
  ``vllm/v1/core/sched/request_queue.py``). So where every prefill and decode runs
  that policy (:func:`pdctl.sdk.fleetplan.priority_scheduling`) a request's class
  reaches the engines as ``priority`` (interactive -1, standard 0, batch 1) unless the
  client set the field;
  elsewhere the field is taken out (the router's queue has used it).
* ``pdctl-deadline-ms: N``: the first byte of the answer must come within N ms of the
  router reading the request, or the request is cancelled on both legs and answered 504
  at that moment (for a request that is not streamed its first byte is its whole answer).
* ``pdctl-slo-ttft-ms: N``: the time to first token the client needs; the request is not
  kept queued past it (shed with ``slo_unreachable``), but once sent on it is not cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.router.admission import CLASSES

PRIORITY = b"pdctl-priority"
DEADLINE = b"pdctl-deadline-ms"
SLO_TTFT = b"pdctl-slo-ttft-ms"
MAX_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Terms:
    klass: str = "standard"
    deadline_s: float | None = None
    """Seconds from receipt to the first byte, or cancelled and 504."""
    slo_s: float | None = None
    """Seconds from receipt the client wants its first token within."""

    @property
    def queue_limit_s(self) -> float | None:
        """Longest the request may wait in the router's queue (the nearer of the two)."""
        known = [t for t in (self.deadline_s, self.slo_s) if t is not None]
        return min(known) if known else None


def terms_of(
    headers: Iterable[tuple[bytes, bytes]], body: Mapping[str, Any], default_deadline_ms: int = 0
) -> Terms | str:
    """The request's terms, or what is wrong with them (a 400's message)."""
    found: dict[bytes, str] = {}
    for k, v in headers:
        if k in (PRIORITY, DEADLINE, SLO_TTFT) and k not in found:
            found[k] = bytes(v).decode("latin-1").strip()
    klass = "standard"
    p = body.get("priority")
    if p is not None:
        if not isinstance(p, int) or isinstance(p, bool):
            return "'priority' must be an integer (lower is served first)"
        klass = "interactive" if p < 0 else "standard" if p == 0 else "batch"
    if PRIORITY in found:
        klass = found[PRIORITY].lower()
        if klass not in CLASSES:
            return f"header pdctl-priority must be one of: {', '.join(CLASSES)}"
    deadline = _ms(found.get(DEADLINE), "pdctl-deadline-ms")
    if isinstance(deadline, str):
        return deadline
    slo = _ms(found.get(SLO_TTFT), "pdctl-slo-ttft-ms")
    if isinstance(slo, str):
        return slo
    if deadline is None and default_deadline_ms:
        deadline = default_deadline_ms / 1000
    return Terms(klass, deadline, slo)


def _ms(raw: str | None, name: str) -> float | str | None:
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        return f"header {name} must be a whole number of milliseconds, not {raw[:40]!r}"
    if not 1 <= v <= MAX_MS:
        return f"header {name} must be from 1 to {MAX_MS} (milliseconds)"
    return v / 1000


def pass_priority(body: dict[str, Any], klass: str, scheduled: bool) -> None:
    """Give the engines the request's class as vLLM's ``priority`` field where they
    schedule by it (``scheduled``), else take the field out."""
    if not scheduled:
        body.pop("priority", None)
    elif "priority" not in body:
        body["priority"] = CLASSES.index(klass) - 1
