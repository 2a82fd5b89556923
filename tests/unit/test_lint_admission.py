"""Lint rules PD051-PD055 on ``[router.admission]``: each finding names the field and its
fix, with a close variant that stays quiet."""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.fleetplan import build_plan, priority_scheduling
from pdctl.sdk.lint import Finding, lint
from pdctl.sdk.spec import FleetSpec
from tests.conftest import spec_dict


def _spec(admission: dict[str, Any] | None = None, **kw: Any) -> FleetSpec:
    router = {"port": 18000, **kw.pop("router", {})}
    if admission is not None:
        router["admission"] = admission
    return FleetSpec(**spec_dict(router=router, **kw))


def _of(spec: FleetSpec, code: str) -> list[Finding]:
    return [f for f in lint(spec, check_bound_ports=False).findings if f.code == code]


def _unchecked(**admission: Any) -> FleetSpec:
    """A spec whose admission values skipped validation (``model_copy(update=...)``)."""
    spec = _spec()
    assert spec.router is not None
    adm = spec.router.admission.model_copy(update=admission)
    return spec.model_copy(update={"router": spec.router.model_copy(update={"admission": adm})})


# ---------------------------------------------------------------- PD051 ranges


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prefill_in_flight_per_instance", 0),
        ("decode_in_flight_per_instance", -1),
        ("max_queued", -1),
        ("max_queue_wait_s", 0),
        ("max_waiting_per_instance", -4),
        ("max_kv_usage", 1.5),
        ("max_kv_usage", -0.1),
        ("scrape_interval_s", -1),
        ("stale_after_s", 0),
        ("default_deadline_ms", -100),
        ("slo_margin", 2),
        ("queue_confidence", 0.4),
        ("queue_confidence", 1.0),
        ("predictor_min_observations", 1),
    ],
)
def test_pd051_names_each_field_out_of_range(field, value):
    found = _of(_unchecked(**{field: value}), "PD051")
    assert [(f.severity, f.field) for f in found] == [("error", f"router.admission.{field}")]
    assert found[0].fix.startswith(f"set router.admission.{field}")


def test_pd051_a_percentage_for_max_kv_usage_is_read_back_as_a_fraction():
    (f,) = _of(_unchecked(max_kv_usage=98), "PD051")
    assert f.fix == "set router.admission.max_kv_usage = 0.98 (a fraction, not a percentage)"


def test_pd051_stale_after_not_longer_than_the_scrape_interval():
    (f,) = _of(_unchecked(scrape_interval_s=2.0, stale_after_s=2.0), "PD051")
    assert f.field == "router.admission.stale_after_s"
    assert "raise router.admission.stale_after_s" in f.fix
    # the scrape off: nothing is read, so nothing goes stale
    assert not _of(_unchecked(scrape_interval_s=0.0, stale_after_s=0.5), "PD051")


def test_pd051_quiet_on_the_defaults_and_the_bounds():
    assert not _of(_spec(), "PD051")
    assert not _of(
        _spec({"max_queued": 0, "max_kv_usage": 1.0, "max_waiting_per_instance": 0}), "PD051"
    )


# ---------------------------------------------------------------- PD052 timeouts


def test_pd052_queue_wait_not_shorter_than_the_request_timeout():
    (f,) = _of(_spec({"max_queue_wait_s": 60}, router={"request_timeout_s": 60}), "PD052")
    assert (f.severity, f.field) == ("warning", "router.admission.max_queue_wait_s")
    assert not _of(_spec({"max_queue_wait_s": 59}, router={"request_timeout_s": 60}), "PD052")


def test_pd052_default_deadline_not_shorter_than_the_request_timeout():
    (f,) = _of(_spec({"default_deadline_ms": 30_000}, router={"request_timeout_s": 30}), "PD052")
    assert (f.severity, f.field) == ("warning", "router.admission.default_deadline_ms")
    assert "below 30000" in f.fix
    assert not _of(
        _spec(
            {"default_deadline_ms": 29_000, "max_queue_wait_s": 10},
            router={"request_timeout_s": 30},
        ),
        "PD052",
    )


def test_pd052_notes_a_default_deadline_shorter_than_the_queue_wait():
    (f,) = _of(_spec({"default_deadline_ms": 2000, "max_queue_wait_s": 10}), "PD052")
    assert (f.severity, f.field) == ("info", "router.admission.max_queue_wait_s")
    # no queue: nothing waits, so nothing to note
    assert not _of(_spec({"default_deadline_ms": 2000, "max_queued": 0}), "PD052")


def test_admission_rules_quiet_with_admission_off():
    spec = _spec(
        {"enabled": False, "max_queue_wait_s": 900, "scrape_interval_s": 0},
        decode=[{"host": "127.0.0.1", "devices": [1], "vllm_args": ["--max-num-seqs", "8"]}],
    )
    for code in ("PD052", "PD053", "PD054"):
        assert not _of(spec, code), code


# ---------------------------------------------------------------- PD053 gauges


def test_pd053_admission_with_the_scrape_off():
    (f,) = _of(_spec({"scrape_interval_s": 0}), "PD053")
    assert (f.severity, f.field) == ("warning", "router.admission.scrape_interval_s")
    assert "scrape_interval_s = 1" in f.fix
    # the gauges' thresholds off too: the spec says what it means
    assert not _of(
        _spec({"scrape_interval_s": 0, "max_waiting_per_instance": 0, "max_kv_usage": 0}),
        "PD053",
    )


def test_pd053_an_engine_that_exports_no_gauges():
    spec = _spec(
        decode=[{"host": "127.0.0.1", "devices": [1], "vllm_args": ["--disable-log-stats"]}]
    )
    (f,) = _of(spec, "PD053")
    assert (f.severity, f.field) == ("warning", "decode[0].vllm_args")
    assert not _of(_spec(decode=[{"host": "127.0.0.1", "devices": [1]}]), "PD053")


def test_pd053_notes_a_stale_window_under_two_scrapes():
    (f,) = _of(_spec({"scrape_interval_s": 1.0, "stale_after_s": 1.5}), "PD053")
    assert (f.severity, f.field) == ("info", "router.admission.stale_after_s")
    assert not _of(_spec({"scrape_interval_s": 1.0, "stale_after_s": 2.0}), "PD053")


# ---------------------------------------------------------------- PD054 stages


def test_pd054_decode_limit_above_vllms_max_num_seqs():
    decode = [{"host": "127.0.0.1", "devices": [1], "vllm_args": ["--max-num-seqs=64"]}]
    (f,) = _of(_spec(decode=decode), "PD054")  # the default limit is 256
    assert (f.severity, f.field) == ("info", "router.admission.decode_in_flight_per_instance")
    assert f.fix == (
        "set router.admission.decode_in_flight_per_instance to 64 or less, "
        "or raise decode[0].max_num_seqs"
    )
    assert not _of(_spec({"decode_in_flight_per_instance": 64}, decode=decode), "PD054")
    # the group's own max_num_seqs is the same flag
    prefill = [{"host": "127.0.0.1", "devices": [0], "max_num_seqs": 8}]
    (f,) = _of(_spec(prefill=prefill), "PD054")
    assert f.field == "router.admission.prefill_in_flight_per_instance"


def test_pd054_prefill_limit_that_the_decode_limit_always_reaches_first():
    # 2 prefills x 32 = 64 in the prefill stage, above 1 decode x 48 = 48 in the decode stage
    spec = _spec(
        {"decode_in_flight_per_instance": 48},
        prefill=[{"host": "127.0.0.1", "count": 2, "devices": [0, 2]}],
    )
    (f,) = _of(spec, "PD054")
    assert (f.severity, f.field) == ("info", "router.admission.prefill_in_flight_per_instance")
    assert "to 24 or less" in f.fix  # 48 // 2
    assert not _of(_spec({"decode_in_flight_per_instance": 64}), "PD054")


def test_pd054_limits_below_the_router_workers():
    spec = _spec({"prefill_in_flight_per_instance": 2, "max_queued": 3}, router={"workers": 4})
    found = {f.field: f for f in _of(spec, "PD054")}
    assert set(found) == {
        "router.admission.prefill_in_flight_per_instance",
        "router.admission.max_queued",
    }
    assert "lets 4 through, not 2" in found["router.admission.prefill_in_flight_per_instance"].cost
    assert not _of(
        _spec({"prefill_in_flight_per_instance": 4, "max_queued": 0}, router={"workers": 4}),
        "PD054",
    )


# ---------------------------------------------------------------- PD055 priorities


def _policies(prefill: list[str], decode: list[str], fleet: list[str] | None = None) -> FleetSpec:
    return _spec(
        fleet={"mode": "push", "platform": "gpu", "block_size": 128, "vllm_args": fleet or []},
        prefill=[{"host": "127.0.0.1", "devices": [0], "vllm_args": prefill}],
        decode=[{"host": "127.0.0.1", "devices": [1], "vllm_args": decode}],
    )


def test_pd055_priority_scheduling_on_some_engines_only():
    spec = _policies(["--scheduling-policy", "priority"], [])
    (f,) = _of(spec, "PD055")
    assert (f.severity, f.field) == ("warning", "decode[0].vllm_args")
    assert "prefill[0]" in f.message
    assert "decode[0]" in f.message
    assert "fleet.vllm_args" in f.fix
    # the router agrees: it passes no class on to either
    assert not priority_scheduling(build_plan(spec))


def test_pd055_quiet_when_every_engine_or_none_schedules_by_priority():
    every = _policies([], [], fleet=["--scheduling-policy=priority"])
    assert not _of(every, "PD055")
    assert priority_scheduling(build_plan(every))
    assert not _of(_policies([], []), "PD055")
    assert not _of(_policies(["--scheduling-policy", "fcfs"], []), "PD055")


def test_pd055_a_policy_vllm_does_not_know():
    (f,) = _of(_policies([], ["--scheduling-policy", "edf"]), "PD055")
    assert (f.severity, f.field) == ("error", "decode[0].vllm_args")


def test_a_colocated_fleet_scheduling_by_priority_gets_the_class():
    spec = FleetSpec(
        **spec_dict(
            fleet={"mode": "colocated", "platform": "gpu", "block_size": 128},
            prefill=[],
            decode=[
                {"host": "127.0.0.1", "devices": [1], "vllm_args": ["--scheduling-policy=priority"]}
            ],
        )
    )
    assert priority_scheduling(build_plan(spec))
