"""Every kind of fleet event, in one registry: a new kind is one :func:`kind` line.

A kind names where its events come from (``source``), how loud they are (``severity``)
and what one means. Readers (``pdctl events``, the timeline view) filter and style by
these, so an event of a kind registered later shows up everywhere without other changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "notice", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("info", "notice", "warning", "error")


@dataclass(frozen=True)
class Kind:
    name: str
    source: str
    """supervisor | operator | monitor | router (who saw it happen)."""
    severity: Severity
    meaning: str


KINDS: dict[str, Kind] = {}


def kind(name: str, source: str, severity: Severity, meaning: str) -> str:
    """Register a kind; returns its name (the constant callers emit)."""
    if name in KINDS and KINDS[name] != Kind(name, source, severity, meaning):
        raise ValueError(f"event kind {name!r} registered twice with different meanings")
    KINDS[name] = Kind(name, source, severity, meaning)
    return name


UNKNOWN = Kind("?", "?", "info", "a kind this pdctl does not know (written by a newer one)")


def kind_of(name: str) -> Kind:
    return KINDS.get(name) or Kind(name, UNKNOWN.source, UNKNOWN.severity, UNKNOWN.meaning)


# the supervisor's lifecycle events (pdctl.sdk.fleet.events.EventKind, same names)
STARTING = kind("starting", "supervisor", "info", "an instance's process is starting")
READY = kind("ready", "supervisor", "notice", "an instance answers /health and serves")
EXITED = kind("exited", "supervisor", "error", "an instance's process exited unasked")
UNHEALTHY = kind("unhealthy", "supervisor", "error", "an instance's /health failed or hung")
BACKOFF = kind("backoff", "supervisor", "warning", "a restart by policy waits out its backoff")
RESTARTING = kind("restarting", "supervisor", "warning", "an instance is being restarted")
RESTARTED = kind("restarted", "supervisor", "notice", "a restarted instance is ready again")
GAVE_UP = kind("gave-up", "supervisor", "error", "crash loop: the policy stopped restarting")
STOPPING = kind("stopping", "supervisor", "info", "an instance is being stopped")
STOPPED = kind("stopped", "supervisor", "info", "an instance was stopped")
FLEET_READY = kind("fleet-ready", "supervisor", "notice", "every instance of the fleet is ready")
FLEET_STOPPED = kind("fleet-stopped", "supervisor", "info", "the fleet was taken down")
# operators
CONTROL = kind("control", "operator", "notice", "a control action, with who asked for it")
# the monitor (what the UI or `pdctl events` saw while watching)
ALERT_RAISED = kind("alert-raised", "monitor", "warning", "an alert started firing")
ALERT_CLEARED = kind("alert-cleared", "monitor", "info", "an alert stopped firing")
HEALTH = kind("health", "monitor", "warning", "an instance's /metrics health changed")
# the router (from its control state and its request timelines)
ROUTED = kind("routed", "router", "warning", "the router took an instance in or out of rotation")
BREAKER = kind("breaker", "router", "warning", "an instance's circuit breaker changed state")
DRAIN = kind("drain", "router", "notice", "an instance was drained or resumed")
MODE = kind("mode", "router", "notice", "the router's dispatch mode changed")
RETRY = kind("retry", "router", "warning", "a request's leg was re-sent after a failure")
MIGRATION = kind("migration", "router", "warning", "a request's decode moved to another instance")
KV_RELEASE = kind("kv-release", "router", "notice", "prefill asked to free KV decode never read")
REQUEST_FAILED = kind("request-failed", "router", "error", "a request ended in an error")
CANARY_DIVERGED = kind(
    "canary-diverged",
    "router",
    "error",
    "a greedy request replayed on one instance alone answered differently (router.canary)",
)
# the router's audit log (router-audit.jsonl): what it did and whom it refused, by key name
AUTH_FAILURE = kind(
    "auth-failure", "router", "warning", "the router refused a key (401) or a role (403)"
)
AUDITED = kind("audited", "router", "notice", "a control action the router carried out, by key")
