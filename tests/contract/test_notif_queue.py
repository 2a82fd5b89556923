"""pdctl holds vLLM's writer → engine notification queue (``pdctl.connector.notifq``)
after converting it in place when the connector takes over the push worker: on both vLLM
versions the queue is created in the worker's ``__init__`` (before pdctl's conversion),
the ``nixl-push-writer`` thread starts only in ``register_kv_caches`` (after it), the
writer loop is what puts into the queue and ``_get_new_notifs`` what takes from it."""

from __future__ import annotations


def test_the_queue_exists_before_pdctl_converts_it_and_the_writer_starts_after(vllm):
    got = vllm["answers"]["notif_queue"]
    v = vllm["version"]
    assert got["assigned_in"] == {"__init__": "queue.Queue()"}, f"vLLM {v}: {got}"
    assert got["writer_started_in"] == ["register_kv_caches"], f"vLLM {v}: {got}"
    assert got["put_in"] == ["_push_writer_loop"], f"vLLM {v}: {got}"
    assert got["taken_in"] == ["_get_new_notifs"], f"vLLM {v}: {got}"
