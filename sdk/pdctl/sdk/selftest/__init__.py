"""``pdctl selftest``: a sequence of checks on this machine, written as one report."""

from pdctl.sdk.selftest.gpu import DEADLINE_S, GpuOptions, gpu_steps
from pdctl.sdk.selftest.runner import (
    SelftestReport,
    Step,
    StepFailed,
    StepResult,
    run_steps,
    write_report,
)

__all__ = [
    "DEADLINE_S",
    "GpuOptions",
    "SelftestReport",
    "Step",
    "StepFailed",
    "StepResult",
    "gpu_steps",
    "run_steps",
    "write_report",
]
