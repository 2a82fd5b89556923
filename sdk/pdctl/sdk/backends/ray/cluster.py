"""The few Ray calls the backend makes, in one place (Ray is imported here, lazily).

Everything blocks; the backend runs it in a thread. Ray's own objects stay ``Any`` at
this boundary (Ray ships partial type information).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from pdctl.sdk.backends.base import BackendError
from pdctl.sdk.backends.ray.actor import InstanceProcess
from pdctl.sdk.backends.ray.placement import Node

INSTALL_HINT = "pip install 'pdctl[ray]' (the same Ray version as the cluster's)"
CALL_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
JOIN_HINT = (
    "start a cluster (`ray start --head`) or point backend.ray.address (or --address) at one"
)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BackendError(
            f"the ray backend needs Ray on this machine and on every node: {INSTALL_HINT}"
        ) from None
    return ray


def actor_name(fleet: str, instance: str) -> str:
    return f"{fleet}/{instance}"


class RayCluster:
    """A connection to one Ray cluster, in the fleet's namespace."""

    def __init__(self, address: str | None, namespace: str) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.namespace = namespace
        self.ray: Any = None

    def connect(self) -> Any:
        """Join the cluster as a driver (never start a new one)."""
        if self.ray is not None:
            return self.ray
        ray = import_ray()
        if not ray.is_initialized():
            self._check_reachable()
            try:
                ray.init(
                    address=self.address,
                    namespace=self.namespace,
                    logging_level="ERROR",
                    log_to_driver=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise BackendError(
                    f"cannot join the Ray cluster at {self.address!r}: {e}; {JOIN_HINT}"
                ) from None
        self.ray = ray
        return ray

    def _check_reachable(self) -> None:
        """Fail fast on an address nothing listens at (Ray itself retries for minutes)."""
        if self.address == "local":
            raise BackendError(
                f"backend.ray.address = 'local' would start a new cluster: {JOIN_HINT}"
            )
        host, sep, port = self.address.removeprefix("ray://").rpartition(":")
        if not sep or not port.isdigit():
            return  # 'auto' and the like: Ray finds the cluster (or says it cannot) at once
        try:
            socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise BackendError(
                f"cannot join the Ray cluster at {self.address!r}: nothing answers there "
                f"({e.strerror or e}); {JOIN_HINT}"
            ) from None

    def nodes(self) -> list[Node]:
        return [Node.from_ray(n) for n in self.connect().nodes()]

    def actor_names(self, fleet: str) -> list[str]:
        """Names of the live named actors of ``fleet`` (instance names)."""
        ray = self.connect()
        prefix = actor_name(fleet, "")
        return sorted(
            n[len(prefix) :] for n in ray.util.list_named_actors() if n.startswith(prefix)
        )

    def actor(self, fleet: str, instance: str) -> Any | None:
        """The actor of one instance, or None when it is gone."""
        ray = self.connect()
        try:
            return ray.get_actor(actor_name(fleet, instance), namespace=self.namespace)
        except ValueError:
            return None

    def create(
        self, fleet: str, instance: str, record: dict[str, Any], opts: dict[str, Any]
    ) -> Any:
        """A detached actor for one instance, pinned to its node; not restarted by Ray (a
        restarted actor would come back elsewhere, at an address the router does not know)."""
        ray = self.connect()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = ray.remote(InstanceProcess)
        res = dict(opts)
        return cls.options(
            name=actor_name(fleet, instance),
            namespace=self.namespace,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=4,
            num_cpus=res.pop("CPU", 0.0),
            num_gpus=res.pop("GPU", 0.0),
            resources={k: v for k, v in res.items() if v},
            scheduling_strategy=NodeAffinitySchedulingStrategy(record["node_id"], soft=False),
        ).remote(record)

    def call(self, refs: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Wait for several actor calls together; each answer, or the exception it raised
        (a dead actor, a timeout) in its place."""
        if not refs:
            return {}
        ray = self.connect()
        ready, _pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        done = set(ready)
        out: dict[str, Any] = {}
        for name, ref in refs.items():
            if ref not in done:
                out[name] = TimeoutError(f"no answer within {timeout:g} s")
                continue
            try:
                out[name] = ray.get(ref, timeout=0)
            except Exception as e:  # a dead actor, a failed call: reported per instance
                out[name] = e
        return out

    def kill(self, handle: Any) -> None:
        self.connect().kill(handle, no_restart=True)
