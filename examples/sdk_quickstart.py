"""Start the demo fleet, send one completion through its router, print the KV bytes moved."""

from pdctl.sdk import Fleet

with Fleet.demo() as fleet:  # builds the tiny model if missing; stops everything on exit
    answer = fleet.router.complete("the prefill engine pushes its cache to", max_tokens=8)
    print("answer:", answer.text)
    summary = fleet.snapshot().summary
    print("KV bytes moved:", int(summary.kv_bytes_moved))
