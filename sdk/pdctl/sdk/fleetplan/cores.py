"""CPU cores: a group's cores split over its instances, and vLLM's per-rank binding."""

from __future__ import annotations

from collections.abc import Iterable


def split_cores(cores: list[int] | None, count: int) -> list[tuple[int, ...]]:
    """A group's cores split as evenly as they go over its ``count`` instances: runs of
    consecutive cores whose sizes differ by at most one; with fewer cores than
    instances, neighbouring instances share a core (lint warns, PD012)."""
    if not cores:
        return [()] * count
    n = len(cores)
    out = []
    for i in range(count):
        start = i * n // count
        end = max(start + 1, (i + 1) * n // count)
        out.append(tuple(cores[start:end]))
    return out


def cpu_binding(cores: tuple[int, ...], ranks: int) -> tuple[str, int]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` workers sharing ``cores`` evenly:
    one core list per rank, ranks separated by ``|``; plus threads per rank."""
    per = max(1, len(cores) // ranks)
    parts = []
    for r in range(ranks):
        chunk = cores[r * per : (r + 1) * per] or cores[-1:]
        parts.append(compress_ranges(chunk))
    return "|".join(parts), per


def compress_ranges(values: Iterable[int]) -> str:
    """(0, 1, 2, 5) → '0-2,5'."""
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)
