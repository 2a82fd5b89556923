"""Restart policy and liveness, as pure state machines (the caller passes the clock).

:class:`RestartTracker` decides, each time an instance fails, whether to restart it and
after how long; :class:`Liveness` decides when an API server that was ready has lost its
engine while its HTTP server stays up. The local supervisor and the Ray actor both drive
them, so the two backends restart by the same rules.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdctl.sdk.spec import RestartMode

if TYPE_CHECKING:
    from pdctl.sdk.fleetplan import InstancePlan
    from pdctl.sdk.spec import FleetSpec, InstanceGroup, RenderGroup

MAX_BACKOFF_S = 60.0
"""No restart waits longer than this, however many came before it."""


@dataclass(frozen=True)
class RestartPolicy:
    mode: RestartMode = "on-failure"
    backoff_s: float = 1.0
    max_restarts: int = 5
    window_s: float = 300.0

    @classmethod
    def for_plan(cls, spec: FleetSpec, plan: InstancePlan) -> RestartPolicy:
        """The policy of the group ``plan`` belongs to (the router: the defaults)."""
        g: InstanceGroup | RenderGroup
        if plan.group_role == "prefill":
            g = spec.prefill[plan.group_index]
        elif plan.group_role == "decode":
            g = spec.decode[plan.group_index]
        elif plan.group_role == "render":
            g = spec.render[plan.group_index]
        else:
            return cls()
        return cls(g.restart, g.restart_backoff_s, g.max_restarts, g.restart_window_s)

    def describe(self) -> str:
        if self.mode == "never":
            return "never"
        return f"on-failure (max {self.max_restarts} in {self.window_s:g} s)"


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float
    message: str


class RestartTracker:
    """Counts the restarts the policy made inside its sliding window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._restarts: deque[float] = deque()

    def in_window(self, now: float) -> int:
        while self._restarts and now - self._restarts[0] >= self.policy.window_s:
            self._restarts.popleft()
        return len(self._restarts)

    def on_failure(self, now: float) -> Decision:
        """An instance failed at ``now``: restart it (after ``delay_s``) or give up."""
        p = self.policy
        if p.mode == "never":
            return Decision(False, 0.0, "restart policy is 'never': left exited")
        n = self.in_window(now)
        if n >= p.max_restarts:
            return Decision(
                False,
                0.0,
                f"crash loop: {n} restarts in {p.window_s:g} s; restart policy gave up "
                "(see the log; `pdctl restart` tries again)",
            )
        delay = min(MAX_BACKOFF_S, p.backoff_s * 2**n)
        self._restarts.append(now)
        return Decision(True, delay, f"restart {n + 1}/{p.max_restarts} in {delay:g} s")

    def reset(self) -> None:
        """An operator restarted the instance: the crash-loop count starts again."""
        self._restarts.clear()


ERRORS_TO_FAIL = 3
"""Consecutive 5xx answers to /health after which a ready API server counts as dead."""
SILENT_S_TO_FAIL = 30.0
"""Seconds without any answer to /health after which a ready instance counts as dead."""


class Liveness:
    """Watches ``/health`` of an instance that has been ready.

    vLLM answers 5xx once its engine is dead (or keeps HTTP up without one); a busy
    CPU server may be slow to answer, so silence only counts after ``silent_s``. With
    ``http_errors_are_fatal=False`` (the router, whose /health is 503 while it has no
    healthy upstream) only silence counts.
    """

    def __init__(
        self,
        *,
        errors_to_fail: int = ERRORS_TO_FAIL,
        silent_s: float = SILENT_S_TO_FAIL,
        http_errors_are_fatal: bool = True,
    ) -> None:
        self.errors_to_fail = errors_to_fail
        self.silent_s = silent_s
        self.http_errors_are_fatal = http_errors_are_fatal
        self._errors = 0
        self._last_answer: float | None = None

    def reset(self, now: float) -> None:
        self._errors = 0
        self._last_answer = now

    def observe(self, status: int | None, now: float) -> str | None:
        """One health check's status (``None``: no answer); returns why the instance is dead, or
        None while it is alive."""
        if self._last_answer is None:
            self._last_answer = now
        if status is None:
            silent = now - self._last_answer
            if silent >= self.silent_s:
                return f"/health has not answered for {silent:.0f} s"
            return None
        self._last_answer = now
        if status >= 500 and self.http_errors_are_fatal:
            self._errors += 1
            if self._errors >= self.errors_to_fail:
                return f"/health answered {status} {self._errors} times in a row (engine dead)"
            return None
        self._errors = 0
        return None
