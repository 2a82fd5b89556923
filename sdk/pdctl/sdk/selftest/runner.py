"""Steps in order, each timed and kept to its budget, and one report (JSON + text).

Pure apart from the clock and the report files: a :class:`Step` is a name, a budget and a
callable that returns what it found (a dict) or raises :class:`StepFailed` with what
went wrong. :func:`run_steps` runs them in order; a failing step does not stop the
others, except those that ``need`` it (they are reported as skipped, naming it), and
steps that no longer fit in the whole run's deadline are skipped too.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["ok", "failed", "skipped"]


class StepFailed(Exception):
    """A step's check failed; ``detail`` is what it found before it failed."""

    def __init__(self, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail = detail or {}


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[float], dict[str, Any]]
    """Called with the seconds it may take; returns what it found."""
    budget_s: float
    needs: tuple[str, ...] = ()
    """Steps that must have passed for this one to run."""


@dataclass
class StepResult:
    name: str
    title: str
    outcome: Outcome
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class SelftestReport:
    kind: str
    started_at: str
    host: str
    steps: list[StepResult]
    seconds: float
    deadline_s: float

    @property
    def ok(self) -> bool:
        return all(s.outcome == "ok" for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def text(self) -> str:
        lines = [
            f"pdctl selftest --{self.kind} on {self.host}, {self.started_at}: "
            f"{'PASSED' if self.ok else 'FAILED'} in {self.seconds:.0f} s "
            f"(deadline {self.deadline_s:.0f} s)",
        ]
        for s in self.steps:
            mark = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}[s.outcome]
            lines.append(f"  [{mark}] {s.title} ({s.seconds:.1f} s)")
            if s.error:
                lines.append(f"         {s.error}")
            for key, value in s.detail.items():
                if isinstance(value, (str, int, float, bool)) or value is None:
                    lines.append(f"         {key}: {value}")
        return "\n".join(lines) + "\n"


def run_steps(
    kind: str,
    steps: Sequence[Step],
    *,
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
    on_step: Callable[[StepResult], None] | None = None,
) -> SelftestReport:
    """Run ``steps`` in order within ``deadline_s`` in all (see the module)."""
    t0 = clock()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: list[StepResult] = []
    passed: set[str] = set()
    for step in steps:
        left = deadline_s - (clock() - t0)
        missing = [n for n in step.needs if n not in passed]
        if missing:
            res = StepResult(step.name, step.title, "skipped", 0.0, error=f"needs {missing[0]}")
        elif left < step.budget_s:
            why = f"out of time: {left:.0f} s left of the {deadline_s:.0f} s deadline"
            res = StepResult(step.name, step.title, "skipped", 0.0, error=why)
        else:
            s0 = clock()
            try:
                detail = step.run(step.budget_s)
                res = StepResult(step.name, step.title, "ok", clock() - s0, detail)
            except StepFailed as e:
                res = StepResult(step.name, step.title, "failed", clock() - s0, e.detail, str(e))
            except Exception as e:  # a step's bug is its failure, not the kit's end
                err = f"{type(e).__name__}: {e}"
                res = StepResult(step.name, step.title, "failed", clock() - s0, error=err)
            if res.outcome == "ok":
                passed.add(step.name)
        results.append(res)
        if on_step is not None:
            on_step(res)
    return SelftestReport(kind, started, platform.node(), results, clock() - t0, deadline_s)


def write_report(report: SelftestReport, out_dir: Path) -> tuple[Path, Path]:
    """``selftest.json`` and ``selftest.txt`` in ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, txt = out_dir / "selftest.json", out_dir / "selftest.txt"
    js.write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    txt.write_text(report.text())
    return js, txt
