"""Reading Prometheus metrics from vLLM instances and the router; the fleet monitor."""

from pdctl.sdk.metrics.derive import Histogram, Scrape, counter_delta
from pdctl.sdk.metrics.promtext import MetricsParseError, Sample, parse, parse_text, total

__all__ = [
    "Histogram",
    "MetricsParseError",
    "Sample",
    "Scrape",
    "counter_delta",
    "parse",
    "parse_text",
    "total",
]
