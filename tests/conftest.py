"""Shared test helpers."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.ports import free_ports as free_ports

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
