"""The Kubernetes API through ``kubectl`` (what operators already have configured).

Every call goes to the current kube context unless a context is named, and fails with a
:class:`KubectlError` that says what to install or configure.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.backends.base import BackendError

INSTALL_HINT = (
    "install kubectl (https://kubernetes.io/docs/tasks/tools/) and point it at your "
    "cluster (`kubectl config use-context NAME`)"
)


class KubectlError(BackendError):
    """kubectl is missing, has no context, or the API server refused a request."""


@dataclass
class Kubectl:
    namespace: str
    context: str | None = None
    executable: str = "kubectl"
    timeout_s: float = 120.0

    def command(self, args: Sequence[str]) -> list[str]:
        ctx = ["--context", self.context] if self.context else []
        return [self.executable, *ctx, *args]

    def run(self, args: Sequence[str], *, stdin: str | None = None) -> str:
        cmd = self.command(args)
        try:
            done = subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise KubectlError(f"{self.executable!r} was not found; {INSTALL_HINT}") from None
        except subprocess.TimeoutExpired:
            raise KubectlError(
                f"`{shlex.join(cmd)}` did not answer within {self.timeout_s:g} s; is the "
                "cluster reachable (`kubectl cluster-info`)?"
            ) from None
        if done.returncode != 0:
            err = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
            raise KubectlError(f"`{shlex.join(cmd)}` failed: {err}")
        return done.stdout

    def current_context(self) -> str:
        """The context calls go to; an error saying how to choose one when there is none."""
        if shutil.which(self.executable) is None:
            raise KubectlError(f"{self.executable!r} was not found; {INSTALL_HINT}")
        if self.context:
            return self.context
        try:
            return self.run(["config", "current-context"]).strip()
        except KubectlError:
            raise KubectlError(
                "kubectl has no current context: choose one with "
                "`kubectl config use-context NAME`, or set backend.k8s.context"
            ) from None

    def has_api(self, resource: str) -> bool:
        """Does the cluster serve ``resource`` (e.g. a CRD's plural.group)?"""
        group = resource.split(".", 1)[1] if "." in resource else ""
        args = ["api-resources", "-o", "name"] + ([f"--api-group={group}"] if group else [])
        return resource in self.run(args).split()

    def apply(self, manifest_json: str) -> list[str]:
        out = self.run(
            ["apply", "-n", self.namespace, "-o", "name", "-f", "-"], stdin=manifest_json
        )
        return out.split()

    def get(self, kinds: Sequence[str], selector: str) -> list[dict[str, Any]]:
        out = self.run(["get", ",".join(kinds), "-n", self.namespace, "-l", selector, "-o", "json"])
        try:
            items = json.loads(out).get("items", [])
        except (ValueError, AttributeError):
            raise KubectlError(
                f"kubectl get returned something that is not JSON: {out[:200]!r}"
            ) from None
        return [i for i in items if isinstance(i, dict)]

    def delete(self, targets: Sequence[str], selector: str | None = None) -> list[str]:
        """Delete by ``kind/name`` targets, or every object of ``targets`` kinds matching
        ``selector``; absent objects are not an error. Returns what was deleted."""
        args = ["delete", *([",".join(targets)] if selector else targets), "-n", self.namespace]
        if selector:
            args += ["-l", selector]
        out = self.run([*args, "--ignore-not-found", "--wait=false", "-o", "name"])
        return out.split()
