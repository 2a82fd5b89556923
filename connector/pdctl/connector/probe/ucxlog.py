"""Which UCX transport carried the WRITEs, from ``UCX_PROTO_INFO=y`` output (pure).

UCX prints one table per endpoint configuration and operation; the WRITE path is the
table titled ``remote memory write by ucp_put* ...`` and its last column names the lane,
e.g. ``cma/memory`` (same host, zero-copy), ``tcp/lo``, ``rc_mlx5/mlx5_0:1`` or
``cuda_ipc/cuda``. Tables of an agent's endpoint to itself (``self``) are skipped when
others exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_PREFIX = re.compile(r"^\[[^\]]*\]\s*\[[^\]]*\]\s*")
_WRITE_TITLE = "remote memory write"


def _cells(line: str) -> list[str] | None:
    body = _PREFIX.sub("", line).strip()
    if not (body.startswith("|") and body.endswith("|")):
        return None
    return [c.strip() for c in body.strip("|").split("|")]


def write_transports(lines: Iterable[str]) -> list[str]:
    """Distinct lanes of every WRITE table, peer endpoints first (sorted)."""
    peer: set[str] = set()
    self_: set[str] = set()
    header = ""
    in_table = False
    for line in lines:
        cells = _cells(line)
        if cells is None:
            continue
        if len(cells) == 1:
            if _WRITE_TITLE in cells[0]:
                in_table = True
            elif cells[0]:
                in_table = False
                header = cells[0]
            continue
        if in_table and len(cells) >= 3 and cells[0] not in ("Range", ""):
            lanes = {c.strip() for c in cells[-1].split(",") if "/" in c}
            (self_ if " self " in f" {header} " else peer).update(lanes)
    return sorted(peer or self_)


def transports_in(directory: Path) -> list[str]:
    """:func:`write_transports` over every ``ucx*.log`` file in ``directory``."""
    found: set[str] = set()
    for f in sorted(directory.glob("ucx*.log")):
        try:
            found.update(write_transports(f.read_text(errors="replace").splitlines()))
        except OSError:
            continue
    return sorted(found)
