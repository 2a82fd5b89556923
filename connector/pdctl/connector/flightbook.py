"""The flight recorder's pure parts: the per-process event book and the API server's
ring of recent requests (no vLLM imports; the hooks are in :mod:`pdctl.connector.events`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from pdctl.sdk.metrics import flight as fl

_log = logging.getLogger("vllm.pdctl.connector")

RECORDS = "pdctl_flight_records"
"""``kv_connector_extra_config`` key: requests kept per instance (0: recorder off)."""


def records_setting(vllm_config: Any) -> int:
    cfg = getattr(vllm_config, "kv_transfer_config", None)
    if cfg is None:
        return fl.DEFAULT_RECORDS
    try:
        return max(0, int(cfg.get_from_extra_config(RECORDS, fl.DEFAULT_RECORDS)))
    except (TypeError, ValueError):
        _log.warning("pdctl: %s must be an integer; using %d", RECORDS, fl.DEFAULT_RECORDS)
        return fl.DEFAULT_RECORDS


class FlightBook:
    """Flight events waiting for the next stats drain, and which one-time events each
    recent request already had (bounded: the oldest requests are forgotten)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._out: list[list[object]] = []
        self._lock = threading.Lock()
        self._failed = False

    @property
    def on(self) -> bool:
        return self.capacity > 0 and not self._failed

    def mark(self, vllm_id: str, event: str, t: float | None = None) -> None:
        """Note ``event`` at monotonic time ``t`` (now); first occurrence only, except
        the :data:`~pdctl.sdk.metrics.flight.LAST_WINS` events."""
        if not self.on:
            return
        key = fl.flight_key(vllm_id)
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = set()
                while len(self._seen) > self.capacity:
                    self._seen.popitem(last=False)
            elif event in seen and event not in fl.LAST_WINS:
                return
            seen.add(event)
            self._out.append([fl.KIND, key, event, time.monotonic() if t is None else t])

    def add(self, vllm_id: str, name: str, amount: float) -> None:
        if self.on:
            with self._lock:
                self._out.append([fl.KIND, fl.flight_key(vllm_id), name, float(amount)])

    def drain(self) -> list[list[object]]:
        with self._lock:
            out, self._out = self._out, []
        return out

    def guard(self, fn: Any, *args: Any) -> None:
        """Run a hook body; the first error turns the recorder off (vLLM carries on)."""
        if not self.on:
            return
        try:
            fn(*args)
        except Exception:
            self._failed = True
            _log.exception("pdctl: flight recorder disabled after an error")


class FlightRing:
    """The API server's ring of recent requests (times are monotonic, this host), and
    the Prometheus collector that publishes it as offsets from arrival."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._records: OrderedDict[str, tuple[dict[str, float], dict[str, float]]] = OrderedDict()
        self._lock = threading.Lock()

    def feed(self, events: list[Any] | None) -> None:
        if not events or self.capacity <= 0:
            return
        with self._lock:
            for ev in events:
                if not isinstance(ev, (list, tuple)) or len(ev) != 4 or ev[0] != fl.KIND:
                    continue
                _, key, name, value = ev
                if not isinstance(key, str) or not isinstance(value, (int, float)):
                    continue
                rec = self._records.get(key)
                if rec is None:
                    rec = self._records[key] = ({}, {})
                    while len(self._records) > self.capacity:
                        self._records.popitem(last=False)
                times, sums = rec
                if name in fl.SUMS:
                    sums[name] = sums.get(name, 0.0) + float(value)
                elif name in fl.TIMES and (name in fl.LAST_WINS or name not in times):
                    times[name] = float(value)

    def snapshot(self) -> list[tuple[str, dict[str, float], dict[str, float]]]:
        """``(request_id, event → seconds since arrival, field → amount)`` per request
        whose arrival is known."""
        with self._lock:
            items = [(k, dict(t), dict(s)) for k, (t, s) in self._records.items()]
        out = []
        for key, times, sums in items:
            zero = times.get(fl.ARRIVED)
            if zero is not None:
                out.append((key, {e: t - zero for e, t in times.items()}, sums))
        return out

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        seconds = GaugeMetricFamily(
            fl.SECONDS,
            "pdctl flight recorder: seconds from the request's arrival to the event.",
            labels=["request_id", "event"],
        )
        values = GaugeMetricFamily(
            fl.VALUE,
            "pdctl flight recorder: per-request amounts (bytes, NIXL times, counts).",
            labels=["request_id", "field"],
        )
        for key, times, sums in self.snapshot():
            for event, t in times.items():
                seconds.add_metric([key, event], t)
            for name, v in sums.items():
                values.add_metric([key, name], v)
        yield seconds
        yield values
