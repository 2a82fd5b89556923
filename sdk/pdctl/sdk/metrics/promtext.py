"""A small, fast parser for the Prometheus text exposition format (what vLLM serves).

Pure functions: text in, samples out. :func:`parse_text` skips malformed lines and
reports each one (the collector counts them); :func:`parse` raises on the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from pdctl.sdk.errors import PdctlError


class MetricsParseError(PdctlError, ValueError):
    """A /metrics payload is not valid Prometheus text."""


class Sample(NamedTuple):
    name: str
    raw_labels: str
    """The text between the braces, parsed only when asked (most reads need none)."""
    value: float

    def label(self, key: str, default: str = "") -> str:
        seg = self.raw_labels
        pat = key + '="'
        i = seg.find(pat)
        while i > 0 and seg[i - 1] not in ", ":
            i = seg.find(pat, i + 1)
        if i < 0:
            return default
        start = i + len(pat)
        end = seg.find('"', start)
        while end > 0 and seg[end - 1] == "\\":
            end = seg.find('"', end + 1)
        v = seg[start:end]
        return _unescape(v) if "\\" in v else v

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (k, _unescape(v) if "\\" in v else v)
            for k, v in _LABEL_PAIR_RE.findall(self.raw_labels)
        )


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


_LABEL_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_text(
    text: str, prefixes: tuple[str, ...] | None = None
) -> tuple[list[Sample], list[str]]:
    """Every well-formed sample, plus a message for malformed lines (skipped).

    ``prefixes`` keeps only series whose name starts with one of them and drops the
    ``_created`` timestamps (what the monitor needs): one C-level regex pass picks those
    lines out. None keeps everything (a line-by-line pass). Labels stay raw until read.
    """
    if prefixes is not None:
        return _parse_selected(text, prefixes)
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
                seg = line[brace + 1 : close]
                if '="' not in seg and seg.strip():
                    raise ValueError("malformed labels")
                append(Sample(line[:brace], seg, float(line[close + 1 :].split()[0])))
            else:
                parts = line.split()
                append(Sample(parts[0], "", float(parts[1])))
        except (ValueError, IndexError) as e:
            if line.strip():
                bad.append(f"line {lineno}: {e}: {line[:120]!r}")
    return out, bad


def _parse_selected(text: str, prefixes: tuple[str, ...]) -> tuple[list[Sample], list[str]]:
    out: list[Sample] = []
    bad: list[str] = []
    append = out.append
    for line in text.split("\n"):
        if not line.startswith(prefixes):
            continue
        brace = line.find("{")
        try:
            if brace >= 0:
                name = line[:brace]
                if name.endswith("_created"):
                    continue
                close = line.rindex("}")
                append(Sample(name, line[brace + 1 : close], float(line[close + 1 :].split()[0])))
            else:
                parts = line.split()
                if parts[0].endswith("_created"):
                    continue
                append(Sample(parts[0], "", float(parts[1])))
        except (ValueError, IndexError) as e:
            bad.append(f"{e}: {line[:120]!r}")
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
