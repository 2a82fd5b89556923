"""RFC 6902 JSON Patch (``add``, ``remove``, ``replace``, ``test``) over plain JSON data.

Pure and dependency free: the Kubernetes backend applies a spec's ``pod_patch`` to the pod
templates it generates, and lint applies the same patch to see what the pods will carry.
Paths are RFC 6901 JSON Pointers (``~1`` is ``/``, ``~0`` is ``~``; ``-`` appends to an
array). A patch is applied to a deep copy; the input is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

PatchOpName = Literal["add", "remove", "replace", "test"]


class JsonPatchError(ValueError):
    """One operation could not be applied; the message names it and its path."""


def split_pointer(path: str) -> list[str]:
    """``/spec/containers/0`` → ``["spec", "containers", "0"]`` (RFC 6901)."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"path {path!r} must start with '/' (a JSON Pointer)")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(node: list[Any], token: str, path: str, *, insert: bool) -> int:
    if insert and token == "-":
        return len(node)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise JsonPatchError(f"{path}: {token!r} is not an array index")
    i = int(token)
    if i > len(node) or (i == len(node) and not insert):
        raise JsonPatchError(f"{path}: index {i} is past the end (length {len(node)})")
    return i


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise JsonPatchError(f"{path}: {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, path, insert=False)]
        else:
            raise JsonPatchError(f"{path}: {token!r} is inside a value that is not an object")
    return node


def _apply_one(doc: Any, op: PatchOpName, path: str, value: Any) -> Any:
    tokens = split_pointer(path)
    if not tokens:
        if op == "test":
            if doc != value:
                raise JsonPatchError(f"test {path!r}: the document differs")
            return doc
        if op == "remove":
            raise JsonPatchError("remove '': the whole document cannot be removed")
        return copy.deepcopy(value)
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, dict):
        if op != "add" and last not in parent:
            raise JsonPatchError(f"{op} {path}: {last!r} does not exist")
        if op == "test":
            if parent[last] != value:
                raise JsonPatchError(f"test {path}: {parent[last]!r} is not {value!r}")
        elif op == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        i = _index(parent, last, path, insert=op == "add")
        if op == "add":
            parent.insert(i, copy.deepcopy(value))
        elif op == "remove":
            del parent[i]
        elif op == "replace":
            parent[i] = copy.deepcopy(value)
        elif parent[i] != value:
            raise JsonPatchError(f"test {path}: {parent[i]!r} is not {value!r}")
    else:
        raise JsonPatchError(f"{op} {path}: the parent is not an object or array")
    return doc


def apply_patch(doc: Any, ops: Sequence[tuple[PatchOpName, str, Any]]) -> Any:
    """``doc`` with every ``(op, path, value)`` applied in order (``value`` unused by
    ``remove``). Raises :class:`JsonPatchError` naming the first operation that fails
    (its position in the patch, 0-based)."""
    out = copy.deepcopy(doc)
    for n, (op, path, value) in enumerate(ops):
        try:
            out = _apply_one(out, op, path, value)
        except JsonPatchError as e:
            raise JsonPatchError(f"operation [{n}]: {e}") from None
    return out
