"""``pdctl audit``: every listener of a fleet, probed as an outsider would, with what
answers without credentials and the fix for each.

* :mod:`~pdctl.sdk.audit.model` — listeners, answers, findings, the verdict (pure).
* :mod:`~pdctl.sdk.audit.sockets` — what the OS shows listening (``/proc``; pure parsers).
* :mod:`~pdctl.sdk.audit.expected` — the launch plan's listeners, reconciled with the OS.
* :mod:`~pdctl.sdk.audit.vllmroutes` — vLLM's routes and how each is asked safely.
* :mod:`~pdctl.sdk.audit.probe` — the probes (HTTP, TCP, a unix socket's mode).
* :mod:`~pdctl.sdk.audit.run` — :func:`audit_local` and :func:`audit_plan`.
"""

from pdctl.sdk.audit.model import Answer, AuditReport, Finding, Listener, judge
from pdctl.sdk.audit.run import audit_local, audit_plan, running_spec

__all__ = [
    "Answer",
    "AuditReport",
    "Finding",
    "Listener",
    "audit_local",
    "audit_plan",
    "judge",
    "running_spec",
]
