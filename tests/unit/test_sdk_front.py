"""The SDK's front door: one import, every export the object its name promises, the
functions take what the loaders give, the quickstart type-checks, typed metrics, the
tiny-model builder's errors and the one router-URL helper. (The router client's own
tests are test_client.py.)"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from tests.unit.test_launcher import fake_python, make_spec, state_root

__all__ = ["fake_python", "state_root"]  # fixtures shared with the launcher tests

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "sdk_quickstart.py"
TOUR = ROOT / "examples" / "sdk_tour.py"


def mypy_strict(script: Path) -> None:
    from mypy import api

    out, err, rc = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            str(script),
        ]
    )
    assert rc == 0, out + err
    assert "Success" in out


# ---------------------------------------------------------------------- the front door


def _type_checking_imports() -> dict[str, str]:
    """name -> module, from the front door's ``if TYPE_CHECKING:`` block."""
    tree = ast.parse((ROOT / "sdk" / "pdctl" / "sdk" / "__init__.py").read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    return {
        alias.name: str(imp.module)
        for imp in block.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    }


def test_every_export_is_the_object_its_name_promises():
    import pdctl.sdk as sdk

    importlib.import_module("pdctl.sdk.lint")  # a subpackage named like an export
    typed = _type_checking_imports()
    assert set(sdk.__all__) - {"__version__"} == set(sdk._EXPORTS) == set(typed)
    for name in sdk._EXPORTS:
        obj = getattr(sdk, name)
        assert not isinstance(obj, types.ModuleType), name
        # the object mypy is told about (TYPE_CHECKING) is the one a script gets
        assert obj is getattr(importlib.import_module(typed[name]), name), name
        assert f"pdctl.sdk.{sdk._EXPORTS[name]}" == typed[name], name
        if name[0].isupper():
            assert inspect.isclass(obj), name
        else:
            assert inspect.isfunction(obj), name
    from pdctl.sdk.fleet import AsyncFleet, Fleet
    from pdctl.sdk.lint.core import lint

    assert sdk.Fleet is Fleet
    assert sdk.AsyncFleet is AsyncFleet
    assert sdk.lint is lint
    assert isinstance(sdk.__version__, str)


def test_lint_is_the_function_whatever_was_imported_first():
    code = (
        "import pdctl.sdk.lint.core\n"  # the subpackage first: Python binds it to the parent
        "from pdctl.sdk import lint\n"
        "from pdctl.sdk.lint import RULES, core\n"  # the subpackage itself still imports
        "import pdctl.sdk\n"
        "print(type(lint).__name__, pdctl.sdk.lint is core.lint, len(RULES) > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["function", "True", "True"]


def test_the_functions_take_what_the_loaders_give(tmp_path: Path, fake_python: str):
    from pdctl.sdk import AsyncFleet, LintReport, build_plan, lint, load_spec

    loaded = load_spec(ROOT / "examples" / "cpu-1p1d.toml", ["model.path=" + str(tmp_path)])
    report = lint(loaded, check_bound_ports=False)
    assert isinstance(report, LintReport)
    assert report.plan is not None
    assert report.plan == lint(loaded.spec, check_bound_ports=False).plan
    assert build_plan(loaded) == build_plan(loaded.spec)
    spec = make_spec(fake_python)
    from pdctl.sdk import LoadedSpec

    fleet = AsyncFleet(LoadedSpec(spec=spec, source="mine.toml", path=None))
    assert (fleet.spec, fleet.source) == (spec, "mine.toml")
    assert AsyncFleet(spec).source == "<spec>"


def test_load_demo_spec_finds_the_tiny_model_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from pdctl import sdk
    from pdctl.sdk import demo

    built: list[bool] = []

    def ensure() -> Path:
        built.append(True)
        return tmp_path / "tiny"

    monkeypatch.setattr(demo, "ensure_tiny_model", ensure)
    assert sdk.load_demo_spec().spec.model.path == str(tmp_path / "tiny")
    assert sdk.load_demo_spec("/m", ["router.port=9123"]).spec.router is not None
    assert built == [True]  # a given model is used as it is


def test_docs_list_every_export():
    import pdctl.sdk as sdk

    text = (ROOT / "docs" / "sdk.md").read_text()
    table = text.split("## What is exported", 1)[1].split("\n## ", 1)[0]
    listed = set(
        re.findall(
            r"`([A-Za-z_]+)`",
            "".join(row.split("|")[1] for row in table.splitlines() if row.startswith("| `")),
        )
    )
    assert listed == set(sdk.__all__) - {"__version__"}


def test_readme_and_docs_show_the_quickstart_as_it_is():
    script = QUICKSTART.read_text()
    for doc in (ROOT / "README.md", ROOT / "docs" / "sdk.md"):
        assert f"```python\n{script}```" in doc.read_text(), doc


def test_quickstart_uses_only_pdctl_sdk_and_passes_mypy_strict(monkeypatch: pytest.MonkeyPatch):
    # the SDK is typed for users' type checkers (PEP 561), and checked here from source
    assert (ROOT / "sdk" / "pdctl" / "sdk" / "py.typed").is_file()
    monkeypatch.chdir(ROOT)  # pyproject's mypy_path is relative to the working directory

    text = QUICKSTART.read_text()
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["from pdctl.sdk import Fleet"]
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 10
    mypy_strict(QUICKSTART)


def test_tour_uses_only_the_public_api_and_passes_mypy_strict(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    text = TOUR.read_text()
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert [ln for ln in imports if "pdctl" in ln] == [
        "from pdctl.sdk import Fleet, RouterClient, lint, load_demo_spec, require_clean"
    ]
    assert all("pdctl" in ln or ln in ("import json", "from typing import Any") for ln in imports)
    mypy_strict(TOUR)


# ---------------------------------------------------------------------- helpers


def test_router_url_has_one_helper():
    from pdctl.sdk import SpecError, load_demo_spec
    from pdctl.sdk.urls import http_url, router_url

    assert http_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert http_url("::", 8000) == "http://127.0.0.1:8000"
    assert http_url("fe80::1", 8000) == "http://[fe80::1]:8000"
    assert http_url("10.0.0.2", 81) == "http://10.0.0.2:81"
    loaded = load_demo_spec("/m", ["router.port=9123", "router.host=0.0.0.0"])
    assert loaded.router_url == "http://127.0.0.1:9123"
    spec = loaded.spec.model_copy(update={"router": None})
    with pytest.raises(SpecError) as e:
        router_url(spec)
    assert e.value.problems[0].field == "router"
    assert "[router]" in e.value.problems[0].fix


def test_tiny_model_builder_failure_names_the_missing_extra(tmp_path: Path):
    from pdctl.sdk import LaunchError, ensure_tiny_model

    fake = tmp_path / "python"
    fake.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            echo "ModuleNotFoundError: No module named 'torch'" >&2
            exit 1
            """
        )
    )
    fake.chmod(0o755)
    with pytest.raises(LaunchError, match=r"pdctl\[cpu\]"):
        ensure_tiny_model(tmp_path / "m", python=str(fake))
    (tmp_path / "broken").write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    (tmp_path / "broken").chmod(0o755)
    with pytest.raises(LaunchError, match="boom"):
        ensure_tiny_model(tmp_path / "m", python=str(tmp_path / "broken"))


def test_tiny_model_is_reused_without_running_the_builder(tmp_path: Path):
    from pdctl.sdk import ensure_tiny_model
    from pdctl.sdk.paths import TINY_FORMAT, TINY_MARKER

    (tmp_path / TINY_MARKER).write_text(f'{{"format": {TINY_FORMAT}}}')
    (tmp_path / "config.json").write_text("{}")
    assert ensure_tiny_model(tmp_path, python="/nonexistent/python") == tmp_path


# ---------------------------------------------------------------------- Fleet facade


def test_sync_fleet_stops_restarts_snapshots_and_always_goes_down(
    fake_python: str, state_root: Path
):
    from pdctl.sdk import Fleet, SpecError, Summary
    from pdctl.sdk.fleet import read_state

    spec = make_spec(fake_python)  # no [router] table
    with Fleet(spec, grace=2, ready_timeout=60) as fleet:
        assert fleet.instance_names() == ["prefill-0", "decode-0"]
        snap = fleet.snapshot()
        assert isinstance(snap.summary, Summary)
        assert snap.summary.instances == 2
        assert [i.name for i in snap.instances] == ["prefill-0", "decode-0"]
        fleet.stop("decode-0")
        assert {s.name: s.state for s in fleet.status()}["decode-0"] == "stopped"
        fleet.restart("decode-0")
        assert {s.name: s.state for s in fleet.status()}["decode-0"] == "ready"
        with pytest.raises(SpecError) as e:
            _ = fleet.router
        assert e.value.problems[0].field == "router"
    assert read_state(state_root / "t") is None
