"""``pdctl bench``'s engine: a load generator and the same-budget A/B of P/D modes.

* :mod:`~pdctl.sdk.bench.arrivals` — open-loop arrival processes (Poisson / gamma).
* :mod:`~pdctl.sdk.bench.loadgen` — exact-length prompts and a streaming client.
* :mod:`~pdctl.sdk.bench.stats` — percentiles and the per-cell record.
* :mod:`~pdctl.sdk.bench.plan` — modes x input lengths x rates, presets.
* :mod:`~pdctl.sdk.bench.suite` — runs a plan, one fleet start per configuration.
* :mod:`~pdctl.sdk.bench.report` — JSON, CSV and PNG.
* :mod:`~pdctl.sdk.bench.overload` — goodput with and without admission control
  (``--preset overload``).
"""
