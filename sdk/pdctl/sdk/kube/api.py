"""The two calls the Kubernetes source makes, over HTTPS with httpx: list pods by label
selector (paged), and watch them from a resourceVersion.

The wire format is the API server's (``k8s.io/apimachinery/pkg/watch`` and
``pkg/apis/meta/v1``): a list answers a ``PodList`` with ``metadata.resourceVersion`` and
``metadata.continue``; a watch (``?watch=1&resourceVersion=RV&allowWatchBookmarks=true``)
answers 200 and then streams one JSON object per event, ``{"type": "ADDED" | "MODIFIED" |
"DELETED" | "BOOKMARK" | "ERROR", "object": ...}``, in chunks that need not end on an
event's boundary. An ``ERROR`` event carries a ``Status``; code 410 (``Expired``, "too old
resource version") means the watch cannot resume and the caller must list again. Errors
are read from the ``Status`` body the server sends with 401, 403 and the rest, and turned
into messages that say which verb on which resource was refused and how to grant it.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

from pdctl.sdk.kube.config import KubeConfig, KubeError

Obj = dict[str, Any]


class KubeUnreachable(KubeError):
    """No answer from the API server (refused, reset, timed out, TLS failed)."""


class KubeAuthError(KubeError):
    """401: the server does not accept the credentials."""


class KubeForbidden(KubeError):
    """403: authenticated, but RBAC refuses the verb on pods in the namespace."""


class KubeGone(KubeError):
    """410: the resourceVersion (or continue token) is too old; list again."""


def rbac_fix(namespace: str, subject: str) -> str:
    """The commands that grant what the source needs (see docs/sources.md, RBAC)."""
    if subject.startswith("system:serviceaccount:"):
        _, _, sa_ns, sa = subject.split(":", 3)
        who = f"--serviceaccount={sa_ns}:{sa}"
    elif subject and subject != "?":
        who = f"--user={subject}"
    else:
        who = "--user=YOU"
    return (
        f"kubectl -n {namespace} create role pdctl-observer --verb=get,list,watch "
        f"--resource=pods && kubectl -n {namespace} create rolebinding pdctl-observer "
        f"--role=pdctl-observer {who}"
    )


def _status_message(body: bytes) -> tuple[str, Obj]:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace").strip(), {}
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("reason") or ""), doc
    return "", {}


def _subject(message: str) -> str:
    """``User "system:serviceaccount:ns:sa" cannot ...`` → the quoted user."""
    marker = 'User "'
    i = message.find(marker)
    if i < 0:
        return "?"
    j = message.find('"', i + len(marker))
    return message[i + len(marker) : j] if j > 0 else "?"


class KubeAPI:
    """The API server of ``config``; one pooled HTTPS client for lists and watches."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        verify: ssl.SSLContext | bool = (
            config.ssl_context() if config.server.startswith("https://") else True
        )
        self._client = httpx.AsyncClient(
            base_url=config.server, verify=verify, transport=transport, trust_env=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _path(self, namespace: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods"

    def error(self, status: int, body: bytes, verb: str, namespace: str) -> KubeError:
        """The error for an answer ``status`` to ``verb`` pods in ``namespace``."""
        msg, doc = _status_message(body)
        where = f"the API server at {self.config.server} ({self.config.source})"
        if status == 401:
            self.config.forget_token()
            return KubeAuthError(
                f"{where} refused the credentials of {self.config.user} (401 Unauthorized"
                f"{': ' + msg if msg and msg != 'Unauthorized' else ''}): the token is "
                "expired or wrong; log in again (e.g. run any kubectl command to refresh "
                "it) or fix the kubeconfig's user"
            )
        if status == 403:
            subject = _subject(msg) if msg else "?"
            subject = subject if subject != "?" else self.config.user
            return KubeForbidden(
                f"{where}: {subject} may not {verb} pods in namespace {namespace!r} "
                f"(403 Forbidden: {msg or 'no message'}). pdctl needs get, list and watch "
                f"on pods there; grant them with a Role: {rbac_fix(namespace, subject)}"
            )
        if status == 410:
            return KubeGone(f"{verb} pods: {msg or '410 Gone'}")
        if status == 404 and not doc:
            return KubeError(
                f"{where} answered 404 to {self._path(namespace)} with no Status: is "
                f"{self.config.server} a Kubernetes API server?"
            )
        return KubeError(f"{where} answered {status} to {verb} pods in {namespace!r}: {msg}")

    async def list_pods(
        self, namespace: str, selector: str, *, limit: int = 500
    ) -> tuple[list[Obj], str]:
        """Every pod matching ``selector`` and the list's resourceVersion (paged)."""
        items: list[Obj] = []
        cont: str | None = None
        while True:
            params: dict[str, str | int] = {"labelSelector": selector, "limit": limit}
            if cont:
                params["continue"] = cont
            body = await self._get(namespace, params, "list")
            if not isinstance(body, dict) or not isinstance(body.get("items"), list):
                raise KubeError(
                    f"the API server at {self.config.server} answered a pod list that is "
                    "not a PodList (no items): is this a Kubernetes API server?"
                )
            items.extend(i for i in body["items"] if isinstance(i, dict))
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    async def _get(self, namespace: str, params: dict[str, str | int], verb: str) -> Any:
        for attempt in (0, 1):
            try:
                r = await self._client.get(
                    self._path(namespace),
                    params=params,
                    headers={
                        **self.config.headers(refresh=attempt == 1),
                        "Accept": "application/json",
                    },
                    timeout=self.timeout_s,
                )
            except httpx.HTTPError as e:
                raise self.unreachable(e) from None
            if r.status_code == 401 and attempt == 0 and self.config.exec_spec is not None:
                continue  # an exec plugin's token may have expired early: run it again
            if r.status_code != 200:
                raise self.error(r.status_code, r.content, verb, namespace)
            try:
                return r.json()
            except ValueError:
                raise KubeError(
                    f"the API server at {self.config.server} answered 200 with no JSON: "
                    "is this a Kubernetes API server?"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def unreachable(self, e: BaseException) -> KubeUnreachable:
        why = str(e) or type(e).__name__
        return KubeUnreachable(
            f"the Kubernetes API server at {self.config.server} did not answer ({why}); "
            f"is the cluster reachable from here (`kubectl cluster-info`) and is "
            f"{self.config.source} the right one (--k8s-kubeconfig, --k8s-context)?"
        )

    async def watch_pods(
        self, namespace: str, selector: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[Obj]:
        """The events after ``resource_version`` until the server ends the watch
        (``timeout_s``, server side). Raises :class:`KubeGone` on 410, whether the server
        answers it as the status or as an ``ERROR`` event."""
        params: dict[str, str | int] = {
            "labelSelector": selector,
            "watch": 1,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        # the read timeout catches a connection that went silent: the server sends a
        # bookmark about once a minute and ends the watch at timeout_s
        timeout = httpx.Timeout(self.timeout_s, read=timeout_s + 30.0)
        try:
            async with self._client.stream(
                "GET",
                self._path(namespace),
                params=params,
                headers={**self.config.headers(), "Accept": "application/json"},
                timeout=timeout,
            ) as r:
                if r.status_code != 200:
                    raise self.error(r.status_code, await r.aread(), "watch", namespace)
                async for event in decode_stream(r.aiter_bytes()):
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        code = obj.get("code") if isinstance(obj, dict) else None
                        body = json.dumps(obj).encode()
                        raise self.error(int(code or 500), body, "watch", namespace)
                    yield event
        except httpx.HTTPError as e:
            raise self.unreachable(e) from None


async def decode_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[Obj]:
    """JSON objects one after another (newlines between them or not), from chunks cut
    anywhere, multi-byte characters included."""
    import codecs

    dec = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buf = ""
    async for chunk in chunks:
        buf += utf8.decode(chunk)
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos >= len(buf):
                break
            if buf[pos] != "{":
                raise KubeError(f"the watch stream is not JSON events: {buf[pos : pos + 80]!r}")
            try:
                obj, end = dec.raw_decode(buf, pos)
            except ValueError:
                if len(buf) - pos > 16 * 1024 * 1024:
                    raise KubeError("a watch event over 16 MiB that is not JSON") from None
                break  # incomplete: wait for the next chunk
            if not isinstance(obj, dict):
                raise KubeError(f"a watch event that is not a JSON object: {obj!r:.80}")
            yield obj
            pos = end
        buf = buf[pos:]
    if buf.strip():
        raise KubeError(f"the watch ended inside an event: {buf.strip()[:80]!r}")
