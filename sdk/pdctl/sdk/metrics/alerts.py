"""pdctl's alerts: one definition for the live monitor and for Prometheus.

Each :class:`AlertRule` holds an alert's code, severity, one-line title and message
template. :func:`evaluate_alerts` fills the template from the monitor's derived figures;
:mod:`pdctl.sdk.observability.rules` fills the same template with Prometheus' template
variables, so an alert reads the same in the terminal UI and in Alertmanager.

Templates name ``{instance}`` (the subject), ``{value}`` (formatted with
``value_format``) and, for some alerts, ``{expected}`` or ``{detail}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdctl.sdk.metrics.watch import CRASH_LIMIT, CRASH_WINDOW_S, KV_IDLE_LIMIT_S, holds_kv_idle

if TYPE_CHECKING:
    from pdctl.sdk.metrics.snapshot import InstanceMetrics


@dataclass(frozen=True)
class AlertRule:
    code: str
    severity: str  # critical | warning
    title: str
    message: str
    """Template: ``{instance}``, ``{value}`` and the rule's extra fields."""
    value_format: str = ".0f"
    """Python format spec of ``{value}`` (``.0f``, ``.3f`` or ``.0%``)."""

    def text(self, instance: str, value: float | None = None, **extra: str) -> str:
        shown = "" if value is None else format(value, self.value_format)
        return self.message.format(instance=instance, value=shown, **extra)


RULES: tuple[AlertRule, ...] = (
    AlertRule(
        "PA001",
        "critical",
        "decode recomputes prompts instead of receiving KV",
        "{instance} computed {value} prompt tokens itself and received none over KV "
        "transfer in the window: prefill work is wasted (connector missing, "
        "kv_transfer_params not forwarded?)",
    ),
    AlertRule(
        "PA002",
        "warning",
        "KV leases expire before decode collects the blocks",
        "{value} KV lease(s) expired on {instance}: decode collected too late; raise "
        "kv_lease_duration_s or add decode capacity",
    ),
    AlertRule(
        "PA003",
        "critical",
        "NIXL transfers or notifications fail",
        "{value} failed NIXL transfer(s)/notification(s) on {instance}",
    ),
    AlertRule(
        "PA004",
        "warning",
        "transfer throughput far below the preflight expectation",
        "{instance} moves KV at {value} GB/s, under a quarter of the expected {expected} "
        "GB/s: NIXL may have fallen back to a slow transport",
        ".3f",
    ),
    AlertRule(
        "PA005",
        "warning",
        "push mode behind a sequential router",
        "push mode with decode sent only after prefill finished: push is slower than pull "
        "this way; dispatch both legs at once",
    ),
    AlertRule(
        "PA006",
        "critical",
        "instance down",
        "{instance} does not answer /metrics{detail}",
    ),
    AlertRule(
        "PA007",
        "warning",
        "decode KV cache nearly full",
        "{instance} KV cache {value} full: new requests will queue and leased prefill "
        "blocks may expire",
        ".0%",
    ),
    AlertRule(
        "PA008",
        "warning",
        "push rendezvous entries expire unmatched",
        "{value} push rendezvous entr(y/ies) on {instance} expired unmatched: a decode "
        "leg lost or late, or a WRITE that never completed",
    ),
    AlertRule(
        "PA009",
        "critical",
        "decode fails to receive pushed KV",
        "{instance} failed to receive the KV of {value} registered request(s) (handshake "
        "or transfer failure, timeout)",
    ),
    AlertRule(
        "PA010",
        "warning",
        "an idle instance holds KV (leaked blocks)",
        "{instance} holds {value} of its KV cache with nothing running or waiting for "
        "{detail}: blocks leaked or held for a request the other side dropped "
        "(docs/reliability.md)",
        ".1%",
    ),
    AlertRule(
        "PA011",
        "critical",
        "an instance crashes repeatedly",
        "{instance} went down {value} times in the last {detail}: it crashes repeatedly; "
        "read its log (pdctl logs) before restarting it again",
    ),
    AlertRule(
        "PA012",
        "critical",
        "received KV does not match what the prefill sent",
        "{instance} found {value} request(s) whose pushed KV failed the digest check "
        "(pdctl:kv_verify_total, result mismatch): KV was corrupted or misplaced "
        "in transit; the requests were failed or recomputed. Read the decode's log for "
        "the block ids (docs/connector.md)",
    ),
    AlertRule(
        "PA013",
        "critical",
        "a P→D pair's answers differ from their canary replays",
        "{instance}: {value} greedy answer(s) differed from a replay of the same request "
        "on one instance alone (pdctl_router_canary_total, result diverged): the pair "
        "decoded from KV that is not what the prompt computes. Read the requests' canary "
        "detail (pdctl events, GET /v1/pdctl/requests; docs/router.md)",
    ),
)
BY_CODE: dict[str, AlertRule] = {r.code: r for r in RULES}
ALERTS: dict[str, str] = {r.code: r.title for r in RULES}
"""Code → title, for listings."""

Raised = tuple[str, str, str, str]


def _raise(code: str, subject: str, value: float | None = None, **extra: str) -> Raised:
    rule = BY_CODE[code]
    return (code, rule.severity, subject, rule.text(subject, value, **extra))


def evaluate_alerts(
    insts: Iterable[InstanceMetrics],
    *,
    mode: str,
    router_mode: str | None,
    recent: list[dict[str, Any]] | None = None,
    expected_throughput_bps: float | None = None,
    kv_full: float = 0.9,
    kv_idle_s: Mapping[str, float] | None = None,
    down_count: Mapping[str, int] | None = None,
    canary_diverged: Mapping[tuple[str, str], float] | None = None,
) -> list[Raised]:
    """(code, severity, subject, message) for every condition that holds now. Pure;
    ``kv_idle_s`` and ``down_count`` come from :class:`~pdctl.sdk.metrics.watch.
    LifecycleWatch` (what needs memory across scrapes); ``canary_diverged`` is the
    router's new ``diverged`` canary results per (prefill, decode) over the window."""
    out: list[Raised] = []
    insts = list(insts)
    out.extend(_lifecycle(insts, kv_idle_s or {}, down_count or {}))
    for i in insts:
        if i.role != "router" and i.health in ("DOWN", "STALE"):
            out.append(_raise("PA006", i.name, detail=f" ({i.health}): {i.error}"))
        if i.health != "UP":
            continue
        w = i.prompt_tokens_by_source_window
        if (
            i.role == "decode"
            and mode in ("push", "pull")
            and w.get("local_compute", 0) > 0
            and w.get("external_kv_transfer", 0) == 0
        ):
            out.append(_raise("PA001", i.name, w["local_compute"]))
        tr = i.transfers
        rv = i.rendezvous
        # vLLM counts the connector's early releases as expired leases too: not an expiry
        expired = tr.expired_window - (rv.released_window if rv is not None else 0.0)
        if expired > 0:
            out.append(_raise("PA002", i.name, expired))
        if tr.failed_window > 0:
            out.append(_raise("PA003", i.name, tr.failed_window))
        if (
            expected_throughput_bps
            and tr.throughput_bps is not None
            and tr.transfers_window
            and tr.throughput_bps < 0.25 * expected_throughput_bps
        ):
            out.append(
                _raise(
                    "PA004",
                    i.name,
                    tr.throughput_bps / 1e9,
                    expected=f"{expected_throughput_bps / 1e9:.2f}",
                )
            )
        if i.role == "decode" and i.kv_usage is not None and i.kv_usage >= kv_full:
            out.append(_raise("PA007", i.name, i.kv_usage))
        if rv is not None and rv.expired_window > 0:
            out.append(_raise("PA008", i.name, rv.expired_window))
        if rv is not None and rv.receive_failures_window > 0:
            out.append(_raise("PA009", i.name, rv.receive_failures_window))
        if rv is not None and rv.kv_mismatch_window > 0:
            out.append(_raise("PA012", i.name, rv.kv_mismatch_window))
    if mode == "push" and _sequential(router_mode, recent):
        out.append(_raise("PA005", "router"))
    for (p, d), n in sorted((canary_diverged or {}).items()):
        if n > 0:
            out.append(_raise("PA013", pair_subject(p, d), n))
    return out


def pair_subject(prefill: str, decode: str) -> str:
    """How an alert names a P->D pair (its subject, the ``{instance}`` of its message)."""
    return f"{prefill} → {decode}"


def _lifecycle(
    insts: list[InstanceMetrics], kv_idle_s: Mapping[str, float], down_count: Mapping[str, int]
) -> list[Raised]:
    out: list[Raised] = []
    for i in insts:
        held = kv_idle_s.get(i.name, 0.0)
        if holds_kv_idle(i) and held >= KV_IDLE_LIMIT_S:
            out.append(_raise("PA010", i.name, i.kv_usage or 0.0, detail=f"{held:.0f} s"))
        downs = down_count.get(i.name, 0)
        if downs >= CRASH_LIMIT:
            out.append(_raise("PA011", i.name, downs, detail=f"{CRASH_WINDOW_S / 60:.0f} min"))
    return out


def _sequential(router_mode: str | None, recent: list[dict[str, Any]] | None) -> bool:
    """The router dispatches push requests one leg after the other: it says so, or at
    least five recent timelines all sent decode after prefill finished."""
    if router_mode == "push-sequential":
        return True
    both = [
        r
        for r in recent or ()
        if r.get("prefill_done_ms") is not None and r.get("decode_sent_ms") is not None
    ]
    return len(both) >= 5 and all(r["decode_sent_ms"] >= r["prefill_done_ms"] for r in both)
