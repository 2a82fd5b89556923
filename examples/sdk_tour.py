"""A tour of the SDK's public API on the demo fleet: lint the spec, bring the fleet up,
stream answers (one of them with U+2028 and U+0085 in it) and compare them with the
whole answers, read the router's flight recorder and one round of metrics.

Like the quickstart it takes no arguments: ``PDCTL_`` environment variables move the
fleet (``PDCTL_ROUTER__PORT=9000 python examples/sdk_tour.py``).
"""

import json
from typing import Any

from pdctl.sdk import Fleet, RouterClient, lint, load_demo_spec, require_clean

PROMPT = "the prefill engine pushes its cache to"
# vLLM's structured outputs make even a random-weight model write these characters, which
# vLLM sends unescaped inside its JSON events: a client that splits lines at them loses text
ODD = {"regex": "(cache|block)\u2028(push|pull)\u0085(fleet|queue)"}


def compare(router: RouterClient, name: str, **params: Any) -> None:
    """Print one answer as a whole and as streamed."""
    whole = router.complete(PROMPT, max_tokens=24, **params).text
    with router.stream(PROMPT, max_tokens=24, **params) as chunks:
        streamed = "".join(chunk.text for chunk in chunks)
    print(name, json.dumps({"whole": whole, "streamed": streamed}))


spec = load_demo_spec()  # the embedded demo spec on the tiny model (built when missing)
report = lint(spec, check_bound_ports=False)
require_clean(report)  # raises LintFailed naming every error
print("lint warnings:", [f.code for f in report.warnings])

with Fleet(spec) as fleet:
    router = fleet.router
    compare(router, "plain")
    compare(router, "odd", structured_outputs=ODD)
    last = router.requests(limit=1)[0]
    print("last request:", last.prefill, "->", last.decode, last.outcome, last.ttft_ms)
    print("mode:", router.get_mode())
    summary = fleet.snapshot().summary
    print("KV bytes moved:", int(summary.kv_bytes_moved))
