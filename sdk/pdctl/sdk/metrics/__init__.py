"""Reading Prometheus metrics from vLLM instances and the router."""

from pdctl.sdk.metrics.promtext import MetricsParseError, Sample, parse, total

__all__ = ["MetricsParseError", "Sample", "parse", "total"]
