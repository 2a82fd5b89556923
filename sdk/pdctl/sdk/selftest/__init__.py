"""``pdctl selftest``: a sequence of checks on this machine, written as one report."""

from pdctl.sdk.selftest.runner import (
    SelftestReport,
    Step,
    StepFailed,
    StepResult,
    run_steps,
    write_report,
)

__all__ = ["SelftestReport", "Step", "StepFailed", "StepResult", "run_steps", "write_report"]
