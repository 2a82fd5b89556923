"""What a benchmark run will do: modes x input lengths x rates, presets, duration estimate
(pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pdctl.sdk.bench.arrivals import count_for
from pdctl.sdk.bench.loadgen import BenchError
from pdctl.sdk.bench.stats import Slo

MODES = ("push", "push-sequential", "pull", "colocated")
FLEET_MODE = {"push": "push", "push-sequential": "push", "pull": "pull", "colocated": "colocated"}
"""The fleet each benchmark mode runs on: push and push-sequential differ only in how
the router dispatches, so they share one fleet (the router is switched, not restarted)."""


@dataclass(frozen=True)
class Cell:
    mode: str
    input_len: int
    rate: float
    """Requests/s (inf: all at once); ignored in closed loop."""
    policy: str = ""
    """The router's selection policy for the cell ("": the spec's)."""


@dataclass(frozen=True)
class BenchPlan:
    modes: tuple[str, ...] = ("push", "push-sequential")
    input_lens: tuple[int, ...] = (512,)
    rates: tuple[float, ...] = (1.0,)
    output_len: int = 16
    cell_duration_s: float = 15.0
    max_requests: int = 64
    warmup: int = 2
    burstiness: float = 1.0
    concurrency: int | None = None
    """Closed loop with this many requests in flight (rates then ignored)."""
    seed: int = 0
    slo: Slo | None = None
    verify: int = 4
    """Requests per cell whose output token ids are compared with one instance's own."""
    prefix_caching: bool = False
    """Off by default (the published grid's setting); unique prompt prefixes anyway."""
    policies: tuple[str, ...] = ()
    """Router selection policies compared cell by cell on the same fleet (empty: the
    spec's own); with cache_aware among them the router is started cache_aware."""
    shared_prefix: tuple[int, int] | None = None
    """(groups, suffix tokens): prompts come in that many groups sharing a prefix, each
    with a unique suffix of that many tokens (None: every prompt unique)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise BenchError(f"unknown mode(s) {bad or self.modes}: choose from {', '.join(MODES)}")
        if not self.input_lens or any(n < 2 for n in self.input_lens):
            raise BenchError("--input-lens: give token counts >= 2")
        if self.concurrency is None and (not self.rates or any(not r > 0 for r in self.rates)):
            raise BenchError("--rates: give request rates > 0 (inf for all at once)")
        if self.output_len < 1:
            raise BenchError("--output-len must be >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchError("--concurrency must be >= 1")
        known = ("round_robin", "least_loaded", "power_of_two", "cache_aware")
        if any(p not in known for p in self.policies):
            raise BenchError(f"unknown policy in {self.policies}: choose from {', '.join(known)}")
        if self.shared_prefix is not None:
            groups, suffix = self.shared_prefix
            if groups < 1 or suffix < 2 or any(n <= suffix for n in self.input_lens):
                raise BenchError(
                    "shared_prefix: give groups >= 1 and a suffix of >= 2 tokens shorter "
                    "than every input length"
                )

    @property
    def fleet_modes(self) -> list[str]:
        """Fleet configurations in run order (each started once)."""
        out: list[str] = []
        for m in self.modes:
            if FLEET_MODE[m] not in out:
                out.append(FLEET_MODE[m])
        return out

    def modes_on(self, fleet_mode: str) -> list[str]:
        return [m for m in self.modes if FLEET_MODE[m] == fleet_mode]

    def cells(self) -> list[Cell]:
        """Cells in run order. The arms that share a fleet (push and push-sequential, and
        every router policy) run side by side for each input length and rate, and their
        order flips from one such point to the next: an arm that always ran first (fresh
        fleet, warm-up) or last (drift over the run) would carry that into its figures."""
        rates = self.rates if self.concurrency is None else (math.inf,)
        out: list[Cell] = []
        for fm in self.fleet_modes:
            arms = [(m, p) for m in self.modes_on(fm) for p in (self.policies or ("",))]
            for k, (n, r) in enumerate((n, r) for n in self.input_lens for r in rates):
                out += [Cell(m, n, r, p) for m, p in (arms if k % 2 == 0 else arms[::-1])]
        return out

    def requests_in(self, cell: Cell) -> int:
        if self.concurrency is not None:
            return self.max_requests
        return count_for(cell.rate, self.cell_duration_s, self.max_requests)

    def estimate_s(self, fleet_start_s: float = 60.0, request_s: float = 1.0) -> float:
        """Rough wall time: fleet starts, warm-ups, cells, reference checks."""
        total = len(self.fleet_modes) * fleet_start_s
        for c in self.cells():
            if self.concurrency is None and not math.isinf(c.rate):
                total += self.requests_in(c) / c.rate + request_s
            else:
                n, k = self.requests_in(c), self.concurrency or self.requests_in(c)
                total += math.ceil(n / k) * request_s
            total += (self.warmup + self.verify) * request_s
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "modes": list(self.modes),
            "input_lens": list(self.input_lens),
            "rates": [str(r) if math.isinf(r) else r for r in self.rates],
            "output_len": self.output_len,
            "cell_duration_s": self.cell_duration_s,
            "max_requests": self.max_requests,
            "warmup": self.warmup,
            "burstiness": self.burstiness,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "verify": self.verify,
            "prefix_caching": self.prefix_caching,
            "policies": list(self.policies),
            "shared_prefix": list(self.shared_prefix) if self.shared_prefix else None,
            "slo": None if self.slo is None else vars(self.slo),
        }

    def with_(self, **kw: Any) -> BenchPlan:
        return replace(self, **kw)


PRESETS: dict[str, BenchPlan] = {
    # minutes on the local 2-core CPU demo fleet: the push vs push-sequential question
    # (20 s cells: with 10 requests a cell's median TTFT moved by as much as the gap)
    "cpu-smoke": BenchPlan(
        modes=("push", "push-sequential"),
        input_lens=(512,),
        rates=(1.0, 2.0),
        output_len=16,
        cell_duration_s=20.0,
        max_requests=48,
        warmup=2,
        verify=4,
    ),
    # the published push-vs-pull grid: 1k-16k input, 1-8 req/s, 128 output, no caching
    "paper": BenchPlan(
        modes=("push", "pull"),
        input_lens=(1024, 2048, 4096, 8192, 16384),
        rates=(1.0, 2.0, 4.0, 8.0),
        output_len=128,
        cell_duration_s=60.0,
        max_requests=480,
        warmup=4,
        verify=8,
    ),
    # cache_aware vs least_loaded on one push fleet with prefix caching: 4 groups of
    # prompts sharing a 480-token prefix, unique 32-token suffixes, closed loop
    "shared-prefix": BenchPlan(
        modes=("push",),
        input_lens=(512,),
        rates=(math.inf,),
        output_len=16,
        concurrency=2,
        max_requests=32,
        warmup=2,
        verify=4,
        prefix_caching=True,
        policies=("least_loaded", "cache_aware"),
        shared_prefix=(4, 32),
    ),
}
