"""pdctl's push scheduler: the scheduler half of :mod:`pdctl.connector.lifecycle`.

It decides which requests ended early (D: aborted or rejected while awaiting KV; P: a
prefill dropped before its WRITE) and which KV the router asked to free (a *release
request*: ``kv_transfer_params`` carrying :data:`RELEASE_PARAM`), and hands the decisions
to the worker in vLLM's connector metadata (:data:`META_ATTR`).
"""

from __future__ import annotations

import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)

META_ATTR = "pdctl_lifecycle"
"""Attribute of vLLM's connector metadata carrying the scheduler's decisions."""
RELEASE_KEY = "pdctl_release"
"""Marks a registration-shaped message as a release (sent on vLLM's registration path)."""
RELEASE_PARAM = "pdctl_release_ids"
"""``kv_transfer_params`` key of a release request from the router (equal to the SDK's
``pdctl.sdk.pd.RELEASE_PARAM``; a unit test keeps them so)."""
MIN_RELEASE_KEY = 8
"""Shorter ids in a release request are ignored: ids match as dash-delimited parts of
vLLM's request ids, and a short one ("0") would name unrelated requests."""


_NORMAL_FINISH = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


def _finished_normally(request: Any) -> bool:
    return getattr(request.status, "name", "") in _NORMAL_FINISH


# ---------------------------------------------------------------------- scheduler


class PdctlPushScheduler(NixlPushConnectorScheduler):
    """vLLM's push scheduler that tells its worker which requests ended early."""

    _pdctl_aborted: dict[str, dict[str, Any]]
    _pdctl_dropped: set[str]
    _pdctl_released: set[str]

    @classmethod
    def attach(cls, scheduler: NixlPushConnectorScheduler) -> None:
        scheduler.__class__ = cls
        assert isinstance(scheduler, PdctlPushScheduler)
        scheduler._pdctl_aborted = {}
        scheduler._pdctl_dropped = set()
        scheduler._pdctl_released = set()

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params and RELEASE_PARAM in params:
            # a release request from the router (P): the ids whose KV nobody will read;
            # the request itself runs as an ordinary one-token completion
            ids = params.pop(RELEASE_PARAM)
            if isinstance(ids, list):
                self._pdctl_released.update(
                    str(i) for i in ids if isinstance(i, str) and len(i) >= MIN_RELEASE_KEY
                )
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, Any]:
        params = request.kv_transfer_params or {}
        rid = request.request_id
        never_registered = bool(params.get("do_remote_prefill"))
        if params and (never_registered or not _finished_normally(request)):
            if params.get("do_remote_decode"):
                self._pdctl_dropped.add(rid)  # P: a prefill D may be registered for
            elif params.get("remote_engine_id"):
                # D: aborted while awaiting KV, or done without ever registering (rejected
                # by the serving layer, or served from its own prefix cache): P's KV for
                # it will never be read
                held = rid in self._push_registration_deadlines
                if held or never_registered:
                    self._pdctl_aborted[rid] = {
                        "request_id": rid,
                        # the id both legs were sent with (P's own id contains it)
                        "prefill_request_id": str(params.get("remote_request_id") or ""),
                        "remote_engine_id": params["remote_engine_id"],
                        "remote_host": params.get("remote_host"),
                        "remote_port": params.get("remote_port"),
                        "remote_tp_size": params.get("tp_size", 1),
                        "remote_pp_size": params.get("pp_size", 1),
                        "held": held,
                        RELEASE_KEY: True,
                    }
        return super().request_finished(request, block_ids)

    def has_pending_push_work(self) -> bool:
        # a request rejected before it was scheduled leaves nothing else that would make
        # the engine step and ship its release
        return bool(
            super().has_pending_push_work()
            or self._pdctl_aborted
            or self._pdctl_dropped
            or self._pdctl_released
        )

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        now = time.perf_counter()
        expired = [r for r, t in self._push_registration_deadlines.items() if t <= now]
        meta = super().build_connector_meta(scheduler_output)
        if expired or self._pdctl_aborted or self._pdctl_dropped or self._pdctl_released:
            setattr(
                meta,
                META_ATTR,
                {
                    "aborted": self._pdctl_aborted,
                    "dropped": sorted(self._pdctl_dropped),
                    "expired": expired,
                    "released": sorted(self._pdctl_released),
                },
            )
            self._pdctl_aborted, self._pdctl_dropped = {}, set()
            self._pdctl_released = set()
        return meta
