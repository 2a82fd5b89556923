"""One round's figures from the scrapes the monitor keeps: per instance, per fleet.

Pure functions over :class:`~pdctl.sdk.metrics.derive.Scrape` windows (the oldest and
the newest scrape of an instance within the monitor's window): :func:`instance_of` an
instance's :class:`~pdctl.sdk.metrics.snapshot.InstanceMetrics`, :func:`summary_of` and
:func:`roles_of` the fleet's, :func:`kv_index_of` and :func:`router_canary_of` what the router's
latest scrape says about the others. :class:`~pdctl.sdk.metrics.monitor.FleetMonitor`
keeps the scrapes and the health; this module only derives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pdctl.sdk.metrics.derive import (
    Latency,
    Lengths,
    Scrape,
    Window,
    counter_delta,
    latency_of,
    window_of,
)
from pdctl.sdk.metrics.pairs import canary_of
from pdctl.sdk.metrics.rendezvous import present, rendezvous_of
from pdctl.sdk.metrics.series import ROUTER_E2E, ROUTER_TTFT, V
from pdctl.sdk.metrics.snapshot import InstanceMetrics, Summary, Target, Transfers

Histories = Iterable[tuple[Target, Sequence[Scrape]]]
"""Each target with its scrapes in the window, oldest first."""


def instance_of(t: Target, hist: Sequence[Scrape], base: dict[str, Any]) -> InstanceMetrics:
    """``t``'s figures over its scrapes ``hist``; ``base``: the fields the monitor knows
    (name, role, health, errors, ...)."""
    base = dict(base)
    if hist and t.role != "router":
        base["prefix_hit_rate"] = hit_rate(hist[-1], hist[0] if len(hist) > 1 else None)
    if not hist:
        return InstanceMetrics(**base)
    new, old = hist[-1], (hist[0] if len(hist) > 1 else None)
    dt = new.at - old.at if old is not None else 0.0

    def window(name: str, prefix: str = V) -> Window | None:
        return window_of(new, old, prefix + name)

    def latency(name: str) -> Latency:
        return latency_of(new, old, V + name)

    if t.role == "router":  # what the router measured of every request it answered
        e2e = window(ROUTER_E2E, "")
        return InstanceMetrics(
            **base,
            ttft=latency_of(new, old, ROUTER_TTFT),
            e2e=Latency.of(e2e),
            request_rate=(e2e.count / dt) if (e2e is not None and dt > 0) else None,
            span_s=dt if old is not None else None,
        )

    done = counter_delta(
        new.total(V + "request_success_total"),
        old.total(V + "request_success_total") if old else None,
    )
    src_new = new.by_label(V + "prompt_tokens_by_source_total", "source")
    src_old = old.by_label(V + "prompt_tokens_by_source_total", "source") if old else {}
    pdctl = present(new)
    return InstanceMetrics(
        **base,
        request_rate=(done / dt) if (done is not None and dt > 0) else None,
        ttft=latency("time_to_first_token_seconds"),
        itl=latency("inter_token_latency_seconds"),
        tpot=latency("request_time_per_output_token_seconds"),
        e2e=latency("e2e_request_latency_seconds"),
        running=new.total(V + "num_requests_running"),
        waiting=new.total(V + "num_requests_waiting"),
        kv_usage=new.total(V + "kv_cache_usage_perc"),
        transfers=transfers_of(t, new, old, dt, window, latency),
        kv_fetch_by_stage=new.by_label(V + "num_requests_kv_fetch_by_stage", "stage"),
        prompt_tokens_by_source=src_new,
        prompt_tokens_by_source_window={
            k: counter_delta(v, src_old.get(k)) or 0.0 for k, v in src_new.items()
        }
        if old
        else {},
        rendezvous=rendezvous_of(new, old, t.role) if pdctl else None,
        pdctl_series=pdctl,
        prompt_tokens=Lengths.of(window("request_prompt_tokens")),
        output_tokens=Lengths.of(window("request_generation_tokens")),
        span_s=dt if old is not None else None,
    )


def transfers_of(
    t: Target,
    new: Scrape,
    old: Scrape | None,
    dt: float,
    window: Callable[[str], Window | None],
    latency: Callable[[str], Latency],
) -> Transfers:
    """NIXL's figures on ``t`` (the WRITE initiator records them)."""
    total_bytes = new.total(V + "nixl_bytes_transferred_sum")
    if total_bytes is None:
        return Transfers()
    bytes_h = window("nixl_bytes_transferred")
    desc_h = window("nixl_num_descriptors")
    bw = bytes_h.sum if (bytes_h is not None and old is not None) else None
    handles = bytes_h.count if bytes_h is not None else 0.0

    def dcount(name: str) -> float:
        return counter_delta(new.total(V + name), old.total(V + name) if old else None) or 0.0

    # One NIXL sample per WRITE handle (request x initiator rank x target rank), pooled
    # across ranks: with equal TP on both sides there is one handle per rank.
    per_req: float | None = None
    note = "pooled over ranks; not normalised (no transfers in the window)"
    if bw is not None and handles > 0:
        per_req = bw / handles * t.tp
        note = f"bytes per handle x {t.tp} initiator rank(s), assuming equal P/D TP"
    return Transfers(
        bytes_total=total_bytes,
        bytes_window=bw,
        throughput_bps=(bw / dt) if (bw is not None and dt > 0) else None,
        transfers_window=handles,
        bytes_per_request=per_req,
        per_request_note=note,
        xfer_time=latency("nixl_xfer_time_seconds"),
        post_time=latency("nixl_post_time_seconds"),
        descriptors_per_transfer=desc_h.mean if desc_h is not None else None,
        failed_transfers=new.total(V + "nixl_num_failed_transfers_total"),
        failed_notifications=new.total(V + "nixl_num_failed_notifications_total"),
        expired_leases=new.total(V + "nixl_num_kv_expired_reqs_total"),
        failed_window=dcount("nixl_num_failed_transfers_total")
        + dcount("nixl_num_failed_notifications_total"),
        expired_window=dcount("nixl_num_kv_expired_reqs_total"),
    )


def hit_rate(new: Scrape, old: Scrape | None) -> float | None:
    """vLLM's prefix-cache hits per queried token (over the window with two scrapes)."""
    q, h = new.total(V + "prefix_cache_queries_total"), new.total(V + "prefix_cache_hits_total")
    if q is None or h is None:
        return None
    if old is not None:
        q = counter_delta(q, old.total(V + "prefix_cache_queries_total")) or 0.0
        h = counter_delta(h, old.total(V + "prefix_cache_hits_total")) or 0.0
    return h / q if q > 0 else None


def _router_latest(histories: Histories) -> Iterable[Scrape]:
    for t, hist in histories:
        if t.role == "router" and hist:
            yield hist[-1]


def kv_index_of(histories: Histories) -> dict[str, str]:
    """The router's index state per instance, from its latest scrape (read once per
    snapshot, not once per instance)."""
    out: dict[str, str] = {}
    for new in _router_latest(histories):
        for s in new.by_name.get("pdctl_router_kv_index_state", ()):
            if s.value == 1:
                out.setdefault(s.label("instance"), s.label("state"))
    return out


def router_canary_of(histories: Histories) -> dict[tuple[str, str], dict[str, float]]:
    """The router's canary results per P->D pair since it started (its latest
    scrape); pairs with none yet are left out."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for new in _router_latest(histories):
        out.update(canary_of(new))
    return {k: v for k, v in out.items() if any(v.values())}


def router_window(histories: Histories) -> tuple[Scrape, Scrape | None] | None:
    """The router's latest scrape and the oldest of the window (None without one)."""
    for t, hist in histories:
        if t.role == "router" and hist:
            return hist[-1], (hist[0] if len(hist) > 1 else None)
    return None


def roles_of(insts: Iterable[InstanceMetrics]) -> dict[str, dict[str, Any]]:
    """Per role: its instances, how many are up, and their rates and queues summed."""
    roles: dict[str, dict[str, Any]] = {}
    for i in insts:
        r = roles.setdefault(
            i.role,
            {
                "instances": 0,
                "up": 0,
                "request_rate": 0.0,
                "running": 0.0,
                "waiting": 0.0,
                "kv_bytes_window": 0.0,
            },
        )
        r["instances"] += 1
        r["up"] += i.health == "UP"
        r["request_rate"] += i.request_rate or 0.0
        r["running"] += i.running or 0.0
        r["waiting"] += i.waiting or 0.0
        r["kv_bytes_window"] += i.transfers.bytes_window or 0.0
    return roles


def summary_of(insts: Sequence[InstanceMetrics]) -> Summary:
    """The fleet in a few figures (latencies: the slowest front instance's)."""
    front = [i for i in insts if i.role in ("decode", "colocated")]

    def slowest(of: Callable[[InstanceMetrics], float | None]) -> float | None:
        return max((v for v in map(of, front) if v is not None), default=None)

    return Summary(
        request_rate=sum(i.request_rate or 0.0 for i in front),
        ttft_p50_s=slowest(lambda i: i.ttft.p50),
        ttft_p99_s=slowest(lambda i: i.ttft.p99),
        itl_p50_s=slowest(lambda i: i.itl.p50),
        itl_p99_s=slowest(lambda i: i.itl.p99),
        e2e_p50_s=slowest(lambda i: i.e2e.p50),
        kv_bytes_moved=sum(i.transfers.bytes_total or 0.0 for i in insts),
        transfer_bps=sum(i.transfers.throughput_bps or 0.0 for i in insts),
        requests_running=sum(i.running or 0.0 for i in front),
        requests_waiting=sum(i.waiting or 0.0 for i in front),
        instances_up=sum(i.health == "UP" for i in insts),
        instances=len(insts),
    )
