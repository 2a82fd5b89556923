"""Failpoints of pdctl's push connector, for the chaos suite only.

Set in ``kv_connector_extra_config`` (``fleet.connector_options``); off by default and
refused by lint rule PD042 outside tests (``PDCTL_ALLOW_FAILPOINTS=1``).

* ``pdctl_failpoint_write``: ``"fail"`` (every push WRITE) or ``"match:<text>"``
  (requests whose id contains ``<text>``) makes the WRITE submission fail inside NIXL's
  ``transfer`` call, so vLLM's own error path runs.
* ``pdctl_failpoint_write_delay``: ``"<ms>"`` (every WRITE), ``"<ms>:match:<text>"`` or
  ``"<ms>:while:<path>"`` (while that file exists: a test switches it on and off on a
  running fleet) holds a matched WRITE back for ``<ms>`` milliseconds after prefill
  finished — the window in which the chaos suite kills prefill (or decode) between
  "prefill finished" and the WRITE. The writer thread is not blocked: the WRITE goes back
  to vLLM's deferred-push queue when the delay ends, and is dropped if the request's
  lease was released meanwhile.
* ``pdctl_failpoint_side_channel``: ``"refused"`` or ``"blackholed"``, optionally
  ``":while:<path>"`` (a switch file holding ``refused`` or ``blackholed`` picks that
  mode). On a decode, cuts it off from every prefill: its registrations
  fail as a handshake to an unreachable side channel does (at once when refused, after
  vLLM's 5 s handshake timeout when blackholed), and its release messages are dropped.
  What is left to free the prefill's KV is what does not cross the side channel (the
  router's release requests).

* ``pdctl_failpoint_kv_corrupt``: ``"swap"`` or ``"flip"``, optionally followed by
  ``":every:<n>"`` (the n-th, 2n-th, ... verified WRITE) or ``":match:<text>"``
  (requests whose id contains ``<text>``). ``swap`` (on a prefill) misplaces: the WRITE
  sends its first two blocks into each other's destination slots (the class of bug of
  vLLM #48633 C3: right bytes, wrong blocks); ``flip`` (on a decode) flips one byte of
  one block the WRITE delivered, before the digest check. Both act only on requests the
  digest check samples (:mod:`pdctl.connector.kvverify`), so every corruption it makes
  is one the check must catch. ``zero`` (on a decode) zeroes the first block a WRITE
  delivered, in every layer, on every request it selects whether or not the check
  samples it: with the check off (``pdctl_kv_verify_rate = 0``) the decode generates
  from that KV, which is what the router's output canary must see
  (:mod:`pdctl.sdk.router.canary`).

Pure Python (no vLLM, no NIXL).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAILPOINT_WRITE = "pdctl_failpoint_write"
FAILPOINT_WRITE_DELAY = "pdctl_failpoint_write_delay"
FAILPOINT_SIDE_CHANNEL = "pdctl_failpoint_side_channel"
FAILPOINT_KV_CORRUPT = "pdctl_failpoint_kv_corrupt"
HANDSHAKE_TIMEOUT_S = 5.0
"""vLLM's side-channel handshake timeout (its ZMQ receive timeout): how long a blackholed
side channel takes to fail."""


def failpoint_match(spec: str) -> str:
    """The request-id substring a failpoint value selects (``""``: every request)."""
    if spec == "fail":
        return ""
    if spec.startswith("match:") and len(spec) > len("match:"):
        return spec[len("match:") :]
    raise ValueError(
        f"kv_connector_extra_config.{FAILPOINT_WRITE} = {spec!r}: use 'fail' (every WRITE) "
        "or 'match:<text>' (requests whose id contains <text>)"
    )


@dataclass(frozen=True)
class WriteDelay:
    """``pdctl_failpoint_write_delay``: how long, and which WRITEs."""

    seconds: float
    match: str = ""
    while_path: str = ""

    @classmethod
    def parse(cls, spec: str) -> WriteDelay:
        ms, _, sel = str(spec).strip().partition(":")
        try:
            seconds = float(ms) / 1000.0
        except ValueError:
            seconds = -1.0
        kind, _, arg = sel.partition(":")
        if seconds <= 0 or (sel and (kind not in ("match", "while") or not arg)):
            raise ValueError(
                f"kv_connector_extra_config.{FAILPOINT_WRITE_DELAY} = {spec!r}: use '<ms>', "
                "'<ms>:match:<text>' or '<ms>:while:<path>' (milliseconds > 0)"
            )
        return cls(seconds, arg if kind == "match" else "", arg if kind == "while" else "")

    def applies(self, request_id: str) -> bool:
        if self.while_path and not os.path.exists(self.while_path):
            return False
        return self.match in request_id


@dataclass(frozen=True)
class SideChannelCut:
    """``pdctl_failpoint_side_channel``: how decode's side channel to prefills fails."""

    blackholed: bool
    while_path: str = ""

    @classmethod
    def parse(cls, spec: str) -> SideChannelCut:
        mode, _, sel = str(spec).strip().partition(":")
        kind, _, path = sel.partition(":")
        if mode not in ("refused", "blackholed") or (sel and (kind != "while" or not path)):
            raise ValueError(
                f"kv_connector_extra_config.{FAILPOINT_SIDE_CHANNEL} = {spec!r}: use "
                "'refused' or 'blackholed', optionally followed by ':while:<path>'"
            )
        return cls(mode == "blackholed", path)

    def fails_after_s(self) -> float | None:
        """None while the cut is off; else how long a registration takes to fail (0:
        refused at once; vLLM's handshake timeout: blackholed). A switch file holding
        ``refused`` or ``blackholed`` picks that mode instead of the configured one."""
        blackholed = self.blackholed
        if self.while_path:
            try:
                with open(self.while_path) as f:
                    said = f.read().strip()
            except OSError:
                return None
            blackholed = {"refused": False, "blackholed": True}.get(said, blackholed)
        return HANDSHAKE_TIMEOUT_S if blackholed else 0.0


@dataclass
class KvCorrupt:
    """``pdctl_failpoint_kv_corrupt``: which corruption, and of which WRITEs."""

    mode: str  # swap | flip | zero
    every: int = 1
    match: str = ""
    seen: int = 0

    @classmethod
    def parse(cls, spec: str) -> KvCorrupt:
        mode, _, sel = str(spec).strip().partition(":")
        kind, _, arg = sel.partition(":")
        every = 1
        ok = mode in ("swap", "flip", "zero") and (not sel or (kind in ("every", "match") and arg))
        if ok and kind == "every":
            every = int(arg) if arg.isdigit() else 0
            ok = every >= 1
        if not ok:
            raise ValueError(
                f"kv_connector_extra_config.{FAILPOINT_KV_CORRUPT} = {spec!r}: use 'swap' "
                "(prefill), 'flip' or 'zero' (decode), optionally followed by ':every:<n>' "
                "(n >= 1) or ':match:<text>'"
            )
        return cls(mode, every, arg if kind == "match" else "")

    def _hit(self, request_id: str) -> bool:
        if self.match:
            return self.match in request_id
        self.seen += 1
        return self.seen % self.every == 0

    def swaps(self, request_id: str) -> bool:
        """Prefill: whether this WRITE misplaces two blocks (counts the WRITE)."""
        return self.mode == "swap" and self._hit(request_id)

    def flips(self, request_id: str) -> bool:
        """Decode: whether a byte of this request's KV is flipped (counts the request)."""
        return self.mode == "flip" and self._hit(request_id)

    def zeroes(self, request_id: str) -> bool:
        """Decode: whether a block of this request's KV is zeroed (counts the request)."""
        return self.mode == "zero" and self._hit(request_id)


def failing_transfer(
    transfer: Callable[..., Any], writing: Callable[[], str], match: str
) -> Callable[..., Any]:
    """NIXL's ``transfer`` refusing the WRITE of a request whose id contains ``match``
    (``writing()``: the request whose WRITE the writer thread is posting)."""

    def maybe_fail(*args: Any, **kw: Any) -> Any:
        if match in writing():
            raise RuntimeError(f"pdctl failpoint {FAILPOINT_WRITE}: WRITE refused")
        return transfer(*args, **kw)

    return maybe_fail
