"""Port planning, per host: explicit bases are honoured first (the linter reports clashes
between them), then every group without one gets the first free range at or above its
role's default base, so automatic ports never collide with anything."""

from __future__ import annotations

from collections.abc import Iterable

from pdctl.sdk.spec import FleetSpec, Role

DEFAULT_HTTP_BASE: dict[str, int] = {"prefill": 8100, "decode": 8200, "render": 8300}
DEFAULT_SIDE_CHANNEL_BASE = 5600
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "ip6-localhost"})


def host_key(host: str) -> str:
    """Hosts that share one port space (all loopback/wildcard spellings are one)."""
    h = host.strip().lower()
    return "local" if h in _LOOPBACK_NAMES or h.startswith("127.") else h


def is_loopback(host: str) -> bool:
    h = host.strip().lower()
    return h in ("localhost", "::1", "ip6-localhost") or h.startswith("127.")


def is_wildcard(host: str) -> bool:
    return host.strip() in ("0.0.0.0", "::", "")


class PortBook:
    """Per-host sets of taken ports."""

    def __init__(self) -> None:
        self.taken: dict[str, set[int]] = {}

    def take(self, host: str, ports: Iterable[int]) -> None:
        self.taken.setdefault(host_key(host), set()).update(ports)

    def first_free_range(self, host: str, base: int, width: int) -> int:
        used = self.taken.setdefault(host_key(host), set())
        start = base
        while any(p in used for p in range(start, start + width)):
            start += 1
        if start + width - 1 > 65535:
            raise ValueError(f"no free range of {width} ports at or above {base} on {host}")
        return start


def group_ports(
    spec: FleetSpec, book: PortBook | None = None
) -> dict[tuple[Role, int], tuple[int, int]]:
    """(role, group index) → (first HTTP port, first side-channel port)."""
    book = book if book is not None else PortBook()
    if spec.router is not None:
        book.take(spec.router.host, [spec.router.port])
    groups = spec.groups()
    # explicit ports first, so automatic ones keep clear of them wherever they appear
    for _role, _gi, g in groups:
        if g.http_port is not None:
            book.take(g.host, range(g.http_port, g.http_port + g.count))
        if g.side_channel_port is not None:
            book.take(g.host, range(g.side_channel_port, g.side_channel_port + g.count * g.dp))
    out: dict[tuple[Role, int], tuple[int, int]] = {}
    for role, gi, g in groups:
        http = g.http_port
        if http is None:
            http = book.first_free_range(g.host, DEFAULT_HTTP_BASE[role], g.count)
            book.take(g.host, range(http, http + g.count))
        sc = g.side_channel_port
        if sc is None:
            width = g.count * g.dp
            sc = book.first_free_range(g.host, DEFAULT_SIDE_CHANNEL_BASE, width)
            book.take(g.host, range(sc, sc + width))
        out[(role, gi)] = (http, sc)
    return out


def kv_events_ports(spec: FleetSpec, book: PortBook) -> dict[tuple[Role, int], int]:
    """(role, group index) → first KV event port (two per instance and DP rank: vLLM
    offsets both sockets by the rank), when the fleet publishes KV events."""
    if not spec.kv_events_on:
        return {}
    out: dict[tuple[Role, int], int] = {}
    for role, gi, g in spec.groups():
        width = 2 * g.count * g.dp
        first = book.first_free_range(g.host, spec.fleet.kv_events_port_base, width)
        book.take(g.host, range(first, first + width))
        out[(role, gi)] = first
    return out


def render_server_ports(spec: FleetSpec, book: PortBook) -> list[int]:
    """First HTTP port of every render group (explicit ones first)."""
    for r in spec.render:
        if r.http_port is not None:
            book.take(r.host, range(r.http_port, r.http_port + r.count))
    out = []
    for r in spec.render:
        http = r.http_port
        if http is None:
            http = book.first_free_range(r.host, DEFAULT_HTTP_BASE["render"], r.count)
            book.take(r.host, range(http, http + r.count))
        out.append(http)
    return out
