"""What ``pdctl audit`` finds, as plain data: every listener of a fleet, what each answered
an outsider (no credentials), and the verdict per listener with its fix. Pure: the I/O
that fills these lives in :mod:`.sockets` and :mod:`.probe`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pdctl.sdk.fleetplan import is_loopback

Kind = Literal[
    "vllm-http",
    "side-channel",
    "kv-events",
    "router",
    "prometheus",
    "supervisor-socket",
    "unplanned",
]
"""``unplanned``: the OS shows it listening in a fleet process, no plan names it."""

Exposure = Literal["loopback", "network", "unix"]


@dataclass(frozen=True)
class Listener:
    """One place a fleet listens: a TCP address or a unix socket."""

    owner: str
    """The instance (``prefill-0``, ``router``) or ``supervisor``."""
    kind: Kind
    host: str
    """The bound address (the OS's when it saw it, else the plan's)."""
    port: int | None = None
    path: str | None = None
    """A unix socket's path."""
    pid: int | None = None
    process: str | None = None
    """The listening process's name (``/proc/PID/comm``)."""
    planned: bool = True
    seen: bool | None = None
    """True: the OS shows it listening; False: planned but not listening; None: the OS
    view was not taken (a remote backend)."""
    mode: int | None = None
    """A unix socket's permission bits."""

    @property
    def address(self) -> str:
        if self.path is not None:
            return self.path
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def exposure(self) -> Exposure:
        if self.path is not None:
            return "unix"
        return "loopback" if is_loopback(self.host) else "network"


@dataclass(frozen=True)
class Answer:
    """One probe, made as an outsider: no key, no client certificate."""

    probe: str
    """``GET /metrics``, ``POST /invocations``, ``TCP connect``, ``mode``."""
    status: int | None
    """The HTTP status; None for a non-HTTP probe or no answer."""
    open: bool
    """It answered without credentials (a 401/403, 404, refused or silent probe: False)."""
    public: bool = False
    """Open by design (``/health``; the router's ``/metrics`` for Prometheus)."""
    note: str = ""


@dataclass(frozen=True)
class Finding:
    listener: Listener
    answers: tuple[Answer, ...]
    open: bool
    """Something answered without credentials where the spec says it should not."""
    verdict: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self.listener)
        d["address"] = self.listener.address
        d["exposure"] = self.listener.exposure
        return {
            "listener": d,
            "open": self.open,
            "verdict": self.verdict,
            "fix": self.fix,
            "answers": [asdict(a) for a in self.answers],
        }


@dataclass
class AuditReport:
    fleet: str
    backend: str
    findings: list[Finding] = field(default_factory=list)
    probed: bool = True
    """False: listeners from the spec's launch plan only (nothing was probed)."""
    notes: list[str] = field(default_factory=list)
    strict: bool = False
    """Loopback counts as exposed (``--strict``): other users of the machine are outsiders."""

    @property
    def open(self) -> list[Finding]:
        return [f for f in self.findings if f.open]

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "backend": self.backend,
            "probed": self.probed,
            "strict": self.strict,
            "open": len(self.open),
            "listeners": len(self.findings),
            "findings": [f.as_dict() for f in self.findings],
            "notes": self.notes,
        }


def judge(
    listener: Listener, answers: tuple[Answer, ...], *, strict: bool = False, probed: bool = True
) -> Finding:
    """The verdict on one listener: open when something answered an outsider, not by
    design, and the listener is reachable beyond loopback (or ``strict``); a unix socket
    is open when anyone but its owner may connect. ``probed`` False: the answers are the
    spec's (a remote backend), and the verdict says so."""
    answered = [a for a in answers if a.open and not a.public]
    if not probed:
        reachable = listener.exposure == "network" or strict
        is_open = bool(answered) and reachable
        why = "; ".join(a.note for a in answers)
        return Finding(
            listener,
            answers,
            is_open,
            f"not probed; by the spec: {why}",
            fix_for(listener) if is_open else "",
        )
    if listener.exposure == "unix":
        loose = listener.mode is not None and listener.mode & 0o077 != 0
        mode = f"{listener.mode:o}" if listener.mode is not None else "?"
        if loose:
            return Finding(
                listener, answers, True, f"mode {mode}: others may connect", fix_for(listener)
            )
        return Finding(listener, answers, False, f"mode {mode}: owner only")
    if listener.seen is False:
        return Finding(listener, answers, False, "planned, not listening")
    reachable = listener.exposure == "network" or strict
    if not answered:
        if any(a.public for a in answers if a.open):
            return Finding(listener, answers, False, "only public routes answer without a key")
        return Finding(listener, answers, False, "nothing answers without credentials")
    what = ", ".join(a.probe for a in answered[:6]) + (" …" if len(answered) > 6 else "")
    if not reachable:
        return Finding(
            listener, answers, False, f"loopback only; answers without credentials: {what}"
        )
    where = "beyond loopback" if listener.exposure == "network" else "on loopback (--strict)"
    return Finding(
        listener, answers, True, f"{where}, answers without credentials: {what}", fix_for(listener)
    )


_FIX: dict[str, str] = {
    "vllm-http": (
        "keep vLLM's port reachable from the router only: on one machine the group's "
        "host = 127.0.0.1; on Kubernetes backend.k8s.network_policies = true. vLLM's "
        "--api-key guards only /v1, /v2, /inference and /cohere (GUARDED_PREFIX in "
        "vllm/entrypoints/serve/middleware/authenticate.py; vllm#58144), so /invocations, "
        "/tokenize, /metrics and the rest answer anyone who reaches the port"
    ),
    "side-channel": (
        "NIXL's side channel has no authentication: set the group's side_channel_host to "
        "127.0.0.1 on one machine, or keep it to the fleet's pods (backend.k8s."
        "network_policies = true)"
    ),
    "kv-events": (
        "vLLM's ZMQ KV-event publisher and replay sockets have no authentication, and the "
        "launch plan binds them to every interface (tcp://*, as pods need): on one machine "
        "block their ports from the network (a firewall); on Kubernetes keep them to the "
        "router (backend.k8s.network_policies = true)"
    ),
    "router": (
        "add [[router.keys]] with role = 'admin' (control) and role = 'inference' keys "
        "(completions), and drop router.insecure_control (lint PD045)"
    ),
    "prometheus": ("Prometheus has no authentication: observability.prometheus_host = '127.0.0.1'"),
    "supervisor-socket": "chmod 600 the control socket (pdctl creates it 0600; restart the fleet)",
    "unplanned": (
        "not in the launch plan: a library inside the process opened it (UCX's TCP "
        "transport listens on every device UCX_NET_DEVICES allows; Gloo on the address the "
        "host name resolves to). On one machine bind the engines to loopback (UCX then keeps "
        "to lo by default) or set fleet.ucx.net_devices = 'lo'; on a cluster allow only "
        "the fleet's pods to reach it (NetworkPolicies, a firewall)"
    ),
}


def fix_for(listener: Listener) -> str:
    return _FIX[listener.kind]
