"""Launching past chosen lint errors: only the named codes, marked and logged."""

from __future__ import annotations

import logging

import pytest

from pdctl.sdk.errors import LintFailed
from pdctl.sdk.fleet.waiver import waive
from pdctl.sdk.lint import LintReport, require_clean
from pdctl.sdk.lint.core import Finding


def _report(*codes: str) -> LintReport:
    findings = [
        Finding(c, "error", f"field.{c}", f"problem {c}", "it fails", "fix it") for c in codes
    ]
    findings.append(Finding("PD012", "warning", "w", "shared cores", "slow", "more cores"))
    return LintReport(findings=findings, plan=object())  # type: ignore[arg-type]


def test_only_the_named_errors_are_waived_and_each_is_logged(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="pdctl.fleet"):
        out = waive(_report("PD005", "PD001"), {"PD005"}, log=True)
    assert [f.code for f in out.errors] == ["PD001"]
    (waived,) = [f for f in out.findings if f.code == "PD005"]
    assert (waived.severity, waived.message) == ("warning", "[waived] problem PD005")
    assert "launching despite lint error PD005" in caplog.text
    assert "field.PD005" in caplog.text
    with pytest.raises(LintFailed, match="PD001"):
        require_clean(out)
    assert require_clean(waive(_report("PD005"), {"PD005"})) is not None


def test_nothing_named_changes_nothing():
    report = _report("PD005")
    assert waive(report, ()) is report
    with pytest.raises(LintFailed, match="PD005"):
        require_clean(waive(report, {"PD001"}))
