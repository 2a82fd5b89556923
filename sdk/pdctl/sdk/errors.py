"""One exception hierarchy for everything the SDK raises on purpose.

Every message says what was wrong and what to do about it; front ends print
``str(error)`` and never a traceback.
"""

from __future__ import annotations


class PdctlError(Exception):
    """Base of every error pdctl raises deliberately."""

    exit_code: int = 2


class SpecError(PdctlError):
    """The fleet spec cannot be read or is not valid.

    ``problems`` holds one line per offending field so that front ends can list them
    (or emit them as JSON) instead of re-parsing the message.
    """

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"invalid fleet spec {source}:"]
        lines.extend(f"  {p}" for p in problems)
        super().__init__("\n".join(lines))


class SpecProblem:
    """One thing wrong with one field of a spec."""

    __slots__ = ("field", "fix", "message")

    def __init__(self, field: str, message: str, fix: str = "") -> None:
        self.field = field
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        where = self.field or "(top level)"
        text = f"{where}: {self.message}"
        return f"{text} — fix: {self.fix}" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message, "fix": self.fix}


class LintFailed(PdctlError):
    """Raised when an operation refuses to go on because the spec has lint errors."""


class LaunchError(PdctlError):
    """A fleet could not be started, or an operation on a running fleet failed."""


class FleetRunningError(LaunchError):
    """A fleet with this name is already running under another supervisor."""


class NotRunningError(PdctlError):
    """No fleet with this name is running."""


class RouterError(PdctlError):
    """A pdctl router could not be reached, or answered a request with an error.

    ``status`` is the HTTP status (None when the router was not reached) and
    ``message`` the router's own error message (or what went wrong on the way).
    """

    def __init__(self, text: str, *, status: int | None = None, message: str = "") -> None:
        super().__init__(text)
        self.status = status
        self.message = message or text


class AuditError(PdctlError):
    """``pdctl audit`` could not learn what a fleet listens on (no spec, no state)."""
