"""A small YAML writer for the configuration pdctl hands to Prometheus.

Block style for mappings and lists, every string double-quoted in JSON syntax (a valid
YAML scalar), keys in the order given. Enough for scrape configs, rule files and
Kubernetes objects, without making PyYAML a dependency of the SDK.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    return json.dumps(str(v))


def _key(k: str) -> str:
    return k if _PLAIN_KEY.match(k) else json.dumps(k)


def _lines(v: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(v, dict):
        if not v:
            return [pad + "{}"]
        out: list[str] = []
        for k, item in v.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{_key(str(k))}:")
                out.extend(_lines(item, indent + 2))
            else:
                out.append(f"{pad}{_key(str(k))}: {_inline(item)}")
        return out
    if isinstance(v, list):
        if not v:
            return [pad + "[]"]
        out = []
        for item in v:
            sub = _lines(item, indent + 2)
            out.append(pad + "- " + sub[0][indent + 2 :])
            out.extend(sub[1:])
        return out
    return [pad + _scalar(v)]


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return _scalar(v)


def dump(doc: Any) -> str:
    """One YAML document."""
    return "\n".join(_lines(doc, 0)) + "\n"


def dump_all(docs: list[Any]) -> str:
    """Several documents separated by ``---``."""
    return "---\n".join(dump(d) for d in docs)
