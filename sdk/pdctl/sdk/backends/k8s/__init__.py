"""Kubernetes: manifests built from the spec, applied and read back with ``kubectl``."""

from pdctl.sdk.backends.k8s.backend import K8sBackend
from pdctl.sdk.backends.k8s.kubectl import Kubectl, KubectlError
from pdctl.sdk.backends.k8s.manifests import (
    build_manifests,
    cluster_plan,
    to_json,
    to_yaml,
)

__all__ = [
    "K8sBackend",
    "Kubectl",
    "KubectlError",
    "build_manifests",
    "cluster_plan",
    "to_json",
    "to_yaml",
]
