"""pdctl's general plugin (``pdctl_amx``, ``pdctl.connector.amx``) is one vLLM finds and
runs in the processes that run its attention, and it leaves the AMX tile permission
granted where the CPU has the tiles: asked of each vLLM's own plugin loader."""

from __future__ import annotations

from pdctl.connector.amx import PLUGIN


def test_vllm_finds_and_runs_the_amx_plugin(vllm):
    got = vllm["answers"]["plugins"]
    v = vllm["version"]
    assert got["group"] == "vllm.general_plugins", got
    assert PLUGIN in got["found"], f"vLLM {v} does not find {PLUGIN}: {got['found']}"
    assert got["run_by"] == {"engine_core": True, "worker": True}, (
        f"vLLM {v} no longer runs its general plugins where pdctl relies on it: {got}"
    )
    if got["amx_tiles"]:
        # nothing had asked before vLLM ran the plugins (else this would prove nothing)
        assert got["permitted_before"] is False, got
        assert got["permitted_after"] is True, f"vLLM {v} ran the plugins, no permission: {got}"
    else:
        assert got["permitted_after"] in (False, None), got
