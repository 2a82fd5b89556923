"""Shared test helpers."""

from __future__ import annotations

import copy
import json
import os
import socket
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.freeports import free_ports as free_ports
from tests import goldens

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "data"
"""Recorded real payloads (copied from the team's shared fixtures so a clone is enough)."""

BASE: dict[str, Any] = {
    "model": {"path": "org/some-model", "served_name": "m"},
    "fleet": {"mode": "push", "platform": "gpu", "block_size": 128},
    "prefill": [{"host": "127.0.0.1", "devices": [0]}],
    "decode": [{"host": "127.0.0.1", "devices": [1]}],
    "router": {"port": 18000},
}


def spec_dict(**sections: Any) -> dict[str, Any]:
    """BASE with top-level sections replaced or (for dicts) updated."""
    d = copy.deepcopy(BASE)
    for k, v in sections.items():
        if v is None:
            d.pop(k, None)
        elif isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return d


@pytest.fixture
def model_dir(tmp_path: Path):
    """A local model directory with a config.json (GQA Llama unless overwritten)."""

    def make(config: dict[str, Any] | None = None, name: str = "model") -> Path:
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        cfg = config or {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    return make


def port_free(port: int) -> bool:
    """Can a server bind it again (as servers do, with SO_REUSEADDR)?"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --- options and hooks of the whole suite -------------------------------------------------

SKIPS_ALLOWED_IN_CI = {
    "gpu": "needs an NVIDIA GPU, which CI machines do not have (`./run test` also deselects "
    "them with -m 'not gpu')",
}
"""Markers whose tests may skip under ``--strict-skips``, each with its reason. Any other
skip (a missing extra, tool or binary) is a failure there: CI has everything installed, so
a skip would hide a test that silently stopped running."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pdctl")
    group.addoption(
        goldens.OPTION,
        action="store_true",
        help="rewrite the expected files (SVG snapshots, manifest goldens) the selected "
        "tests compare with, and list them at the end",
    )
    group.addoption(
        "--strict-skips",
        action="store_true",
        help="a skipped test fails unless it carries an allowed marker (gpu); on by "
        "default when CI or PDCTL_STRICT_SKIPS=1 is set (./run test sets it)",
    )


STRICT_SKIPS_VARIABLES = ("CI", "PDCTL_STRICT_SKIPS")
"""The environment that turns ``--strict-skips`` on (read once, when pytest starts)."""


def _strict_from_environment() -> bool:
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
    return ci or os.environ.get("PDCTL_STRICT_SKIPS") == "1"


def strict_skips(config: pytest.Config) -> bool:
    return config.stash[_STRICT]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STRICT] = bool(config.getoption("--strict-skips")) or _strict_from_environment()
    config.stash[_GOLDENS] = goldens.Goldens(
        update=bool(config.getoption(goldens.OPTION)), repo=REPO
    )


_GOLDENS = pytest.StashKey[goldens.Goldens]()
_STRICT = pytest.StashKey[bool]()


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> goldens.Goldens:
    """Compare output with an expected file (``--update-goldens`` rewrites it)."""
    return request.config.stash[_GOLDENS]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    g = config.stash.get(_GOLDENS, None)
    if g is None or not g.update:
        return
    terminalreporter.section(f"{goldens.OPTION}: {len(g.rewritten)} expected file(s) rewritten")
    for p in g.rewritten:
        terminalreporter.write_line(str(p.relative_to(REPO) if p.is_relative_to(REPO) else p))


def _skip_allowed(node: pytest.Item | pytest.Collector) -> bool:
    return any(node.get_closest_marker(m) is not None for m in SKIPS_ALLOWED_IN_CI)


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return f"{longrepr[2]} ({longrepr[0]}:{longrepr[1]})"
    return str(longrepr)


def _as_failure(reason: str) -> str:
    allowed = ", ".join(SKIPS_ALLOWED_IN_CI)
    return (
        f"skipped under --strict-skips (CI): {reason}\n"
        f"only tests marked {allowed} may skip there; install what the test needs "
        "(./run setup, scripts/install-prometheus.sh, the system's tmux)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    if (
        rep.skipped
        and not hasattr(rep, "wasxfail")
        and strict_skips(item.config)
        and not _skip_allowed(item)
    ):
        rep.outcome = "failed"
        rep.longrepr = _as_failure(_skip_reason(rep.longrepr))
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    rep = yield
    if rep.outcome == "skipped" and strict_skips(collector.config) and not _skip_allowed(collector):
        rep.outcome = "failed"
        rep.longrepr = _as_failure(_skip_reason(rep.longrepr))
    return rep
