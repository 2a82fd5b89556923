"""Launching past chosen lint errors, on purpose and loudly (``pdctl up --ignore-lint``).

A spec with lint errors does not start. To reproduce a failure lint predicts (a layout
vLLM refuses at run time, say), name the error codes to waive: each waived error becomes
a warning marked ``[waived]`` and is logged as a warning every time the fleet checks its
spec; any other error still refuses the launch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection

from pdctl.sdk.lint import LintReport

_log = logging.getLogger("pdctl.fleet")


def waive(report: LintReport, codes: Collection[str], *, log: bool = False) -> LintReport:
    """``report`` with the errors whose code is in ``codes`` turned into warnings marked
    as waived (so :func:`require_clean` lets the launch go on); with ``log``, each one is
    logged as a warning naming the code, the field and what it will cost."""
    if not codes:
        return report
    findings = []
    for f in report.findings:
        if f.severity == "error" and f.code in codes:
            if log:
                _log.warning(
                    "launching despite lint error %s (--ignore-lint %s) %s: %s; %s",
                    f.code,
                    f.code,
                    f.field,
                    f.message,
                    f.cost,
                )
            f = dataclasses.replace(f, severity="warning", message=f"[waived] {f.message}")
        findings.append(f)
    return dataclasses.replace(report, findings=findings)
