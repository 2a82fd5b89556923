"""Admission control and deadlines: ``[router.admission]`` (docs/router.md, "Overload")."""

from __future__ import annotations

from pydantic import Field, model_validator

from pdctl.sdk.spec.base import _Strict


class AdmissionSpec(_Strict):
    """What the router lets into the fleet at once, how long the rest may queue, and when
    an instance's own gauges say its stage is saturated.

    Limits are the whole router's: a router of N workers gives each 1/N of them (at least
    1), as it does the rate limits."""

    enabled: bool = Field(
        default=True,
        description="Bound what the router sends the fleet and queue the rest; false "
        "sends every request on at once (the fleet's own queues are the only ones).",
    )
    prefill_in_flight_per_instance: int = Field(
        default=32,
        ge=1,
        description="Requests in their prefill stage (admitted, no first byte yet) per "
        "healthy prefill instance; more wait in the router's queue.",
    )
    decode_in_flight_per_instance: int = Field(
        default=256,
        ge=1,
        description="Requests admitted and not finished per healthy decode instance "
        "(vLLM's default max_num_seqs on GPUs is 256); more wait in the router's queue.",
    )
    max_queued: int = Field(
        default=512,
        ge=0,
        description="Requests waiting in the router's queue at most; one more is "
        "answered 429 at once. Each class keeps a quarter of it from each class below "
        "(standard joins only while 3/4 is free of it, batch 1/2), unless a lower class "
        "waits; a full queue sheds the newest request of a lower class queued to make room "
        "for a higher one (the last resort). 0: never queue.",
    )
    max_queue_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="A queued request not admitted within this long is answered 503.",
    )
    max_waiting_per_instance: int = Field(
        default=64,
        ge=0,
        description="An instance whose vllm:num_requests_waiting is at least this is "
        "saturated; a stage is saturated when every healthy instance of it is. 0: off.",
    )
    max_kv_usage: float = Field(
        default=0.98,
        ge=0,
        le=1,
        description="An instance whose vllm:kv_cache_usage_perc (0-1) is at least this "
        "is saturated. 0: off.",
    )
    scrape_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="How often the router reads every instance's /metrics for those "
        "gauges; 0 never (the in-flight limits alone).",
    )
    stale_after_s: float = Field(
        default=5.0,
        gt=0,
        description="Gauges older than this are unknown, and an unknown instance is never "
        "taken for saturated.",
    )
    default_deadline_ms: int = Field(
        default=0,
        ge=0,
        description="First-byte deadline of a request that sends no pdctl-deadline-ms or "
        "pdctl-slo-ttft-ms header: past it without a first byte the request is cancelled "
        "on both legs and answered 504. 0: none (router.request_timeout_s still applies).",
    )

    slo_routing: bool = Field(
        default=True,
        description="Route a request with an SLO (pdctl-slo-ttft-ms) or deadline to a P->D pair "
        "whose TTFT is predicted to meet it, and decide at its arrival whether it can "
        "be served in time: shed it at once (503 slo_unreachable) when every pair is "
        "predicted to miss it, or when it would queue and its predicted queue wait (the "
        "places ahead of it and the higher-class requests expected meanwhile, at the "
        "pace places free, the wait it beats queue_confidence of the time) plus its "
        "predicted TTFT does not meet it; lower classes are shed first, an interactive "
        "request only when it would miss with every lower class out of its way; one "
        "without an SLO is shed (503) when its predicted wait passes max_queue_wait_s. "
        "Pairs without a prediction yet never shed; while the queue's pace is not known "
        "yet only a lower class that higher classes are already overtaking is shed "
        "(unless a class below it waits). The predictions and their error are measured "
        "either way.",
    )
    slo_margin: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="The predictions' error allowance: a pair meets an SLO when its "
        "predicted TTFT times (1 + slo_margin) is within the time left; a request is "
        "shed only when every pair's exceeds the time left times (1 + slo_margin).",
    )
    queue_confidence: float = Field(
        default=0.975,
        ge=0.5,
        le=0.9999,
        description="How sure the router must be that a request it queues is served "
        "within its SLO or deadline: the predicted queue wait it compares is the one "
        "the request beats this often (0.975: about 39 times in 40). Higher sheds more "
        "at arrival and leaves fewer queued requests to miss their time in the queue "
        "(answered late, 504); 0.5 compares the mean wait.",
    )
    predictor_min_observations: int = Field(
        default=16,
        ge=2,
        le=10000,
        description="Requests a P->D pair must have answered before its TTFT is "
        "predicted; until then it is unknown (never shed for, never avoided).",
    )

    @model_validator(mode="after")
    def _stale_after_scrape(self) -> AdmissionSpec:
        if self.scrape_interval_s and self.stale_after_s <= self.scrape_interval_s:
            raise ValueError(
                f"router.admission.stale_after_s ({self.stale_after_s:g}) must be longer "
                f"than router.admission.scrape_interval_s ({self.scrape_interval_s:g}), or "
                "every reading would be stale before the next one; raise stale_after_s"
            )
        return self
