"""Rules PD051-PD055: the router's admission control, ``[router.admission]``
(:mod:`pdctl.sdk.router.admission`, docs/router.md "Overload") — values out of range,
limits the router's own timeouts outlive, saturation thresholds nothing can read, stage
limits the fleet cannot use, and priority classes that never reach vLLM's scheduler."""

from __future__ import annotations

import math
from collections.abc import Iterator

from pdctl.sdk.fleetplan import flag_value, scheduling_policy
from pdctl.sdk.lint.core import Finding, LintContext, _f, rule
from pdctl.sdk.spec import AdmissionSpec, RouterSpec

_A = "router.admission"

_RANGES: tuple[tuple[str, float, float, bool, str], ...] = (
    # field, lowest, highest, lowest allowed, what a value past the bound does / the fix
    ("prefill_in_flight_per_instance", 1, math.inf, True,
     "admits no request to prefill: every request queues, then is shed 503"),
    ("decode_in_flight_per_instance", 1, math.inf, True,
     "admits no request to decode: every request queues, then is shed 503"),
    ("max_queued", 0, math.inf, True, "a queue of negative length (0 means never queue)"),
    ("max_queue_wait_s", 0, math.inf, False,
     "a queued request is shed before it could be admitted"),
    ("max_waiting_per_instance", 0, math.inf, True,
     "no waiting queue is ever below it: every instance reads saturated (0 turns it off)"),
    ("max_kv_usage", 0, 1, True,
     "vllm:kv_cache_usage_perc is a fraction 0-1 (0.98, not 98); 0 turns it off"),
    ("scrape_interval_s", 0, math.inf, True, "0 means never read the gauges"),
    ("stale_after_s", 0, math.inf, False, "every reading is stale at once"),
    ("default_deadline_ms", 0, math.inf, True, "0 means no default deadline"),
    ("slo_margin", 0, 1, True, "the allowance is a fraction of the time left, 0-1"),
    ("queue_confidence", 0.5, 0.9999, True,
     "a probability of being served in time, from 0.5 (the mean wait) to below 1"),
    ("predictor_min_observations", 2, 10000, True,
     "a pair needs at least 2 answered requests before a line can be fitted"),
)  # fmt: skip


def _admission(ctx: LintContext) -> tuple[RouterSpec, AdmissionSpec] | None:
    rs = ctx.spec.router
    if rs is None or not rs.admission.enabled:
        return None
    return rs, rs.admission


@rule("PD051", "router.admission: a value out of its range")
def _ranges(ctx: LintContext) -> Iterator[Finding]:
    """The spec refuses these when it is read; a spec built in code without validation
    (``model_copy(update=...)``, ``model_construct``) reaches lint with them."""
    rs = ctx.spec.router
    if rs is None:
        return
    a = rs.admission
    for name, lo, hi, lo_ok, what in _RANGES:
        v = getattr(a, name)
        low = v < lo if lo_ok else v <= lo
        if not (low or v > hi):
            continue
        bound = f"at least {lo:g}" if lo_ok else f"above {lo:g}"
        if hi != math.inf:
            bound += f" and at most {hi:g}"
        fix = f"set {_A}.{name} {bound}"
        if name == "max_kv_usage" and 1 < v <= 100:
            fix = f"set {_A}.max_kv_usage = {v / 100:g} (a fraction, not a percentage)"
        yield _f("PD051", "error", f"{_A}.{name}", f"{_A}.{name} = {v:g}", what, fix)
    if a.scrape_interval_s > 0 and 0 < a.stale_after_s <= a.scrape_interval_s:
        yield _f(
            "PD051",
            "error",
            f"{_A}.stale_after_s",
            f"{_A}.stale_after_s ({a.stale_after_s:g}) is not longer than "
            f"{_A}.scrape_interval_s ({a.scrape_interval_s:g})",
            "every reading is stale before the next one comes: no instance is ever seen "
            "saturated, and the waiting-queue and KV thresholds do nothing",
            f"raise {_A}.stale_after_s to a few scrape intervals (the default is 5 s for "
            "a 1 s interval)",
        )


@rule("PD052", "router.admission: a wait or deadline the router's timeout outlives")
def _timeouts(ctx: LintContext) -> Iterator[Finding]:
    """``router.request_timeout_s`` bounds the wait for decode's answer once a request is
    sent on; the queue wait and the deadline count from the router reading the request."""
    got = _admission(ctx)
    if got is None:
        return
    rs, a = got
    t = rs.request_timeout_s
    if a.max_queue_wait_s >= t:
        yield _f(
            "PD052",
            "warning",
            f"{_A}.max_queue_wait_s",
            f"{_A}.max_queue_wait_s ({a.max_queue_wait_s:g} s) is not shorter than "
            f"router.request_timeout_s ({t:g} s)",
            "a request may wait in the router's queue longer than the router waits for an "
            "engine, and then that timeout again: clients give up long before the 503",
            f"lower {_A}.max_queue_wait_s to seconds (the default is 10), well under "
            "router.request_timeout_s",
        )
    d = a.default_deadline_ms / 1000
    if d and d >= t:
        yield _f(
            "PD052",
            "warning",
            f"{_A}.default_deadline_ms",
            f"{_A}.default_deadline_ms ({a.default_deadline_ms} ms) is not shorter than "
            f"router.request_timeout_s ({t:g} s)",
            "the request timeout answers (504) first for nearly every request: the "
            "default deadline cancels almost nothing",
            f"set {_A}.default_deadline_ms below {t * 1000:g} (the first-byte time your "
            "clients wait), or 0 for none",
        )
    elif d and a.max_queued and d < a.max_queue_wait_s:
        yield _f(
            "PD052",
            "info",
            f"{_A}.max_queue_wait_s",
            f"{_A}.default_deadline_ms ({a.default_deadline_ms} ms) is shorter than "
            f"{_A}.max_queue_wait_s ({a.max_queue_wait_s:g} s)",
            "a queued request without a pdctl-deadline-ms header is answered 504 at its "
            "deadline first: max_queue_wait_s applies only to requests sending a longer "
            "deadline",
            f"lower {_A}.max_queue_wait_s to {d:g} s or less, or leave it for those requests",
        )


@rule("PD053", "router.admission: saturation thresholds with no gauges to read")
def _gauges(ctx: LintContext) -> Iterator[Finding]:
    """The router reads vLLM's ``vllm:num_requests_waiting`` and
    ``vllm:kv_cache_usage_perc`` (``PrometheusStatLogger``, ``vllm/v1/metrics/loggers.py``);
    an engine started with ``--disable-log-stats`` sets up no stat logger
    (``AsyncLLM.__init__``, ``vllm/v1/engine/async_llm.py``: ``enable_default_loggers=
    log_stats``), so it exports neither and is unknown for good. Unknown is never
    overload (:mod:`pdctl.sdk.router.saturation`)."""
    got = _admission(ctx)
    if got is None:
        return
    _rs, a = got
    if not (a.max_waiting_per_instance or a.max_kv_usage):
        return
    if a.scrape_interval_s == 0:
        yield _f(
            "PD053",
            "warning",
            f"{_A}.scrape_interval_s",
            f"{_A}.scrape_interval_s = 0 with max_waiting_per_instance = "
            f"{a.max_waiting_per_instance} and max_kv_usage = {a.max_kv_usage:g}",
            "the instances' gauges are never read, so every instance is unknown and no "
            "stage is ever saturated by them: only the in-flight limits bound the fleet",
            f"set {_A}.scrape_interval_s = 1 (and stale_after_s above it), or set "
            "max_waiting_per_instance = 0 and max_kv_usage = 0 to say the gauges are off",
        )
        return
    if a.stale_after_s < 2 * a.scrape_interval_s:
        yield _f(
            "PD053",
            "info",
            f"{_A}.stale_after_s",
            f"{_A}.stale_after_s ({a.stale_after_s:g} s) is under two scrape intervals "
            f"({a.scrape_interval_s:g} s)",
            "one late or failed read (a busy instance answers /metrics slowly) makes the "
            "instance unknown, and an unknown instance is never saturated",
            f"set {_A}.stale_after_s to 3-5 scrape intervals",
        )
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if insts and "--disable-log-stats" in insts[0].argv:
            yield _f(
                "PD053",
                "warning",
                f"{where}.vllm_args",
                f"{where} runs --disable-log-stats while {_A} reads its gauges",
                "vLLM then exports no vllm:num_requests_waiting or vllm:kv_cache_usage_perc: "
                "its instances are unknown for good and never count as saturated",
                f"remove --disable-log-stats from {where}.vllm_args (or fleet.vllm_args)",
            )


@rule("PD054", "router.admission: stage limits the fleet cannot use")
def _stages(ctx: LintContext) -> Iterator[Finding]:
    """A request is in the decode stage from admission to its end, so it counts in the
    prefill stage and the decode stage at once; vLLM runs at most ``--max-num-seqs``
    requests (``SchedulerConfig.max_num_seqs``, ``vllm/config/scheduler.py``) and queues
    the rest first come, first served, where the router's classes no longer apply."""
    got = _admission(ctx)
    if got is None:
        return
    rs, a = got
    limits = {
        "prefill": ("prefill_in_flight_per_instance", a.prefill_in_flight_per_instance),
        "decode": ("decode_in_flight_per_instance", a.decode_in_flight_per_instance),
    }
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        seqs = flag_value(insts[0].argv, "--max-num-seqs") if insts else None
        name, limit = limits[role]
        if seqs is not None and seqs.isdigit() and limit > int(seqs):
            yield _f(  # a note: vLLM's own queue still serves them, in arrival order
                "PD054",
                "info",
                f"{_A}.{name}",
                f"{_A}.{name} ({limit}) is above {where}'s --max-num-seqs ({seqs})",
                f"past {seqs} the admitted requests wait in vLLM's own queue, first come "
                "first served: the router's priority classes and queue bound no longer "
                "decide who goes first",
                f"set {_A}.{name} to {seqs} or less, or raise {where}.max_num_seqs",
            )
    n_p = sum(g.count for g in ctx.spec.prefill)
    n_d = sum(g.count for g in ctx.spec.decode)
    p_whole = a.prefill_in_flight_per_instance * n_p
    d_whole = a.decode_in_flight_per_instance * n_d
    if n_p and n_d and p_whole > d_whole:
        yield _f(
            "PD054",
            "info",
            f"{_A}.prefill_in_flight_per_instance",
            f"the prefill stage's limit ({a.prefill_in_flight_per_instance} per instance, "
            f"{p_whole} in all) is above the decode stage's "
            f"({a.decode_in_flight_per_instance} per instance, {d_whole} in all)",
            "every request in its prefill stage is in the decode stage too, so the prefill "
            "limit is never reached: the decode limit alone bounds the fleet",
            f"lower {_A}.prefill_in_flight_per_instance to "
            f"{max(1, d_whole // n_p)} or less, or raise decode_in_flight_per_instance",
        )
    w = rs.workers
    if w and w > 1:
        for name, whole in (
            ("prefill_in_flight_per_instance", p_whole),
            ("decode_in_flight_per_instance", d_whole),
            ("max_queued", a.max_queued),
        ):
            if 0 < whole < w:
                yield _f(
                    "PD054",
                    "warning",
                    f"{_A}.{name}",
                    f"{_A}.{name} gives the router {whole} in all, fewer than its "
                    f"{w} workers (router.workers)",
                    f"each worker enforces its share of the limit, at least 1: the router "
                    f"lets {w} through, not {whole}",
                    f"raise {_A}.{name} to {w} or more in all, or lower router.workers to {whole}",
                )


@rule("PD055", "router priority classes that do not reach vLLM's scheduler")
def _priorities(ctx: LintContext) -> Iterator[Finding]:
    """vLLM orders by ``priority`` only under ``--scheduling-policy priority``
    (``SchedulerPolicy = Literal["fcfs", "priority"]``, ``vllm/config/scheduler.py``;
    ``create_request_queue``, ``vllm/v1/core/sched/request_queue.py``: the FCFS queue
    takes the field and ignores it), and refuses any other policy name at start (the
    argument's choices, ``vllm/engine/arg_utils.py``). The router passes a request's
    class on as ``priority`` only when every prefill and decode runs the priority
    policy (:func:`pdctl.sdk.fleetplan.priority_scheduling`): one engine without it, and
    the field is taken out for all of them."""
    policies: dict[str, tuple[str, str]] = {}  # where -> (policy, flag as given)
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if insts:
            argv = insts[0].argv
            policies[where] = (
                scheduling_policy(argv),
                flag_value(argv, "--scheduling-policy") or "",
            )
    for where, (policy, _given) in policies.items():
        if policy not in ("fcfs", "priority"):
            yield _f(
                "PD055",
                "error",
                f"{where}.vllm_args",
                f"{where} runs --scheduling-policy {policy!r}",
                "vLLM knows only 'fcfs' and 'priority' and refuses to start",
                f"set --scheduling-policy priority (or fcfs) in {where}.vllm_args",
            )
    on = sorted(w for w, (p, _) in policies.items() if p == "priority")
    off = sorted(w for w, (p, _) in policies.items() if p == "fcfs")
    if on and off and ctx.spec.router is not None:
        yield _f(
            "PD055",
            "warning",
            f"{off[0]}.vllm_args",
            f"{', '.join(on)} run --scheduling-policy priority but {', '.join(off)} do not",
            "the router passes the request's class (pdctl-priority) on to vLLM only when "
            "every prefill and decode schedules by it, so none of them gets it: the "
            "priority schedulers see every request at priority 0 (first come, first "
            "served)",
            "add --scheduling-policy priority to fleet.vllm_args (every engine), or "
            f"remove it from {', '.join(on)}",
        )
