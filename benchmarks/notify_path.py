"""What routing pdctl's failure notifications through the push writer costs, one run.

pdctl's lifecycle decides some notifications off the writer thread (a failed WRITE seen
by the engine thread, a handshake completing on the handshake executor). Before, the
deciding thread called ``send_notif`` itself; now the message goes to the writer's inbox
and vLLM's ``nixl-push-writer`` sends it on its next turn. Two real NIXL agents in this
process (UCX backend, NIXL's defaults as on GPU: progress thread on, sync mode unset),
vLLM's real writer loop on its own thread, and the real ``LifecycleWorker`` code; arms,
interleaved over ``--rounds``:

* ``caller`` — the engine thread sends the notification itself (the old code path);
* ``writer`` — the engine thread hands it to the writer (this build).

Per arm: the time the engine thread spends in the call (its step is what waits) and the
delivery latency (the call until the receiving agent has the notification), medians of
the per-round medians; ratios writer / caller. The happy path (a WRITE and its completion)
does not pass through this code at all: only failure and release notifications do.

    python benchmarks/notify_path.py [--rounds 5] [--count 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Any

ENGINE = "decode-engine"


def agents() -> tuple[Any, Any, str]:
    from nixl._api import nixl_agent, nixl_agent_config

    cfg = nixl_agent_config(backends=["UCX"])  # NIXL's defaults otherwise (as on GPU)
    sender, receiver = nixl_agent("p", cfg), nixl_agent("d", cfg)
    name = sender.add_remote_agent(receiver.get_agent_metadata())
    receiver.add_remote_agent(sender.get_agent_metadata())
    return sender, receiver, name.decode() if isinstance(name, bytes) else str(name)


def lifecycle_worker(sender: Any, peer: str) -> Any:
    """vLLM's push worker class with pdctl's lifecycle, holding only what these paths use;
    vLLM's real writer loop runs on its own thread."""
    from pdctl.connector import lifecycle as lc

    w: Any = object.__new__(lc.LifecycleWorker)
    w._pdctl_life = lc._State(grace_s=1.0)
    state: dict[str, Any] = {
        "nixl_wrapper": sender,
        "_handshake_lock": threading.Lock(),
        "_remote_agents": {ENGINE: {(0, 0): peer}},
        "_reg_send_inbox": queue.Queue(),
        "_deferred_push_inbox": queue.Queue(),
        "_finished_blocks_inbox": queue.Queue(),
        "_evict_finished_inbox": queue.Queue(),
        "_pending_completion_notifs": queue.Queue(),
        "_push_finished_blocks": {},
        "_pending_d_registrations": {},
        "_push_writer_wake": threading.Event(),
        "_push_writer_stop": threading.Event(),
    }
    for k, v in state.items():
        setattr(w, k, v)
    w._push_writer_thread = threading.Thread(
        target=w._push_writer_loop, name="nixl-push-writer", daemon=True
    )
    w._push_writer_thread.start()
    return w


def one(w: Any, receiver: Any, arm: str, i: int) -> tuple[float, float]:
    from pdctl.connector import lifecycle as lc

    msg = lc.encode(lc.FAILED, f"cmpl-bench-{arm}-{i}")
    t0 = time.perf_counter()
    if arm == "caller":
        w._send_now(ENGINE, msg)
    else:
        w._send_to_engine(ENGINE, msg)
    t1 = time.perf_counter()
    deadline = t0 + 5
    while time.perf_counter() < deadline:
        got = [m for ms in receiver.get_new_notifs().values() for m in ms]
        if msg in got:
            return t1 - t0, time.perf_counter() - t0
    raise RuntimeError(f"{arm}: notification {i} not delivered in 5 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=200, help="notifications per arm per round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sender, receiver, peer = agents()
    w = lifecycle_worker(sender, peer)
    arms = ("caller", "writer")
    per: dict[str, dict[str, list[float]]] = {a: {"call_us": [], "deliver_us": []} for a in arms}
    for i in range(10):  # warm-up: connect the endpoints
        one(w, receiver, "caller", -i - 1)
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            calls, delivered = [], []
            for i in range(args.count):
                c, d = one(w, receiver, arm, r * args.count + i)
                calls.append(c * 1e6)
                delivered.append(d * 1e6)
            per[arm]["call_us"].append(statistics.median(calls))
            per[arm]["deliver_us"].append(statistics.median(delivered))
    w._push_writer_stop.set()
    w._push_writer_wake.set()
    record: dict[str, Any] = {"rounds": args.rounds, "count": args.count, "arms": {}}
    for arm in arms:
        record["arms"][arm] = {k: statistics.median(v) for k, v in per[arm].items()}
        record["arms"][arm]["per_round"] = per[arm]
        a = record["arms"][arm]
        call, deliver = a["call_us"], a["deliver_us"]
        print(f"{arm:7s} engine-thread call {call:8.1f} us, delivered {deliver:8.1f} us")
    c, wr = record["arms"]["caller"], record["arms"]["writer"]
    record["ratio_call"] = wr["call_us"] / c["call_us"]
    record["ratio_deliver"] = wr["deliver_us"] / c["deliver_us"]
    print(
        f"writer / caller: engine-thread call x{record['ratio_call']:.2f}, "
        f"delivery x{record['ratio_deliver']:.2f} (medians of {args.rounds} round medians)"
    )
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
