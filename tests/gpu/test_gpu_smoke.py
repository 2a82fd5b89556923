"""The GPU smoke kit on a real GPU (``pytest -m gpu tests/gpu``; docs/gpu-smoke.md).

Selected only on GPU machines (CI runs ``-m "not gpu"``). Selected on a machine without
a GPU these tests FAIL, saying so: a GPU run that quietly skipped would read as passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu() -> None:
    smi = shutil.which("nvidia-smi")
    listed = (
        subprocess.run([smi, "-L"], capture_output=True, text=True, check=False).stdout
        if smi
        else ""
    )
    if "GPU" not in listed:
        pytest.fail(
            "these tests are marked gpu and were selected on a machine without an NVIDIA "
            "GPU (nvidia-smi -L lists none); run them on a GPU machine, or deselect them "
            "with -m 'not gpu'"
        )


@pytest.mark.usefixtures("gpu")
def test_the_smoke_kit_passes_on_this_gpu(tmp_path: Path):
    out = tmp_path / "selftest"
    p = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "selftest", "--gpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=660,
        check=False,
    )
    text = (out / "selftest.txt").read_text() if (out / "selftest.txt").exists() else p.stderr
    print(text)
    doc = json.loads((out / "selftest.json").read_text())
    assert p.returncode == 0, text
    assert doc["ok"] is True
    assert doc["seconds"] < 600
    steps = {s["name"]: s for s in doc["steps"]}
    for mode in ("none", "strict"):
        probe = steps[f"probe-{mode}"]["detail"]
        assert probe["mismatched"] == 0
        assert probe["ucx_lane"]
    assert steps["pair"]["detail"]["answered_200"] == 20
