"""What a snapshot can and cannot show, by connector.

vLLM's own series (latencies, queues, KV usage, NIXL transfer figures, the decode's
KV-fetch stages and prompt-token sources) exist with any NIXL connector. The push
rendezvous (``pdctl:push_*``) and the prefill- and decode-side segments of the TTFT split
(``pdctl:flight_*``) exist only with pdctl's connector. :func:`coverage_of` says which
engines run without it and what is therefore missing, with how to enable it, so a view
labels the gap instead of showing zeros that look like data.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.sdk.metrics.snapshot import Snapshot

ENABLE = (
    'set "kv_connector": "PdctlPushConnector" and "kv_connector_module_path": '
    '"pdctl.connector.push" in vLLM\'s --kv-transfer-config on prefill and decode '
    '(fleet.connector = "pdctl" in a pdctl spec, the default)'
)
"""How to turn pdctl's connector on (vLLM loads a connector class from
``kv_connector_module_path``: vllm/config/kv_transfer.py)."""
NEEDS_CONNECTOR = {
    "rendezvous": "the push rendezvous (registrations and prefills waiting, WRITEs in "
    "flight, arrival order, match waits, expiries)",
    "ttft_split": "the prefill- and decode-side segments of the TTFT split (admission, "
    "WRITE posting and completion, notification)",
}
"""Figure → what needs pdctl's connector."""


@dataclass(frozen=True)
class Coverage:
    connector: str
    """``pdctl`` (every engine that answered runs it), ``stock`` (none does), ``mixed``,
    ``unknown`` (no engine answered yet) or ``n/a`` (pull and colocated fleets: neither
    figure exists there, whichever the connector)."""
    stock: tuple[str, ...] = ()
    """Engines that answered without pdctl's connector series."""

    @property
    def missing(self) -> tuple[str, ...]:
        """The figures (keys of :data:`NEEDS_CONNECTOR`) some engine cannot give."""
        return tuple(NEEDS_CONNECTOR) if self.stock else ()

    def note(self, figure: str) -> str | None:
        """Why ``figure`` is missing and how to get it; None when it is not."""
        if figure not in self.missing:
            return None
        if self.connector == "stock":
            who = "no engine runs"
        else:
            who = f"{', '.join(self.stock)} {'does' if len(self.stock) == 1 else 'do'} not run"
        return (
            f"{NEEDS_CONNECTOR[figure]} needs pdctl's connector, which {who} "
            f"(vLLM's own connector exports nothing about it): {ENABLE}"
        )


def coverage_of(snapshot: Snapshot, mode: str | None = None) -> Coverage:
    """``mode``: the fleet's (push, pull, colocated); default the router's, else push."""
    if mode is None:
        mode = str((snapshot.router or {}).get("mode") or "push")
    if not mode.startswith("push"):
        return Coverage("n/a")
    engines = [
        i
        for i in snapshot.instances
        if i.role in ("prefill", "decode") and i.pdctl_series is not None
    ]
    if not engines:
        return Coverage("unknown")
    stock = tuple(i.name for i in engines if not i.pdctl_series)
    if not stock:
        return Coverage("pdctl")
    return Coverage("stock" if len(stock) == len(engines) else "mixed", stock)
