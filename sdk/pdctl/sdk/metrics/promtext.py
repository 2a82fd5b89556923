"""A small, fast parser for the Prometheus text exposition format (what vLLM serves).

Pure functions: text in, samples out. :func:`parse_text` skips malformed lines and
reports each one (the collector counts them); :func:`parse` raises on the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pdctl.sdk.errors import PdctlError


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


_LABEL_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_text(text: str) -> tuple[list[Sample], list[str]]:
    """Every well-formed sample, plus one message per malformed line (skipped).

    One pass with string operations; labels via one regex over the braces. About 10x
    less work than a general exposition-format parser on vLLM's ~60 KB payloads.
    """
    out: list[Sample] = []
    bad: list[str] = []
    append = out.append
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        try:
            if brace >= 0:
                close = line.rindex("}")
                name = line[:brace]
                seg = line[brace + 1 : close]
                pairs = _LABEL_PAIR_RE.findall(seg)
                if seg.strip() and not pairs:
                    raise ValueError("malformed labels")
                labels = tuple(sorted((k, _unescape(v) if "\\" in v else v) for k, v in pairs))
                rest = line[close + 1 :].split()
            else:
                parts = line.split()
                name, rest, labels = parts[0], parts[1:], ()
            if not rest or not name:
                raise ValueError("no value")
            value = float(rest[0])
        except (ValueError, IndexError) as e:
            if line.strip():
                bad.append(f"line {lineno}: {e}: {line[:120]!r}")
            continue
        append(Sample(name, labels, value))
    return out, bad


def parse(text: str) -> list[Sample]:
    """Every sample in a payload; raises :class:`MetricsParseError` on a malformed line."""
    samples, bad = parse_text(text)
    if bad:
        raise MetricsParseError(bad[0])
    return samples


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
