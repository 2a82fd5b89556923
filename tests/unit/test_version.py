"""One version: the package metadata, ``pdctl --version`` and ``pdctl.sdk.__version__``
come from the same line, and it is ahead of the last release in the CHANGELOG."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pdctl.sdk

ROOT = Path(__file__).resolve().parents[2]


def test_packaging_reads_the_sdk_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    path = ROOT / project["tool"]["hatch"]["version"]["path"]
    assert f'__version__ = "{pdctl.sdk.__version__}"' in path.read_text()


def test_cli_reports_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"pdctl {pdctl.sdk.__version__}"


def test_it_is_ahead_of_the_last_release() -> None:
    released = re.findall(r"^## \[(\d+)\.(\d+)\.(\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released, "the CHANGELOG names its releases"
    last = max(tuple(map(int, r)) for r in released)
    mine = tuple(map(int, re.match(r"(\d+)\.(\d+)\.(\d+)", pdctl.sdk.__version__).groups()))  # type: ignore[union-attr]
    assert mine > last, f"{pdctl.sdk.__version__} is not after the released {last}"
