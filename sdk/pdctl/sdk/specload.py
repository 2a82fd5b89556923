"""Reading a fleet spec: TOML file, then ``PDCTL_`` environment, then ``--set`` overrides.

Each layer is a nested dict; later layers win key by key. Numeric path segments index
into arrays of tables in every layer (``--set prefill.0.tp=2``,
``PDCTL_PREFILL__0__TP=2``). The merged dict is validated once, and every problem is
reported with the field path, what was wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from pdctl.sdk.errors import SpecError, SpecProblem
from pdctl.sdk.spec import FleetSpec

DEFAULT_SPEC_PATH = Path("pdctl.toml")
ENV_PREFIX = "PDCTL_"


@dataclass(frozen=True)
class LoadedSpec:
    spec: FleetSpec
    source: str
    """Where the spec came from: a file path, or a short description."""
    path: Path | None
    """The file it was read from, when there was one (relative paths resolve next to it)."""

    @property
    def router_url(self) -> str:
        """The URL of the fleet's pdctl router (a :class:`SpecError` when it has none)."""
        from pdctl.sdk.urls import router_url

        return router_url(self.spec, self.source)


SpecLike = FleetSpec | LoadedSpec
"""A spec as the SDK's functions take it: validated, or as a loader gave it."""


def spec_of(spec: SpecLike) -> FleetSpec:
    """The validated spec of what :func:`load_spec` (or a caller) gave."""
    return spec.spec if isinstance(spec, LoadedSpec) else spec


def load_spec(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    text: str | None = None,
) -> LoadedSpec:
    """Load and validate a spec.

    ``path`` None means ``./pdctl.toml``; ``text`` gives the TOML directly (``path`` is
    then only a label). ``environ`` defaults to ``os.environ``.
    """
    explicit = path is not None
    file_path = Path(path) if path is not None else DEFAULT_SPEC_PATH
    source = str(file_path)
    env = dict(os.environ if environ is None else environ)

    if text is None:
        try:
            text = file_path.expanduser().read_text(encoding="utf-8")
        except FileNotFoundError:
            hint = (
                "check the path given to -f"
                if explicit
                else "pass -f FILE, or copy one from examples/ to ./pdctl.toml"
            )
            raise SpecError(source, [SpecProblem("", "file not found", hint)]) from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(source, [SpecProblem("", f"cannot read file: {e}", "")]) from None
        real_path: Path | None = file_path
    else:
        real_path = file_path if explicit else None

    data = parse_toml(text, source)
    data = merge(data, env_layer(env, source))
    for item in overrides:
        key, value = parse_override(item, source)
        set_path(data, key, value, source)
    return LoadedSpec(spec=validate(data, source), source=source, path=real_path)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(
            source, [SpecProblem("", f"not valid TOML: {e}", "fix the syntax at that line")]
        ) from None


def env_layer(environ: Mapping[str, str], source: str) -> dict[str, Any]:
    """The ``PDCTL_*`` variables as a nested dict (pydantic-settings does the parsing)."""
    relevant = {k: v for k, v in environ.items() if k.upper().startswith(ENV_PREFIX)}
    if not relevant:
        return {}
    try:
        raw = _MappingEnvSource(relevant)()
    except SettingsError as e:
        raise SpecError(
            source,
            [SpecProblem("environment", str(e), "PDCTL_ list/table values must be JSON")],
        ) from None
    # PDCTL_X__Y names a spec field; PDCTL_X without "__" is a whole spec section or one of
    # pdctl's own settings (PDCTL_STATE_DIR, PDCTL_VENV, ...), which the spec does not own.
    unknown = sorted(
        k
        for k in relevant
        if "__" in k
        and k[len(ENV_PREFIX) :].split("__", 1)[0].lower() not in FleetSpec.model_fields
    )
    if unknown:
        raise SpecError(
            source,
            [
                SpecProblem(
                    f"environment {k}",
                    "not a spec field",
                    f"use PDCTL_<SECTION>__<KEY>; sections: {', '.join(FleetSpec.model_fields)}",
                )
                for k in unknown
            ],
        )
    return dict(raw)


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment parsing over a given mapping instead of os.environ."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._given = dict(environ)
        super().__init__(
            FleetSpec, env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._given, False, False, None)


_OVERRIDE_RE = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+)\s*=(.*)$", re.S)


def parse_override(item: str, source: str) -> tuple[list[str | int], Any]:
    """``router.port=9000`` → (['router', 'port'], 9000). Values are TOML literals,
    falling back to a plain string (``mode=pull`` needs no quotes)."""
    m = _OVERRIDE_RE.match(item)
    if not m:
        raise SpecError(
            source,
            [SpecProblem(f"--set {item}", "expected KEY=VALUE", "e.g. --set router.port=9000")],
        )
    key, raw = m.group(1), m.group(2).strip()
    return split_key(key), parse_value(raw)


def split_key(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for part in key.replace("[", ".").replace("]", "").split("."):
        if part == "":
            continue
        parts.append(int(part) if part.isdecimal() else part)
    return parts


def parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def set_path(data: dict[str, Any], key: Sequence[str | int], value: Any, source: str) -> None:
    node: Any = data
    dotted = ".".join(str(k) for k in key)
    for depth, part in enumerate(key):
        last = depth == len(key) - 1
        if isinstance(node, list):
            if not isinstance(part, int) or part > len(node):
                raise SpecError(
                    source,
                    [
                        SpecProblem(
                            f"--set {dotted}",
                            f"index {part!r} is out of range (the array has {len(node)} entries)",
                            f"use 0..{len(node)} ({len(node)} appends a new entry)",
                        )
                    ],
                )
            if part == len(node):
                node.append({})
            if last:
                node[part] = value
            else:
                if not isinstance(node[part], dict | list):
                    node[part] = {}
                node = node[part]
        elif isinstance(node, dict):
            name = str(part)
            if last:
                node[name] = value
            else:
                if not isinstance(node.get(name), dict | list):
                    node[name] = [] if isinstance(key[depth + 1], int) else {}
                node = node[name]
        else:
            raise SpecError(
                source,
                [SpecProblem(f"--set {dotted}", "cannot set a key inside a plain value", "")],
            )


def merge(base: Any, patch: Any) -> Any:
    """Deep merge; dict patches with numeric keys index into lists."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else _listify(v)
        return out
    if isinstance(base, list) and isinstance(patch, dict) and all(str(k).isdigit() for k in patch):
        out_list = list(base)
        for k in sorted(patch, key=int):
            i = int(k)
            while len(out_list) <= i:
                out_list.append({})
            out_list[i] = merge(out_list[i], patch[k])
        return out_list
    return _listify(patch)


def _listify(v: Any) -> Any:
    """An env dict such as {'0': {...}} standing for an array becomes a list."""
    if isinstance(v, dict):
        if v and all(str(k).isdigit() for k in v):
            return merge([], v)
        return {k: _listify(x) for k, x in v.items()}
    return v


def validate(data: Mapping[str, Any], source: str) -> FleetSpec:
    try:
        return FleetSpec(**data)
    except ValidationError as e:
        raise SpecError(source, [_problem(err) for err in e.errors()]) from None


def format_loc(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _problem(err: Mapping[str, Any]) -> SpecProblem:
    loc = tuple(err.get("loc", ()))
    kind = str(err.get("type", ""))
    msg = str(err.get("msg", "invalid"))
    field = format_loc(loc)
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        name = str(loc[-1]) if loc else ""
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(name, known, n=1)
        fix = (
            f"did you mean {close[0]!r}?"
            if close
            else (f"known keys here: {', '.join(known)}" if known else "remove it")
        )
        return SpecProblem(field, "unknown key", fix)
    if kind == "missing":
        return SpecProblem(field, "required but not given", f"add {loc[-1]} = ... to the spec")
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        # model-level validators put their own field path in the message
        if (
            ": " in msg
            and msg.split(": ", 1)[0].replace("[", "").replace("]", "").replace(".", "").isalnum()
        ):
            where, _, rest = msg.partition(": ")
            return SpecProblem(where if not field else f"{field}.{where}", rest)
        return SpecProblem(field, msg)
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    fix = ""
    model = _model_at(loc[:-1])
    if model is not None and loc and isinstance(loc[-1], str) and loc[-1] in model.model_fields:
        desc = model.model_fields[loc[-1]].description
        fix = desc or ""
    return SpecProblem(field, f"{msg}{shown}", fix)


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model class that sits at ``loc`` inside FleetSpec, if any."""
    model: type[BaseModel] | None = FleetSpec
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _inner_model(field.annotation)
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
