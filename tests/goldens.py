"""Expected files (SVG snapshots, manifest goldens) and the one switch that rewrites them.

``pytest --update-goldens`` rewrites every expected file a selected test compares with and
lists the rewritten ones at the end of the run (review the diff before committing). The
switch is a command-line option only: nothing in the environment turns it on, so a golden
can never be compared with itself by accident. Without it, a missing expected file fails
the test, naming the command that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

OPTION = "--update-goldens"


@dataclass
class Goldens:
    """Compares produced text with an expected file, or rewrites it under ``--update-goldens``."""

    update: bool
    repo: Path
    rewritten: list[Path] = field(default_factory=list)

    def check(self, expected: Path, text: str, *, actual: Path | None = None) -> None:
        """Fail unless ``expected`` holds ``text``; a mismatch is written to ``actual`` (when
        given) for review. Under ``--update-goldens`` write ``expected`` instead."""
        if self.update:
            if not expected.exists() or expected.read_text() != text:
                expected.parent.mkdir(parents=True, exist_ok=True)
                expected.write_text(text)
                self.rewritten.append(expected)
            if actual is not None:
                actual.unlink(missing_ok=True)
            return
        rel = expected.relative_to(self.repo) if expected.is_relative_to(self.repo) else expected
        if not expected.exists():
            if actual is not None:
                actual.write_text(text)
            pytest.fail(f"no expected file {rel}: review the output, then run pytest {OPTION}")
        if expected.read_text() != text:
            if actual is not None:
                actual.write_text(text)
                pytest.fail(f"{rel} differs from the output: see {actual.name} ({OPTION} rewrites)")
            pytest.fail(f"{rel} differs from the output ({OPTION} rewrites it)")
        if actual is not None:
            actual.unlink(missing_ok=True)
