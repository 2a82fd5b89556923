"""Kubernetes label selectors as text: parsed, checked and matched (sans-IO).

The grammar is the API server's (``k8s.io/apimachinery/pkg/labels/selector.go``):
comma-separated requirements, each ``key=value``, ``key==value``, ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, ``key`` (exists) or ``!key`` (does not exist).
A selector is checked here before it is sent, so a typo is an error naming the option
and the fix instead of the API server's 400; the same requirements decide locally which
role a pod that several watches see belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pdctl.sdk.errors import PdctlError

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
_SET = re.compile(r"^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_CMP = re.compile(r"^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)$")


class SelectorError(PdctlError):
    """A label selector that the API server would refuse."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        return not has or labels[self.key] not in self.values  # "!=", "notin"

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return "!" + self.key
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


def _split(text: str) -> list[str]:
    """Split at the commas that are not inside a value list."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _key(key: str, what: str, text: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(
            f"{what} {text!r}: {key!r} is not a label key (a DNS-1123 prefix and '/', "
            "then up to 63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit), e.g. llm-d.ai/role=decode"
        )
    return key


def _values(values: list[str], what: str, text: str) -> tuple[str, ...]:
    for v in values:
        if not _VALUE.match(v):
            raise SelectorError(
                f"{what} {text!r}: {v!r} is not a label value (up to 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit)"
            )
    return tuple(values)


@dataclass(frozen=True)
class Selector:
    """A parsed label selector; ``str()`` gives the canonical text sent to the server."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str, what: str = "label selector") -> Selector:
        """``what`` names the option in errors (``--k8s-prefill-selector``)."""
        if not text.strip():
            raise SelectorError(
                f"{what} is empty: give label requirements, e.g. 'llm-d.ai/role=prefill' "
                "(an empty selector would match every pod of the namespace)"
            )
        reqs: list[Requirement] = []
        for part in _split(text):
            if not part:
                raise SelectorError(f"{what} {text!r}: an empty requirement (a stray ',')")
            if m := _SET.match(part):
                vals = [v.strip() for v in m["values"].split(",")]
                if vals == [""]:
                    raise SelectorError(f"{what} {text!r}: {part!r} lists no values")
                reqs.append(
                    Requirement(_key(m["key"], what, text), m["op"], _values(vals, what, text))
                )
            elif m := _CMP.match(part):
                op = "=" if m["op"] == "==" else m["op"]
                val = _values([m["value"]], what, text)
                reqs.append(Requirement(_key(m["key"], what, text), op, val))
            elif part.startswith("!") and _KEY.match(part[1:].strip()):
                reqs.append(Requirement(part[1:].strip(), "!"))
            elif _KEY.match(part):
                reqs.append(Requirement(part, "exists"))
            else:
                raise SelectorError(
                    f"{what} {text!r}: cannot read {part!r}; write key=value, key!=value, "
                    "'key in (a,b)', 'key notin (a,b)', key or !key, joined by commas"
                )
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)
