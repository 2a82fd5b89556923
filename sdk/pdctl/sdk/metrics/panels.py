"""Every panel of a snapshot, each figure either shown or said why not.

A view that finds no value for a figure must not draw a blank or a zero that looks like
data: :func:`panels_of` names, for each panel the CLI and the TUI draw, the figures that
have data in a :class:`~pdctl.sdk.metrics.snapshot.Snapshot` and, for every other one,
the reason (the role that should give it is down or absent, the fleet's mode has no such
figure, the engines run vLLM's stock connector, one scrape gives no rate, nothing
happened in the window, no router was named, the router's option is off), with the fix
where there is one. ``pdctl metrics --json`` carries the answer under ``panels``.

Sans-IO: a pure function of the snapshot and the fleet's mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.metrics.coverage import ENABLE, Coverage, coverage_of
from pdctl.sdk.metrics.snapshot import InstanceMetrics, PairMetrics, Snapshot

ONE_SCRAPE = (
    "a rate is a difference between two scrapes and this snapshot holds one (--once): "
    "stream `pdctl metrics` or open `pdctl top`"
)
NO_ROUTER = (
    "the per-pair figures come from pdctl's router (its recent requests): name it with --router URL"
)
NO_ROUTER_METRICS = (
    "the admission figures come from pdctl's router's /metrics: name it with --router URL"
)
FRONT = ("decode", "colocated")
ENGINES = ("prefill", "decode", "colocated")


@dataclass(frozen=True)
class Panel:
    """One panel: the figures that have data and why each other one has none."""

    name: str
    shown: tuple[str, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)
    """Figure → why it has no data (and how to get it, where pdctl knows)."""

    def as_dict(self) -> dict[str, Any]:
        return {"shown": list(self.shown), "missing": dict(self.missing)}


Get = Callable[[InstanceMetrics], Any]


@dataclass(frozen=True)
class _Figure:
    name: str
    get: Get
    roles: tuple[str, ...] = ENGINES
    rate: bool = False
    """A difference over the window (needs two scrapes)."""
    window: bool = False
    """Counts what happened in the window (none happened: it says so)."""
    connector: str | None = None
    """The :data:`~pdctl.sdk.metrics.coverage.NEEDS_CONNECTOR` figure it belongs to."""
    none: str = "no request finished there, or no transfer"
    """What a window without it means."""


def _has(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, dict | list | tuple):
        return bool(v)
    return True


def _initiator(mode: str) -> tuple[str, ...]:
    """Who records NIXL's transfer figures: the WRITE initiator (prefill in push mode,
    decode in pull)."""
    return ("decode",) if mode == "pull" else ("prefill",)


def _figures(mode: str) -> dict[str, Sequence[_Figure]]:
    xfer = _initiator(mode)
    return {
        "fleet": (
            _Figure("request_rate", lambda i: i.request_rate, ENGINES, rate=True),
            _Figure("running", lambda i: i.running),
            _Figure("waiting", lambda i: i.waiting),
            _Figure("kv_usage", lambda i: i.kv_usage),
            _Figure(
                "prefix_hit_rate",
                lambda i: i.prefix_hit_rate,
                window=True,
                none="vLLM counted no prefix-cache lookup (prefix caching off, or no prompt)",
            ),
        ),
        "latency": (
            _Figure("ttft", lambda i: i.ttft.p50, FRONT, window=True),
            _Figure("itl", lambda i: i.itl.p50, FRONT, window=True),
            _Figure("tpot", lambda i: i.tpot.p50, FRONT, window=True),
            _Figure("e2e", lambda i: i.e2e.p50, FRONT, window=True),
            _Figure("router_ttft", lambda i: i.ttft.p50, ("router",), window=True),
        ),
        "lengths": (
            _Figure("prompt_tokens", lambda i: i.prompt_tokens.mean, FRONT, window=True),
            _Figure("output_tokens", lambda i: i.output_tokens.mean, FRONT, window=True),
        ),
        "transfers": (
            _Figure("bytes_total", lambda i: i.transfers.bytes_total, xfer),
            _Figure("throughput", lambda i: i.transfers.throughput_bps, xfer, rate=True),
            _Figure("xfer_time", lambda i: i.transfers.xfer_time.p50, xfer, window=True),
            _Figure("post_time", lambda i: i.transfers.post_time.p50, xfer, window=True),
            _Figure(
                "descriptors",
                lambda i: i.transfers.descriptors_per_transfer,
                xfer,
                window=True,
            ),
        ),
        "kv_sources": (
            _Figure("kv_fetch_by_stage", lambda i: i.kv_fetch_by_stage, ("decode",)),
            _Figure("prompt_tokens_by_source", lambda i: i.prompt_tokens_by_source, FRONT),
        ),
        "rendezvous": (
            _Figure("prefill", lambda i: i.rendezvous, ("prefill",), connector="rendezvous"),
            _Figure("decode", lambda i: i.rendezvous, ("decode",), connector="rendezvous"),
        ),
    }


def panels_of(snapshot: Snapshot, mode: str | None = None) -> tuple[Panel, ...]:
    """The panels of ``snapshot``; ``mode``: the fleet's (push, pull, colocated), by
    default the router's, else push."""
    if mode is None:
        mode = str((snapshot.router or {}).get("mode") or "push")
    base = mode.split("-")[0]
    cov = coverage_of(snapshot, mode)
    out = []
    for name, figs in _figures(base).items():
        shown: list[str] = []
        missing: dict[str, str] = {}
        for f in figs:
            insts = [i for i in snapshot.instances if i.role in f.roles]
            if any(_has(f.get(i)) for i in insts if i.health == "UP"):
                shown.append(f.name)
            else:
                missing[f.name] = _why(f, insts, snapshot, base, cov)
        out.append(Panel(name, tuple(shown), missing))
    out.append(_pairs(snapshot, base, cov))
    out.append(_admission(snapshot))
    return tuple(out)


def panels_doc(snapshot: Snapshot, mode: str | None = None) -> dict[str, Any]:
    """:func:`panels_of` as JSON: panel → ``{"shown": [...], "missing": {figure: why}}``."""
    return {p.name: p.as_dict() for p in panels_of(snapshot, mode)}


def _why(f: _Figure, insts: list[InstanceMetrics], snap: Snapshot, mode: str, cov: Coverage) -> str:
    who = "/".join(f.roles)
    if f.connector is not None and mode != "push":
        return f"a {mode} fleet has no push rendezvous (the decode reads the KV itself)"
    if not insts:
        return f"no {who} instance in this fleet"
    up = [i for i in insts if i.health == "UP"]
    if not up:
        errs = "; ".join(f"{i.name}: {i.error or i.health}" for i in insts)
        return f"no {who} instance answers ({errs})"
    if f.connector is not None and (note := cov.note(f.connector)):
        return note
    if f.rate and all(i.span_s is None for i in up):
        return ONE_SCRAPE
    if f.window:
        return f"nothing of it happened on {who} in the last {snap.window_s:.0f} s ({f.none})"
    names = ", ".join(i.name for i in up)
    return f"{names} export no series for it (vLLM did not report it yet)"


ADMISSION_FIGURES = ("shed", "admitted", "prediction_error")
"""The admission panel's figures (:class:`~pdctl.sdk.metrics.snapshot.RouterAdmission`
says why each missing one is missing)."""


def _admission(snap: Snapshot) -> Panel:
    adm = snap.admission
    if adm is None:
        return Panel("admission", (), dict.fromkeys(ADMISSION_FIGURES, NO_ROUTER_METRICS))
    values = {
        "shed": adm.shed_per_s,
        "admitted": adm.admitted_per_s,
        "prediction_error": adm.prediction_error_p50,
    }
    shown = tuple(k for k in ADMISSION_FIGURES if values[k] is not None)
    missing = {
        k: adm.missing.get(k, "the router exports no series for it")
        for k in ADMISSION_FIGURES
        if values[k] is None
    }
    return Panel("admission", shown, missing)


ENGINE_SEGMENTS = ("prefill queue", "notification pick-up", "decode scheduling")
"""Segments of the TTFT split measured on the engines' own clocks (their flight
records), present only with pdctl's connector."""


def _pairs(snap: Snapshot, mode: str, cov: Coverage) -> Panel:
    figs: dict[str, Callable[[PairMetrics], Any]] = {
        "requests": lambda p: p.requests,
        "ttft": lambda p: p.ttft_p50_ms,
        "ttft_split": lambda p: p.segments,
        "ttft_split_engines": lambda p: [k for k in p.segments if k in ENGINE_SEGMENTS],
        "kv_verify": lambda p: p.kv_verify,
        "canary": lambda p: p.canary,
    }
    shown = [k for k, get in figs.items() if any(_has(get(p)) for p in snap.pairs)]
    missing: dict[str, str] = {}
    for k in figs:
        if k not in shown:
            missing[k] = _pair_why(k, snap, mode, cov)
    return Panel("pairs", tuple(shown), missing)


def _pair_why(k: str, snap: Snapshot, mode: str, cov: Coverage) -> str:
    if snap.router is None:
        return NO_ROUTER
    if k == "canary":
        return (
            "no canary result from the router yet: its output canary is off unless "
            "[router.canary] rate is above 0 (0 by default)"
        )
    if k in ("ttft_split_engines", "kv_verify") and mode != "push":
        return (
            f"a {mode} fleet pushes nothing: the decode reads the KV inside its own leg, "
            "so the split is the router's and there is no digest check"
        )
    if k in ("ttft_split_engines", "kv_verify") and cov.stock:
        return (
            "the engines' steps and the digest check come from pdctl's connector's flight "
            f"records, which {', '.join(cov.stock)} do not export: {ENABLE}"
        )
    if not snap.pairs:
        return (
            "no request went through the router's prefill -> decode pairs in the last "
            f"{snap.window_s:.0f} s"
        )
    if k == "kv_verify":
        return "no flight of the window measured a push (sampling is off or nothing pushed)"
    return "no request of the window finished ok"
