"""The suite's own switches: ``--strict-skips`` (CI) and ``--update-goldens``, run on small
test files in a second pytest with this suite's hooks (``tests/conftest.py``) loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, STRICT_SKIPS_VARIABLES

SKIPS = """
import pytest

def test_plain_skip():
    pytest.skip("no such tool")

@pytest.mark.gpu
def test_gpu_skip():
    pytest.skip("no GPU here")

@pytest.mark.skipif(True, reason="condition")
def test_skipif():
    pass

def test_passes():
    pass
"""

MODULE_SKIP = """
import pytest
pytest.importorskip("no_such_module_anywhere")

def test_never_collected():
    pass
"""

GOLDEN = """
from pathlib import Path

def test_compare(golden):
    golden.check(Path(__file__).parent / "expected.txt", "new text\\n")
"""


def run(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in STRICT_SKIPS_VARIABLES}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-rA", "-W", "ignore::pytest.PytestUnknownMarkWarning",
         "--rootdir", str(tmp), "-c", os.devnull, *args, str(tmp)],
        capture_output=True, text=True, cwd=REPO, env={**base, **(env or {})}, timeout=120,
        check=False,
    )  # fmt: skip


def test_skips_are_skips_without_the_switch(tmp_path: Path):
    (tmp_path / "test_skips.py").write_text(SKIPS)
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout
    assert "1 passed, 3 skipped" in r.stdout


def test_strict_skips_fail_every_skip_but_the_allowed_marker(tmp_path: Path):
    (tmp_path / "test_skips.py").write_text(SKIPS)
    for args, env in ((("--strict-skips",), None), ((), {"PDCTL_STRICT_SKIPS": "1"})):
        r = run(tmp_path, *args, env=env)
        assert r.returncode == 1, r.stdout
        assert "1 failed, 1 passed, 1 skipped, 1 error" in r.stdout  # skipif: setup
        assert "test_skips.py::test_plain_skip" in r.stdout.split("FAILED")[-1]
        assert "test_skips.py::test_skipif" in r.stdout.split("ERROR")[-1]
        assert "SKIPPED" in r.stdout
        assert "no GPU here" in r.stdout
        assert "no such tool" in r.stdout
        assert "only tests marked gpu may skip" in r.stdout


def test_strict_skips_fail_a_module_skipped_at_collection(tmp_path: Path):
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    assert "1 skipped" in run(tmp_path).stdout
    r = run(tmp_path, "--strict-skips")
    assert r.returncode != 0
    assert "ERROR collecting test_module_skip.py" in r.stdout
    assert "no_such_module_anywhere" in r.stdout


def test_ci_variable_turns_strict_skips_on(tmp_path: Path):
    (tmp_path / "test_skips.py").write_text(SKIPS)
    assert run(tmp_path, env={"CI": "true"}).returncode == 1
    assert run(tmp_path, env={"CI": "false"}).returncode == 0


def test_update_goldens_rewrites_and_lists_only_under_the_option(tmp_path: Path):
    (tmp_path / "test_golden.py").write_text(GOLDEN)
    expected = tmp_path / "expected.txt"
    r = run(tmp_path)
    assert r.returncode == 1, r.stdout
    assert "no expected file" in r.stdout
    assert not expected.exists()
    # the old environment switches rewrite nothing any more
    env = {"PDCTL_UPDATE_GOLDENS": "1", "PDCTL_UPDATE_SNAPSHOTS": "1"}
    assert run(tmp_path, env=env).returncode == 1
    assert not expected.exists()
    r = run(tmp_path, "--update-goldens")
    assert r.returncode == 0, r.stdout
    assert expected.read_text() == "new text\n"
    assert "--update-goldens: 1 expected file(s) rewritten" in r.stdout
    assert str(expected) in r.stdout or "expected.txt" in r.stdout
    expected.write_text("old text\n")
    r = run(tmp_path)
    assert r.returncode == 1
    assert "differs from the output" in r.stdout
    assert expected.read_text() == "old text\n"
    assert run(tmp_path, "--update-goldens").returncode == 0
    r = run(tmp_path, "--update-goldens")  # already up to date: nothing rewritten
    assert "0 expected file(s) rewritten" in r.stdout
