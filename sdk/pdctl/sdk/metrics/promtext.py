"""A strict, small parser for the Prometheus text exposition format (what vLLM serves).

Pure functions: text in, samples out. Malformed lines raise :class:`MetricsParseError`
naming the line, so a broken payload is reported, never half-read silently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pdctl.sdk.errors import PdctlError

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


class MetricsParseError(PdctlError, ValueError):
    """A /metrics payload is not valid Prometheus text."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _labels(raw: str, lineno: int) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    pos = 0
    raw = raw.strip()
    while pos < len(raw):
        m = _LABEL_RE.match(raw, pos)
        if not m:
            raise MetricsParseError(f"line {lineno}: malformed labels {{{raw}}}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


def _value(v: str, lineno: int) -> float:
    try:
        return float(v)
    except ValueError:
        low = v.lower()
        if low in ("+inf", "inf"):
            return math.inf
        if low == "-inf":
            return -math.inf
        if low == "nan":
            return math.nan
        raise MetricsParseError(f"line {lineno}: value {v!r} is not a number") from None


def parse(text: str) -> list[Sample]:
    """Every sample in a payload; comments (HELP/TYPE) are skipped."""
    out: list[Sample] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _SAMPLE_RE.match(s)
        if not m:
            raise MetricsParseError(f"line {lineno}: not a sample: {s[:120]!r}")
        labels = _labels(m.group(2), lineno) if m.group(2) else ()
        out.append(Sample(m.group(1), labels, _value(m.group(3), lineno)))
    return out


def total(
    samples: Iterable[Sample], name: str, match: Mapping[str, str] | None = None
) -> float | None:
    """Sum of the samples named ``name`` whose labels include ``match``; None if absent."""
    found = False
    acc = 0.0
    for s in samples:
        if s.name != name:
            continue
        if match and any(s.label(k) != v for k, v in match.items()):
            continue
        found = True
        acc += s.value
    return acc if found else None
