"""What a request takes and gives back exactly once: a :class:`Lease` on an upstream
slot, and a :class:`Reservation` of its tenant's rate-limit budget.

A lease is one leg counted in its instance's ``outstanding``.

The slot is taken when the lease is made and given back exactly once, by whichever
comes first: leaving its ``async with`` (normally, by an exception, or cancelled), an
explicit :meth:`Lease.release`, or — for a reply streamed through — the stream being
closed, finished or never started (:class:`pdctl.sdk.router.replies.StreamReply`
releases it too). Releasing also lets the response go: its connection returns to the pool
when it was read to the end, and is closed otherwise (which makes vLLM abort the request).

A leg whose response outlives the code that sent it (decode's, relayed later) is passed on
with :meth:`Lease.hand_over`: the new lease holds the slot, the old one no longer does,
so the ``async with`` around the send cannot release what the relay still uses.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from pdctl.sdk.router.httpclient import Response
from pdctl.sdk.router.instances import Upstream


class Lease:
    """One slot on ``upstream`` (and, once it came, the response holding it)."""

    __slots__ = ("_held", "response", "upstream")

    def __init__(self, upstream: Upstream, response: Response | None = None) -> None:
        self.upstream = upstream
        self.response = response
        upstream.outstanding += 1
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    @property
    def status(self) -> int:
        assert self.response is not None
        return self.response.status

    def release(self) -> None:
        """Give the slot back (and let the response go). Idempotent."""
        if self._held:
            self._held = False
            self.upstream.outstanding -= 1
            if self.response is not None:
                self.response.release()

    def hand_over(self, response: Response) -> Lease:
        """A lease holding this slot with ``response``; this one stops holding it."""
        if not self._held:
            raise RuntimeError(f"lease on {self.upstream.name} was already released")
        new = Lease.__new__(Lease)
        new.upstream, new.response, new._held = self.upstream, response, True
        self._held = False
        return new

    async def read(self) -> bytes:
        """The whole response body; the slot is given back whatever happens."""
        assert self.response is not None
        try:
            return await self.response.read()
        finally:
            self.release()

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Bucket(Protocol):
    """A token bucket a reservation charged (:class:`pdctl.sdk.router.limits.TokenBucket`)."""

    def give(self, amount: float) -> None: ...
    def take(self, amount: float) -> None: ...


class Reservation:
    """What one admitted request holds; :meth:`settle` exactly once (later calls do
    nothing), also as ``with reservation:`` (settles with :attr:`used`)."""

    def __init__(
        self,
        tenant: str,
        tokens: float,
        charges: list[tuple[Bucket, float]],
        meter: Callable[[str, float], None],
    ) -> None:
        self.tenant, self.tokens = tenant, tokens
        self.charges = charges
        """(bucket, tokens reserved in it): the token buckets, settled from usage."""
        self.used: float | None = None
        self._meter = meter
        self._settled = False

    def settle(self, used: float | None) -> None:
        """Correct the token buckets to ``used`` tokens (None: keep what was reserved)."""
        if self._settled:
            return
        self._settled = True
        spent = self.tokens if used is None else used
        for bucket, reserved in self.charges:
            if spent <= reserved:
                bucket.give(reserved - spent)
            else:
                bucket.take(spent - reserved)
        self._meter(self.tenant, spent)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.settle(self.used)
