"""Instance groups: ``[[prefill]]``, ``[[decode]]`` and ``[[render]]``, their restart
settings and their names."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from pdctl.sdk.spec.base import (
    Mode,
    Port,
    RestartMode,
    _group_name_shape,
    _non_negative_unique,
    _Strict,
)

ENGINE_ID_FIELDS = ("name", "role", "group", "index", "host")


class _Restartable(_Strict):
    """What the supervisor does when an instance of the group fails after it was ready:
    it exits (with any code, 0 included: the supervisor did not ask it to), or its API
    server stays up with a dead engine. Restarts wait ``restart_backoff_s``, doubling
    with each restart still inside the window (at most 60 s); more than
    ``max_restarts`` within ``restart_window_s`` is a crash loop and the supervisor
    gives up."""

    restart: RestartMode = Field(
        default="on-failure",
        description="'on-failure': restart a failed instance (with backoff); 'never': "
        "leave it exited.",
    )
    restart_backoff_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Wait before the first restart; doubles with each restart in the "
        "window, capped at 60 s.",
    )
    max_restarts: int = Field(
        default=5,
        ge=1,
        description="Restarts allowed within restart_window_s before the supervisor gives "
        "up (a crash loop); use restart = 'never' for none.",
    )
    restart_window_s: float = Field(
        default=300.0, gt=0, description="The sliding window max_restarts counts in."
    )


class InstanceGroup(_Restartable):
    """``count`` identical prefill or decode instances on one host."""

    name: str | None = Field(
        default=None, description="Group name; instances are '<name>-<index>'."
    )
    host: str = Field(
        default="127.0.0.1", description="Address the HTTP server binds and is reached at."
    )
    count: int = Field(default=1, ge=1, le=1024)
    tp: int = Field(default=1, ge=1, description="Tensor-parallel size.")
    pp: int = Field(default=1, ge=1, description="Pipeline-parallel size.")
    dp: int = Field(default=1, ge=1, description="Data-parallel size inside one instance.")
    devices: list[int] | None = Field(
        default=None, description="GPU indices for the whole group (tp*pp*dp per instance)."
    )
    cpu_cores: list[int] | None = Field(
        default=None, description="CPU cores for the whole group (split evenly per instance)."
    )
    http_port: Port | None = Field(default=None, description="First instance's HTTP port.")
    side_channel_port: Port | None = Field(
        default=None, description="First instance's NIXL side-channel port (spaced by dp)."
    )
    side_channel_host: str | None = Field(
        default=None, description="VLLM_NIXL_SIDE_CHANNEL_HOST; defaults to host."
    )
    engine_id: str = Field(
        default="{name}",
        description="Pattern with {name} {role} {group} {index} {host}.",
    )
    block_size: int | None = Field(default=None, ge=1, description="Overrides fleet.block_size.")
    mode: Mode | None = Field(default=None, description="Overrides fleet.mode (lint flags mixing).")
    max_num_seqs: int | None = Field(default=None, ge=1)
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _name_shape = field_validator("name")(classmethod(lambda cls, v: _group_name_shape(v)))
    _indices = field_validator("devices", "cpu_cores")(
        classmethod(lambda cls, v: _non_negative_unique(v))
    )

    @field_validator("engine_id")
    @classmethod
    def _engine_id_pattern(cls, v: str) -> str:
        for field in re.findall(r"{([^{}]*)}", v):
            if field not in ENGINE_ID_FIELDS:
                known = ", ".join("{" + f + "}" for f in ENGINE_ID_FIELDS)
                raise ValueError(f"unknown placeholder {{{field}}}; use {known}")
        return v

    @property
    def ranks(self) -> int:
        """Worker ranks (devices) one instance of this group needs."""
        return self.tp * self.pp * self.dp


class RenderGroup(_Restartable):
    """``count`` GPU-less render servers (tokenize before, detokenize after the engines):
    vLLM's ``launch render``; the router's ``tokens`` path uses them."""

    name: str | None = Field(default=None, description="Group name (default 'render').")
    host: str = Field(
        default="127.0.0.1", description="Address the server binds and is reached at."
    )
    count: int = Field(default=1, ge=1, le=256)
    http_port: Port | None = Field(default=None, description="First instance's HTTP port.")
    cpu_cores: list[int] | None = Field(
        default=None, description="CPU cores for the whole group (split evenly per instance)."
    )
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _name_shape = field_validator("name")(classmethod(lambda cls, v: _group_name_shape(v)))
    _cores = field_validator("cpu_cores")(classmethod(lambda cls, v: _non_negative_unique(v)))


def group_name(role: str, index: int, group: InstanceGroup, n_groups: int) -> str:
    """A group's name: explicit, else the role (one group) or role + letter (several)."""
    if group.name:
        return group.name
    if n_groups == 1:
        return role
    return f"{role}-{_letters(index)}"


def render_group_name(index: int, group: RenderGroup, n_groups: int) -> str:
    if group.name:
        return group.name
    return "render" if n_groups == 1 else f"render-{_letters(index)}"


def _letters(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s
