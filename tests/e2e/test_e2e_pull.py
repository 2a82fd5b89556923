"""pdctl's router on a real vLLM-CPU pull fleet (NixlConnector): exact outputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.sdk.fleet import Fleet
from tests.e2e.conftest import demo_spec, running_fleet
from tests.e2e.test_e2e_router import check_exact, router_url

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pull_fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, "e2e-pull")
    spec.fleet.mode = "pull"
    yield from running_fleet(spec)


def test_pull_outputs_are_exact(pull_fleet: Fleet):
    check_exact(pull_fleet, router_url(pull_fleet))
