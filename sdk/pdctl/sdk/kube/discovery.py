"""Pods found by label selectors and followed as they come and go.

:class:`PodDiscovery` lists each role's pods once (:meth:`~PodDiscovery.start`: an error
there is the caller's, e.g. RBAC), then keeps one watch per selector from the list's
resourceVersion. Watch events update the pods in place; a watch the server ends is
resumed from the last resourceVersion seen (bookmarks included); 410 Gone (the version
fell out of the server's window) lists again; a dropped connection or an API server that
is gone is retried with backoff while the last known pods stay, and said in
:attr:`~PodDiscovery.problem`. :meth:`~PodDiscovery.endpoints` is what to scrape now.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.kube import pods
from pdctl.sdk.kube.api import KubeAPI, KubeGone
from pdctl.sdk.kube.config import KubeError
from pdctl.sdk.kube.pods import PortHint
from pdctl.sdk.kube.selector import Selector

ROLE_ORDER = {"prefill": 0, "decode": 1, "colocated": 2, "router": 3}


@dataclass(frozen=True)
class Rule:
    role: str
    selector: Selector


@dataclass(frozen=True)
class Endpoint:
    name: str
    role: str
    url: str


class PodDiscovery:
    """The pods of ``namespace`` that ``rules`` select, as endpoints per role."""

    def __init__(
        self,
        api: KubeAPI,
        namespace: str,
        rules: Sequence[Rule],
        hint: PortHint | None = None,
        *,
        watch_timeout_s: int = 300,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        if not rules:
            raise KubeError("no label selector: give a preset or a selector per role")
        self.api = api
        self.namespace = namespace
        self.rules = list(rules)
        self.hint = hint or PortHint()
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._pods: list[dict[str, dict[str, Any]]] = [{} for _ in self.rules]
        self._problems: dict[int, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.lists = 0
        """Lists made (one per selector at start, one more per relist)."""
        self.relists = 0
        """Lists made again after 410 Gone."""
        self.events = 0
        self.changed = asyncio.Event()
        """Set at every change of the pods (tests and UIs wait on it; clear it yourself)."""

    async def start(self) -> None:
        """List every selector's pods (raising what the API server refused), then
        follow each with a watch. Later calls do nothing."""
        if self._started:
            return
        versions = await asyncio.gather(*(self._list(i) for i in range(len(self.rules))))
        self._started = True
        self._tasks = [
            asyncio.create_task(self._follow(i, rv), name=f"pdctl-k8s-watch-{i}")
            for i, rv in enumerate(versions)
        ]

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        await self.api.aclose()

    # ------------------------------------------------------------------ following

    async def _list(self, i: int) -> str:
        items, rv = await self.api.list_pods(self.namespace, str(self.rules[i].selector))
        self._pods[i] = {pods.uid(p): p for p in items}
        self.lists += 1
        self._mark()
        return rv

    def _event(self, i: int, event: dict[str, Any]) -> str | None:
        obj = event.get("object")
        if not isinstance(obj, dict):
            return None
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        kind = event.get("type")
        if kind in ("ADDED", "MODIFIED"):
            self._pods[i][pods.uid(obj)] = obj
        elif kind == "DELETED":
            self._pods[i].pop(pods.uid(obj), None)
        if kind != "BOOKMARK":
            self.events += 1
            self._mark()
        return str(rv) if rv else None

    async def _follow(self, i: int, rv: str | None) -> None:
        backoff = self.backoff_s
        sel = str(self.rules[i].selector)
        while True:
            t0, seen = time.monotonic(), 0
            try:
                if rv is None:
                    rv = await self._list(i)
                    self.relists += 1
                    self._clear(i)
                async for event in self.api.watch_pods(
                    self.namespace, sel, rv, timeout_s=self.watch_timeout_s
                ):
                    rv = self._event(i, event) or rv
                    seen += 1
                    self._clear(i)
                    backoff = self.backoff_s
                if seen or time.monotonic() - t0 >= 1.0:
                    continue  # the server ended the watch (its timeout): resume at rv
                raise KubeError(f"the API server ended the watch of {sel!r} at once")
            except KubeGone:
                rv = None  # too old: list again, at once
                continue
            except KubeError as e:
                self._problems[i] = f"watch of {self.rules[i].role} pods ({sel}): {e}"
                self._mark()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _clear(self, i: int) -> None:
        if self._problems.pop(i, None) is not None:
            self._mark()

    def _mark(self) -> None:
        self.changed.set()

    # ------------------------------------------------------------------ reading

    @property
    def problem(self) -> str | None:
        """What keeps the pods from being current (the last known are kept), if anything."""
        return "; ".join(dict.fromkeys(self._problems.values())) or None

    def _classified(self) -> list[tuple[str, dict[str, Any]]]:
        """(role, pod) for every pod, each in the first rule's role that selects it."""
        taken: set[str] = set()
        out: list[tuple[str, dict[str, Any]]] = []
        for rule, seen in zip(self.rules, self._pods, strict=True):
            for key, pod in seen.items():
                if key not in taken:
                    taken.add(key)
                    out.append((rule.role, pod))
        return out

    def endpoints(self) -> list[Endpoint]:
        """The Ready pods, as (pod name, role, URL), by role then name."""
        out = [
            Endpoint(pods.name(p), role, pods.url_of(p, self.hint))
            for role, p in self._classified()
            if pods.not_ready(p) is None
        ]
        out.sort(key=lambda e: (ROLE_ORDER.get(e.role, 2), e.name))
        return out

    def waiting(self) -> dict[str, str]:
        """Pods selected but not (yet, or no longer) instances: name → why."""
        return {
            pods.name(p): why
            for _, p in self._classified()
            if (why := pods.not_ready(p)) is not None
        }
