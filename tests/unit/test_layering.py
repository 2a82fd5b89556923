"""The SDK must stay importable without UI or engine libraries, and the import graph has
an order: no cycles between modules or between packages (lazy imports count)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_sdk_import_pulls_in_no_heavy_module():
    code = (
        "import sys, pdctl.sdk, pdctl.sdk.lint, pdctl.sdk.fleetplan, pdctl.sdk.specload\n"
        "from pdctl.sdk import Fleet, AsyncFleet, RouterClient, FleetMonitor, Snapshot\n"
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('textual', 'vllm', 'nixl', 'torch', 'transformers') or "
        "m.startswith(('pdctl.tui', 'pdctl.cli', 'pdctl.connector'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


REPO = Path(__file__).resolve().parents[2]

# Builds the import graph of this checkout's pdctl in a fresh interpreter: the path entries
# of any other pdctl (an editable install of another checkout) are dropped first, because
# grimp scans every portion of a namespace package. Prints each import between two pdctl
# modules as [importer, imported]; lazy imports inside functions and TYPE_CHECKING imports
# count.
_GRAPH = """
import json, sys
from pathlib import Path
ours = set(sys.argv[1:])
sys.path[:] = [p for p in sys.path if p in ours or not (Path(p or ".") / "pdctl").is_dir()]
sys.path[:0] = sorted(ours)
import grimp
g = grimp.build_graph("pdctl", cache_dir=None)
print(json.dumps(sorted(
    [m, i] for m in g.modules for i in g.find_modules_directly_imported_by(m)
    if i.startswith("pdctl.")
)))
"""


@pytest.fixture(scope="module")
def imports() -> list[tuple[str, str]]:
    pytest.importorskip("grimp")  # import-linter's graph library (dev extra)
    roots = [str(REPO / room) for room in ("sdk", "tui", "connector")]
    out = subprocess.run(
        [sys.executable, "-c", _GRAPH, *roots], capture_output=True, text=True, check=True
    )
    return [(a, b) for a, b in json.loads(out.stdout)]


def package_of(module: str) -> str:
    """The package a module counts for: ``pdctl.sdk.<child>`` inside the SDK, else its
    room (``pdctl.tui``, ``pdctl.cli``, ``pdctl.connector``); ``pdctl.sdk`` alone is the
    front door."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1] == "sdk" and len(parts) > 2 else parts[:2])


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    nodes = sorted({n for e in edges for n in e})
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return sorted(found)


def test_cycle_finder_finds_a_cycle_through_three_packages():
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({("a", "b"), ("b", "c")}) == []
    assert package_of("pdctl.sdk.fleet.launcher") == "pdctl.sdk.fleet"
    assert package_of("pdctl.tui.views.fleet") == "pdctl.tui"


def test_no_import_cycles_between_modules(imports):
    """No module imports (directly or through others) a module that imports it back."""
    found = cycles(set(imports))
    assert found == [], "\n".join(" <-> ".join(c) for c in found)


def test_no_import_cycles_between_packages(imports):
    """Nor does any SDK package (or room) reach back to itself through another: the
    package-level graph is acyclic, so the SDK's packages have an order."""
    edges = {(package_of(a), package_of(b)) for a, b in imports}
    found = cycles({(a, b) for a, b in edges if a != b})
    detail = [
        " <-> ".join(c)
        + ": "
        + "; ".join(
            f"{a} -> {b}"
            for a, b in imports
            if package_of(a) in c and package_of(b) in c and package_of(a) != package_of(b)
        )
        for c in found
    ]
    assert found == [], "\n".join(detail)


CONNECTOR_MAY_IMPORT = {
    # each one's reason is beside the connector contract in pyproject.toml
    "pdctl.sdk.metrics.flight",
    "pdctl.sdk.metrics.rendezvous",
    "pdctl.sdk.metrics.derive",
    "pdctl.sdk.metrics.promtext",
    "pdctl.sdk.preflight.kvsize",
    "pdctl.sdk.modelinfo",
    "pdctl.sdk.paths",
    "pdctl.sdk.errors",
}


def test_connector_reaches_only_the_plain_data_modules(imports):
    """What the connector imports of the SDK, directly or through other modules, is exactly
    the allow-list: a new one, or one no longer needed, fails here."""
    succ: dict[str, set[str]] = {}
    for a, b in imports:
        succ.setdefault(a, set()).add(b)
    todo = [m for m in succ if m.startswith("pdctl.connector")]
    seen = set(todo)
    while todo:
        for nxt in succ.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert {m for m in seen if m.startswith("pdctl.sdk")} == CONNECTOR_MAY_IMPORT
