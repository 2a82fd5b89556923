"""pdctl finds vLLM's push and pull connector classes in either layout: nixl/connector.py
(vLLM 0.32, 0.33) or nixl/push_connector.py / pull_connector.py (vLLM main)."""

from __future__ import annotations

import sys
import types

import pytest

from pdctl.connector.compat import PULL_CONNECTOR, PUSH_CONNECTOR, vllm_class

MAIN, RELEASED = PUSH_CONNECTOR


def _module(monkeypatch, path: str, **names: object) -> None:
    mod = types.ModuleType(path)
    for k, v in names.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, path, mod)


def _gone(monkeypatch, path: str) -> None:
    monkeypatch.setitem(sys.modules, path, None)  # import raises ModuleNotFoundError


def test_main_layout_is_preferred(monkeypatch):
    new, old = type("NixlPushConnector", (), {}), type("NixlPushConnector", (), {})
    _module(monkeypatch, MAIN, NixlPushConnector=new)
    _module(monkeypatch, RELEASED, NixlPushConnector=old)
    assert vllm_class("NixlPushConnector", PUSH_CONNECTOR) is new


def test_released_layout_when_main_s_module_is_absent(monkeypatch):
    old = type("NixlPushConnector", (), {})
    _gone(monkeypatch, MAIN)
    _module(monkeypatch, RELEASED, NixlPushConnector=old)
    assert vllm_class("NixlPushConnector", PUSH_CONNECTOR) is old


def test_released_layout_when_main_s_module_lacks_the_class(monkeypatch):
    old = type("NixlPullConnector", (), {})
    _module(monkeypatch, PULL_CONNECTOR[0])
    _module(monkeypatch, PULL_CONNECTOR[1], NixlPullConnector=old)
    assert vllm_class("NixlPullConnector", PULL_CONNECTOR) is old


def test_neither_layout_names_both_paths(monkeypatch):
    _gone(monkeypatch, MAIN)
    _module(monkeypatch, RELEASED, NixlPushConnector="not a class")
    with pytest.raises(ImportError) as e:
        vllm_class("NixlPushConnector", PUSH_CONNECTOR)
    msg = str(e.value)
    assert f"{MAIN} (no such module)" in msg
    assert f"{RELEASED} (no NixlPushConnector in it)" in msg


def test_a_broken_dependency_is_not_mistaken_for_a_layout(monkeypatch, tmp_path):
    (tmp_path / "pdctl_test_layout.py").write_text("import pdctl_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="pdctl_test_missing_dependency"):
        vllm_class("X", ("pdctl_test_layout", RELEASED))


def test_the_installed_vllm_resolves_both():
    assert vllm_class("NixlPushConnector", PUSH_CONNECTOR).__name__ == "NixlPushConnector"
    assert vllm_class("NixlPullConnector", PULL_CONNECTOR).__name__ == "NixlPullConnector"
