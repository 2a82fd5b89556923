"""The probe's command-line options, shared by ``python -m pdctl.connector.probe`` and
``pdctl probe`` (which runs the former in a subprocess). Imports nothing heavy."""

from __future__ import annotations

import argparse
from typing import Any

_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--model", {"metavar": "PATH", "help": "model directory or config.json: KV geometry"}),
    ("--bytes-per-token", {"type": int, "metavar": "N", "help": "KV bytes per token (all ranks)"}),
    ("--kv-dtype", {"default": "auto", "help": "KV dtype with --model (default: the model's)"}),
    ("--regions", {"type": int, "help": "KV tensors per rank (default: 2 x layers, or 1)"}),
    ("--prompt-len", {"type": int, "default": 8192, "help": "tokens per request (8192)"}),
    ("--block-size", {"type": int, "default": 16, "help": "tokens per KV block (16)"}),
    ("--tp", {"type": int, "default": 1, "help": "initiator TP ranks (1)"}),
    ("--count", {"type": int, "default": 20, "help": "measured requests (20)"}),
    ("--warmup", {"type": int, "default": 3, "help": "requests before measuring (3)"}),
    ("--rate", {"type": float, "help": "requests per second (default: back to back)"}),
    ("--inflight", {"type": int, "default": 1, "help": "requests in flight at most (1)"}),
    ("--no-merge", {"action": "store_true", "help": "one descriptor per block"}),
    (
        "--order",
        {
            "choices": ("concurrent", "registration-first", "finished-first"),
            "default": "concurrent",
            "help": "what reaches the initiator first: the registration or finished blocks",
        },
    ),
    (
        "--verify",
        {
            "choices": ("all", "warmup", "none"),
            "default": "warmup",
            "help": "requests checksummed on both ends (checksums cost CPU; 'warmup' keeps "
            "them out of the measured window)",
        },
    ),
    ("--device", {"choices": ("cpu", "cuda", "auto"), "default": "cpu", "help": "pool memory"}),
    ("--max-memory-gib", {"type": float, "default": 4.0, "help": "pool memory cap per end (4)"}),
    ("--timeout", {"type": float, "default": 30.0, "help": "seconds for any one step (30)"}),
    ("--poll-us", {"type": float, "default": 200.0, "help": "progress poll interval, us (200)"}),
    ("--ucx-tls", {"help": "UCX_TLS for both ends (default: UCX's choice)"}),
    ("--ucx-net-devices", {"help": "UCX_NET_DEVICES for both ends"}),
    ("--ucx-error-mode", {"choices": ("peer", "none"), "help": "NIXL UCX error handling"}),
    (
        "--sync-mode",
        {
            "choices": ("none", "strict", "rw"),
            "default": "none",
            "help": "NIXL agent thread-sync mode of both ends (none: NIXL's default without "
            "a listen thread; strict: what pdctl's connector uses without a progress thread)",
        },
    ),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    for flag, kwargs in _OPTIONS:
        p.add_argument(flag, **kwargs)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--listen", metavar="[HOST:]PORT", help="run the target end only")
    mode.add_argument("--connect", metavar="HOST:PORT", help="run the initiator end only")


def to_argv(args: argparse.Namespace) -> list[str]:
    """The options of ``args`` that differ from their defaults, as command-line words."""
    out: list[str] = []
    for flag, kwargs in [*_OPTIONS, ("--listen", {}), ("--connect", {})]:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None or value == kwargs.get("default") or value is False:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out
