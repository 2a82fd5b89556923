"""The whole spec: :class:`FleetSpec`, validated in one go from the dict pdctl merges."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pdctl.sdk.spec.backend import BackendSpec
from pdctl.sdk.spec.base import Role
from pdctl.sdk.spec.groups import InstanceGroup, RenderGroup, group_name, render_group_name
from pdctl.sdk.spec.observability import ObservabilitySpec
from pdctl.sdk.spec.router import RouterSpec
from pdctl.sdk.spec.settings import FleetSettings, ModelSpec


class _InitOnly(BaseSettings):
    """Settings whose only source is the merged dict pdctl builds itself.

    pdctl merges file, environment and ``--set`` layers in :mod:`pdctl.sdk.specload`
    (so that list indices such as ``prefill.0.tp`` work in every layer); validation then
    happens here in one go.
    """

    model_config = SettingsConfigDict(
        env_prefix="PDCTL_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class FleetSpec(_InitOnly):
    """A whole fleet: model, transfer settings, prefill and decode groups, router."""

    model: ModelSpec
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    prefill: list[InstanceGroup] = Field(default_factory=list)
    decode: list[InstanceGroup] = Field(default_factory=list)
    router: RouterSpec | None = None
    backend: BackendSpec = Field(default_factory=BackendSpec)
    render: list[RenderGroup] = Field(
        default_factory=list, description="GPU-less render servers for the tokens path."
    )
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)

    @model_validator(mode="after")
    def _groups(self) -> FleetSpec:
        if not self.prefill and not self.decode:
            raise ValueError(
                "the fleet has no instances: add at least one [[prefill]] and one [[decode]] table"
            )
        seen: dict[str, str] = {}
        for role, groups in (("prefill", self.prefill), ("decode", self.decode)):
            for i, g in enumerate(groups):
                gname = group_name(role, i, g, len(groups))
                where = f"{role}[{i}].name"
                if gname in seen:
                    raise ValueError(
                        f"{where}: group name {gname!r} is already used by {seen[gname]}; "
                        "give each group a distinct name"
                    )
                seen[gname] = where
        for i, r in enumerate(self.render):
            rname = render_group_name(i, r, len(self.render))
            if rname in seen:
                raise ValueError(
                    f"render[{i}].name: group name {rname!r} is already used by {seen[rname]}"
                )
            seen[rname] = f"render[{i}].name"
        if self.router is not None and self.router.path == "tokens" and not self.render:
            raise ValueError(
                "router.path = 'tokens' needs a render server: add a [[render]] table "
                "(or set router.path = 'text')"
            )
        return self

    @property
    def kv_events_on(self) -> bool:
        """Whether instances publish KV cache events: ``fleet.kv_events``, by default on
        with the cache-aware router policy (unless prefix caching is off)."""
        if self.fleet.kv_events is not None:
            return self.fleet.kv_events
        cache_aware = self.router is not None and self.router.policy == "cache_aware"
        return cache_aware and self.fleet.enable_prefix_caching is not False

    def groups(self) -> list[tuple[Role, int, InstanceGroup]]:
        """All groups in plan order: prefill groups first, then decode groups."""
        out: list[tuple[Role, int, InstanceGroup]] = []
        out.extend(("prefill", i, g) for i, g in enumerate(self.prefill))
        out.extend(("decode", i, g) for i, g in enumerate(self.decode))
        return out


def spec_json_schema() -> dict[str, Any]:
    """JSON schema of the spec, for editors and docs."""
    return FleetSpec.model_json_schema()
