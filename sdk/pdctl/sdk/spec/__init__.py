"""The fleet spec: one description of a P/D fleet, from which everything else is derived.

The models here only describe and validate *shapes* (types, ranges, names). Whether a
valid-looking spec is a good idea (port clashes, TP mismatches, loopback side channels…)
is the linter's job (:mod:`pdctl.sdk.lint`), so that each problem gets a code, a cost
and a fix instead of a bare validation error.

* :mod:`~pdctl.sdk.spec.base` — literal types, ports, strict models, name checks.
* :mod:`~pdctl.sdk.spec.settings` — ``[model]``, ``[fleet]``, ``[fleet.ucx]``.
* :mod:`~pdctl.sdk.spec.groups` — ``[[prefill]]``, ``[[decode]]``, ``[[render]]``.
* :mod:`~pdctl.sdk.spec.router` — ``[router]``.
* :mod:`~pdctl.sdk.spec.observability` — ``[observability]``.
* :mod:`~pdctl.sdk.spec.backend` — ``[backend]`` (Kubernetes, Ray).
* :mod:`~pdctl.sdk.spec.fleetspec` — :class:`FleetSpec`, the whole.
"""

from pdctl.sdk.spec.admission import AdmissionSpec
from pdctl.sdk.spec.backend import (
    RAY_MANAGED_RESOURCES,
    RDMA_CAPABILITY,
    RESERVED_LABEL_PREFIXES,
    BackendSpec,
    K8sSpec,
    PodPatchOp,
    RayGroup,
    RaySpec,
    Toleration,
)
from pdctl.sdk.spec.base import (
    BackendKind,
    ConnectorChoice,
    FailurePolicy,
    HashAlgo,
    Mode,
    Platform,
    Port,
    RenderFallback,
    RestartMode,
    Role,
    RouterPath,
    RouterPolicy,
    VllmVersion,
    is_dns_label,
)
from pdctl.sdk.spec.fleetspec import FleetSpec, spec_json_schema
from pdctl.sdk.spec.groups import (
    ENGINE_ID_FIELDS,
    InstanceGroup,
    RenderGroup,
    group_name,
    render_group_name,
)
from pdctl.sdk.spec.observability import ObservabilitySpec
from pdctl.sdk.spec.router import ApiKeySpec, CanarySpec, RouterSpec
from pdctl.sdk.spec.security import (
    AuditSpec,
    HttpLimitsSpec,
    KeyRole,
    RateLimitSpec,
    RouterKeySpec,
    TlsSpec,
)
from pdctl.sdk.spec.settings import FleetSettings, ModelSpec, UcxSpec

__all__ = [
    "ENGINE_ID_FIELDS",
    "RAY_MANAGED_RESOURCES",
    "RDMA_CAPABILITY",
    "RESERVED_LABEL_PREFIXES",
    "AdmissionSpec",
    "ApiKeySpec",
    "AuditSpec",
    "BackendKind",
    "BackendSpec",
    "CanarySpec",
    "ConnectorChoice",
    "FailurePolicy",
    "FleetSettings",
    "FleetSpec",
    "HashAlgo",
    "HttpLimitsSpec",
    "InstanceGroup",
    "K8sSpec",
    "KeyRole",
    "Mode",
    "ModelSpec",
    "ObservabilitySpec",
    "Platform",
    "PodPatchOp",
    "Port",
    "RateLimitSpec",
    "RayGroup",
    "RaySpec",
    "RenderFallback",
    "RenderGroup",
    "RestartMode",
    "Role",
    "RouterKeySpec",
    "RouterPath",
    "RouterPolicy",
    "RouterSpec",
    "TlsSpec",
    "Toleration",
    "UcxSpec",
    "VllmVersion",
    "group_name",
    "is_dns_label",
    "render_group_name",
    "spec_json_schema",
]
