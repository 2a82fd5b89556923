"""Reading Prometheus metrics from vLLM instances and the router; the fleet monitor."""

from pdctl.sdk.metrics.coverage import ENABLE, Coverage, coverage_of
from pdctl.sdk.metrics.derive import Histogram, Scrape, counter_delta
from pdctl.sdk.metrics.panels import Panel, panels_doc, panels_of
from pdctl.sdk.metrics.promql import Trends
from pdctl.sdk.metrics.promtext import MetricsParseError, Sample, parse, parse_text, total

__all__ = [
    "ENABLE",
    "Coverage",
    "Histogram",
    "MetricsParseError",
    "Panel",
    "Sample",
    "Scrape",
    "Trends",
    "counter_delta",
    "coverage_of",
    "panels_doc",
    "panels_of",
    "parse",
    "parse_text",
    "total",
]
