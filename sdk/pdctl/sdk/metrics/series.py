"""The series the fleet monitor reads, by name: one list for both of its sources (the
instances' own ``/metrics`` and Prometheus' PromQL)."""

from __future__ import annotations

from pdctl.sdk.metrics.rendezvous import METRICS as RENDEZVOUS_METRICS

V = "vllm:"
WANTED = (
    V + "time_to_first_token_seconds",
    V + "inter_token_latency_seconds",
    V + "request_time_per_output_token_seconds",
    V + "e2e_request_latency_seconds",
    V + "nixl_",
    V + "num_requests_running",
    V + "num_requests_waiting",
    V + "num_requests_kv_fetch_by_stage",
    V + "kv_cache_usage_perc",
    V + "prompt_tokens_by_source_total",
    V + "request_success_total",
    V + "prefix_cache_",
    V + "request_prompt_tokens",
    V + "request_generation_tokens",
    "pdctl",
)
"""The series the monitor reads (router: pdctl_router_*, connector: pdctl:*); the
parser skips every other line of a ~60 KB payload without looking inside it."""
QUANTILES = (0.5, 0.9, 0.99)
LENGTHS = (V + "request_prompt_tokens", V + "request_generation_tokens")
"""The token-length histograms (:class:`Lengths`: a mean and a p95, not latencies)."""
ROUTER_TTFT = "pdctl_router_ttft_seconds"
"""The router's time to the answer's first byte, every request (router/timeline.py)."""
ROUTER_E2E = "pdctl_router_e2e_seconds"
CANARY = "pdctl_router_canary_total"
"""The router's output canary results, by prefill, decode and result (router/canary.py)."""
SHED = "pdctl_router_shed_total"
"""Requests the router's admission control answered itself, by reason and class
(router/admission.py); absent with admission off."""
ADMITTED = "pdctl_router_admitted_total"
"""Requests admitted to the fleet, by class and whether they queued first."""
PREDICTION_ERROR = "pdctl_router_ttft_prediction_error_ratio"
"""|predicted - observed| / observed TTFT of answered requests with a prediction
(router/predictor.py)."""
PREDICTIONS = "pdctl_router_ttft_predictions_total"
"""Requests placed with a TTFT prediction for their pair (known) or without (unknown)."""
HISTOGRAMS = (
    V + "time_to_first_token_seconds",
    V + "inter_token_latency_seconds",
    V + "request_time_per_output_token_seconds",
    V + "e2e_request_latency_seconds",
    V + "nixl_xfer_time_seconds",
    V + "nixl_post_time_seconds",
    ROUTER_TTFT,
    ROUTER_E2E,
    PREDICTION_ERROR,
    *(m.name for m in RENDEZVOUS_METRICS if m.kind == "histogram"),
)
"""The histograms whose quantiles the snapshot shows (:class:`Latency`); of the others
(NIXL's bytes and descriptors, :data:`LENGTHS`) it reads the sum and count, or one
quantile."""
