"""The CPU knobs' NIXL agent settings: with the progress thread off the agent must
serialise calls itself (the crash in docs/reliability.md), on real NIXL classes."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

# only the distributions themselves may be missing (a skip, a failure under --strict-skips);
# their internals are plain imports below: a moved module is an error, never a skip
pytest.importorskip("nixl", reason="nixl is not installed (pip install 'pdctl[cpu]')")
pytest.importorskip("vllm", reason="vllm is not installed (pip install 'pdctl[cpu]')")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
    NixlBaseConnectorWorker,
)

from pdctl.connector import push


def vllm_config(**extra: Any) -> Any:
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(get_from_extra_config=lambda k, d: extra.get(k, d))
    )


def agent_config(**extra: Any) -> Any:
    module: Any = sys.modules[NixlBaseConnectorWorker.__module__]
    original = module.nixl_agent_config
    with push._cpu_knobs(vllm_config(**extra), KVConnectorRole.WORKER):
        conf = module.nixl_agent_config(num_threads=1)
    assert module.nixl_agent_config is original
    return conf


def test_no_progress_thread_means_a_strict_agent():
    conf = agent_config(pdctl_nixl_progress_thread=False)
    assert conf.enable_pthread is False
    assert conf.sync_mode.name == "NIXL_THREAD_SYNC_STRICT"


@pytest.mark.parametrize("mode", ["rw", "none", " RW "])
def test_sync_mode_can_be_chosen(mode):
    conf = agent_config(pdctl_nixl_progress_thread=False, pdctl_nixl_sync_mode=mode)
    assert conf.sync_mode.name == f"NIXL_THREAD_SYNC_{mode.strip().upper()}"


def test_unknown_sync_mode_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"pdctl_nixl_sync_mode = 'fast': use one of strict"):
        agent_config(pdctl_nixl_progress_thread=False, pdctl_nixl_sync_mode="fast")


def test_stock_settings_are_left_alone():
    conf = agent_config()
    assert conf.enable_pthread is True
    assert conf.sync_mode is None  # NIXL's own default


def test_a_strict_agent_without_progress_thread_starts_on_real_nixl():
    from nixl._api import nixl_agent

    agent = nixl_agent("pdctl-knobs-test", agent_config(pdctl_nixl_progress_thread=False))
    assert "UCX" in agent.backends


_KNOBS = """
from types import SimpleNamespace
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from pdctl.connector import push
conf = SimpleNamespace(kv_transfer_config=SimpleNamespace(get_from_extra_config=lambda k, d: d))
with push._cpu_knobs(conf, KVConnectorRole.WORKER):
    pass
"""
_PLUGINS = """
from vllm.plugins import load_general_plugins
load_general_plugins()
"""


@pytest.mark.parametrize("route", ["connector", "plugins"])
def test_a_vllm_process_gets_amx_permission_where_the_cpu_has_amx_tiles(route):
    """In a fresh process, the connector's worker setup, and vLLM running its general
    plugins (which every engine core and worker does), each leave the AMX tile state
    permitted (the kernel's own answer) exactly when the CPU has AMX tiles; without it
    vLLM's AMX attention kernel dies of SIGILL."""
    import subprocess

    import torch

    script = (
        "from pdctl.connector.amx import xtile_permitted\n"
        "before = xtile_permitted()\n"
        + (_KNOBS if route == "connector" else _PLUGINS)
        + "print(before, xtile_permitted())\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after = r.stdout.split()[-2:]
    amx = torch.cpu._is_amx_tile_supported()
    if amx:
        assert before == "False", "granted before the step under test: this proves nothing"
    assert after == str(amx), (before, after, amx)
