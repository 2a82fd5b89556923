"""What a probe run is asked to do and what it records per request: the types both the
session (which runs it) and the report (which sums it up) use."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pdctl.connector.probe.engine import Device, WriteDone
from pdctl.connector.probe.plan import Geometry

Order = Literal["concurrent", "registration-first", "finished-first"]
Verify = Literal["all", "warmup", "none"]


@dataclass(frozen=True)
class ProbeConfig:
    geometry: Geometry
    tp: int = 1
    count: int = 20
    warmup: int = 3
    rate: float | None = None
    inflight: int = 1
    merge: bool = True
    order: Order = "concurrent"
    verify: Verify = "warmup"
    device: Device = "cpu"
    timeout_s: float = 30.0
    poll_us: float = 200.0
    ucx_params: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["geometry"] = self.geometry.as_dict()
        return d


@dataclass
class ProbeRequest:
    index: int
    target_id: str
    source_id: str
    blocks: tuple[int, ...]
    verify: bool
    dst_blocks: tuple[int, ...] = ()
    started: float = 0.0
    done: dict[int, WriteDone] = field(default_factory=dict)
    received: dict[str, Any] | None = None
    finished_at: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def warmup(self) -> bool:
        return self.index < 0

    def closed(self, tp: int) -> bool:
        return bool(self.errors) or (self.received is not None and len(self.done) == tp)
