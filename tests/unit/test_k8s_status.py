"""Pod, Deployment and LeaderWorkerSet states → instance states (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.backends.k8s.status import by_instance, instance_status, parse_time, pod_state

T0 = "2026-01-10T12:00:00Z"


def pod(
    *,
    phase: str = "Running",
    ready: bool = True,
    started: bool = True,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    **meta: Any,
) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"labels": {"pdctl.io/instance": "prefill-0"}, **meta},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": ready,
                    "started": started,
                    "restartCount": restarts,
                    "state": state or {"running": {"startedAt": T0}},
                    "lastState": {"terminated": last} if last else {},
                }
            ],
        },
    }


@pytest.mark.parametrize(
    ("p", "state", "code"),
    [
        (pod(), "ready", None),
        (pod(ready=False, started=False), "starting", None),
        (pod(ready=False, started=True), "unhealthy", None),
        (pod(deletionTimestamp=T0), "stopping", None),
        (pod(state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), "exited", 137),
        (
            pod(
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                last={"exitCode": 3, "reason": "Error"},
                restarts=5,
            ),
            "exited",
            3,
        ),
        (pod(state={"waiting": {"reason": "CreateContainerConfigError"}}), "unhealthy", None),
        (
            pod(state={"waiting": {"reason": "ContainerCreating"}}, ready=False, started=False),
            "starting",
            None,
        ),
        (pod(phase="Succeeded", ready=False, state={"waiting": {}}), "exited", None),
    ],
)
def test_pod_states(p, state, code):
    got = pod_state(p)
    assert (got.state, got.exit_code) == (state, code)


def test_crash_loop_reports_restarts_and_reason():
    got = pod_state(
        pod(
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            last={"exitCode": 1, "reason": "Error"},
            restarts=4,
        )
    )
    assert got.restarts == 4
    assert got.detail == "CrashLoopBackOff: Error"


def test_a_group_takes_its_worst_pod():
    leader, worker = pod(), pod(ready=False, state={"terminated": {"exitCode": 1}})
    st = instance_status("decode-0", "decode", "http://d", [leader, worker], now=0.0, log_hint="")
    assert st.state == "exited"
    assert st.exit_code == 1
    assert st.uptime_s is None


def test_uptime_from_the_earliest_container_start():
    now = parse_time(T0)
    assert now is not None
    st = instance_status("p", "prefill", "u", [pod()], now=now + 90, log_hint="")
    assert st.state == "ready"
    assert st.uptime_s == pytest.approx(90)


def test_workload_without_pod_is_starting_and_says_why():
    dep = {
        "kind": "Deployment",
        "status": {
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": "exceeded quota: gpus, requested: nvidia.com/gpu=8",
                }
            ]
        },
    }
    st = instance_status("p", "prefill", "u", [dep], now=0.0, log_hint="")
    assert st.state == "starting"
    assert st.log_tail == ("FailedCreate: exceeded quota: gpus, requested: nvidia.com/gpu=8",)
    gone = instance_status("p", "prefill", "u", [], now=0.0, log_hint="")
    assert gone.state == "gone"


def test_objects_are_grouped_by_instance_label():
    other = pod()
    other["metadata"]["labels"]["pdctl.io/instance"] = "decode-0"
    unlabelled = {"kind": "ConfigMap", "metadata": {"labels": {}}}
    assert sorted(by_instance([pod(), other, unlabelled])) == ["decode-0", "prefill-0"]


def test_parse_time():
    assert parse_time("2026-01-10T12:00:00Z") == parse_time("2026-01-10T13:00:00+01:00")
    assert parse_time("not a time") is None
    assert parse_time(None) is None
