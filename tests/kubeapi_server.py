"""A loopback HTTP server that speaks the Kubernetes API server's pods list and watch.

What it answers is the wire format of kube-apiserver (``k8s.io/apiserver`` handlers,
``k8s.io/apimachinery`` types): ``GET /api/v1/namespaces/NS/pods`` with
``labelSelector``, ``limit`` and ``continue`` answers a ``PodList``; with ``watch=1``,
``resourceVersion`` and ``allowWatchBookmarks`` it answers 200 with
``Transfer-Encoding: chunked`` and one JSON event per line (``ADDED``, ``MODIFIED``,
``DELETED``, ``BOOKMARK``), ``ERROR`` with a 410 ``Status`` for a version older than its
window, and ends at ``timeoutSeconds``. Failures are ``Status`` objects with the real
server's reasons and messages (401 ``Unauthorized``, 403 ``Forbidden`` naming the user,
verb and resource). Its own label matching is written apart from the SDK's parser, so a
bug there is not hidden here. Hooks let a test add, change and delete pods, drop every
watch connection, and compact the event history.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

Obj = dict[str, Any]
_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")


def _match(selector: str, labels: dict[str, str]) -> bool:
    for part in re.split(r",(?![^()]*\))", selector) if selector else []:
        part = part.strip()
        m = re.fullmatch(r"(\S+?)\s+(in|notin)\s+\((.*)\)", part)
        if m:
            vals = {v.strip() for v in m[3].split(",")}
            inside = labels.get(m[1]) in vals
            if (m[2] == "in") != inside:
                return False
            continue
        m = re.fullmatch(r"(\S+?)\s*(==|=|!=)\s*(\S*)", part)
        if m:
            eq = labels.get(m[1]) == m[3]
            if (m[2] != "!=") != eq:
                return False
            continue
        if part.startswith("!"):
            if part[1:] in labels:
                return False
        elif part not in labels:
            return False
    return True


def status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def pod(
    name: str,
    labels: dict[str, str],
    *,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    containers: list[Obj] | None = None,
) -> Obj:
    """A pod object as the API server returns it (the fields discovery reads and more)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": f"uid-{name}",
            "labels": dict(labels),
            "creationTimestamp": "2026-12-02T00:00:00Z",
        },
        "spec": {
            "containers": containers
            or [{"name": "vllm", "image": "vllm", "ports": [{"containerPort": 8000}]}],
            "nodeName": "node-1",
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"}
                | ({} if ready else {"reason": "ContainersNotReady"}),
            ],
        },
    }


class _Server(ThreadingHTTPServer):
    ssl_context: Any = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        # the TLS handshake in the connection's own thread: a client that never finishes
        # it must not block accepting the others (nor shutting down)
        if self.ssl_context is not None:
            request.settimeout(5.0)
            request = self.ssl_context.wrap_socket(request, server_side=True)
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer (the tests cut connections on purpose)


class FakeKubeAPI:
    """``with FakeKubeAPI() as api:`` serves on ``api.url`` until the block ends."""

    def __init__(
        self,
        token: str = "good-token",
        namespace: str = "llm",
        *,
        tls: dict[str, str] | None = None,
    ) -> None:
        """``tls``: ``cert``, ``key`` (the server's) and optionally ``client_ca``: a
        verified client certificate then authenticates without a token, as the real
        server's x509 authenticator does."""
        self.token = token
        self.user = f"system:serviceaccount:{namespace}:pdctl"
        self.allowed = {"list", "watch", "get"}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.log: list[tuple[int, str, Obj]] = []
        self.rv = 1000
        self.floor = 0
        self.bookmark_s = 0.2
        self.gone_as_status = False  # answer 410 as the HTTP status (older servers)
        self.split_events = True  # cut each event across two chunks
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.cond = threading.Condition()
        self._socks: set[socket.socket] = set()
        self.page_limit_cap: int | None = None
        handler = self._handler()
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if tls is not None:
            import ssl

            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(tls["cert"], tls["key"])
            if tls.get("client_ca"):
                ctx.load_verify_locations(tls["client_ca"])
                ctx.verify_mode = ssl.CERT_OPTIONAL
            self.httpd.ssl_context = ctx
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ test hooks

    def _bump(self, kind: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def add(self, obj: Obj, namespace: str = "llm") -> None:
        with self.cond:
            obj = copy.deepcopy(obj)
            self.pods[(namespace, obj["metadata"]["name"])] = obj
            self._bump("ADDED", obj)

    def modify(self, name: str, fn: Any, namespace: str = "llm") -> None:
        with self.cond:
            obj = self.pods[(namespace, name)]
            fn(obj)
            self._bump("MODIFIED", obj)

    def set_ready(self, name: str, ready: bool) -> None:
        def flip(p: Obj) -> None:
            for c in p["status"]["conditions"]:
                if c["type"] == "Ready":
                    c["status"] = "True" if ready else "False"

        self.modify(name, flip)

    def delete(self, name: str, namespace: str = "llm") -> None:
        with self.cond:
            obj = self.pods.pop((namespace, name))
            self._bump("DELETED", obj)

    def compact(self) -> None:
        """Forget the event history up to now (etcd compaction): older versions are 410."""
        with self.cond:
            self.floor = self.rv
            self.log.clear()

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (a proxy or server restart)."""
        with self.cond:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def open_watches(self) -> int:
        with self.cond:
            return len(self._socks)

    def watch_count(self) -> int:
        return sum(1 for p, q in self.requests if q.get("watch") == ["1"])

    # ------------------------------------------------------------------ HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:  # noqa: C901 - one class closing over api
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, code: int, doc: Obj) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                api.requests.append((u.path, q))
                m = _PATH.match(u.path)
                if not m:
                    self._json(
                        404,
                        status(404, "NotFound", "the server could not find the requested resource"),
                    )
                    return
                peer = getattr(self.connection, "getpeercert", lambda: None)()
                if not peer and self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._json(401, status(401, "Unauthorized", "Unauthorized"))
                    return
                ns = m[1]
                verb = "watch" if q.get("watch") in (["1"], ["true"]) else "list"
                if verb not in api.allowed:
                    msg = (
                        f'pods is forbidden: User "{api.user}" cannot {verb} resource "pods" '
                        f'in API group "" in the namespace "{ns}"'
                    )
                    self._json(403, status(403, "Forbidden", msg, {"kind": "pods"}))
                    return
                sel = q.get("labelSelector", [""])[0]
                if verb == "list":
                    self._list(ns, sel, q)
                else:
                    self._watch(ns, sel, q)

            def _list(self, ns: str, sel: str, q: dict[str, list[str]]) -> None:
                with api.cond:
                    items = [
                        copy.deepcopy(p)
                        for (n, _), p in sorted(api.pods.items())
                        if n == ns and _match(sel, p["metadata"].get("labels", {}))
                    ]
                    rv = str(api.rv)
                limit = int(q.get("limit", ["0"])[0]) or len(items) or 1
                if api.page_limit_cap:
                    limit = min(limit, api.page_limit_cap)
                start = int(q.get("continue", ["0"])[0] or 0)
                page = items[start : start + limit]
                meta: Obj = {"resourceVersion": rv}
                if start + limit < len(items):
                    meta["continue"] = str(start + limit)
                self._json(
                    200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}
                )

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _event(self, doc: Obj) -> None:
                data = json.dumps(doc).encode() + b"\n"
                if api.split_events and len(data) > 8:
                    cut = len(data) // 2
                    self._chunk(data[:cut])
                    self._chunk(data[cut:])
                else:
                    self._chunk(data)

            def _watch(self, ns: str, sel: str, q: dict[str, list[str]]) -> None:
                rv = int(q.get("resourceVersion", ["0"])[0] or 0)
                timeout = float(q.get("timeoutSeconds", ["1800"])[0])
                if rv < api.floor and api.gone_as_status:
                    self._json(
                        410, status(410, "Expired", f"too old resource version: {rv} ({api.floor})")
                    )
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                with api.cond:
                    api._socks.add(self.connection)
                try:
                    if rv < api.floor:
                        self._event(
                            {
                                "type": "ERROR",
                                "object": status(
                                    410, "Expired", f"too old resource version: {rv} ({api.floor})"
                                ),
                            }
                        )
                        self._chunk(b"")
                        return
                    self._stream(ns, sel, rv, time.monotonic() + timeout, q)
                    self._chunk(b"")
                except OSError:
                    pass
                finally:
                    with api.cond:
                        api._socks.discard(self.connection)

            def _stream(
                self, ns: str, sel: str, rv: int, end: float, q: dict[str, list[str]]
            ) -> None:
                bookmarks = q.get("allowWatchBookmarks") == ["true"]
                last_bm = time.monotonic()
                while time.monotonic() < end:
                    with api.cond:
                        out = [
                            (v, k, o)
                            for v, k, o in api.log
                            if v > rv and o["metadata"].get("namespace", ns) == ns
                        ]
                        if not out:
                            api.cond.wait(timeout=0.05)
                    for v, kind, obj in out:
                        rv = v
                        if _match(sel, obj["metadata"].get("labels", {})):
                            self._event({"type": kind, "object": obj})
                    if bookmarks and time.monotonic() - last_bm >= api.bookmark_s:
                        last_bm = time.monotonic()
                        self._event(
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": "Pod",
                                    "apiVersion": "v1",
                                    "metadata": {"resourceVersion": str(api.rv)},
                                },
                            }
                        )

        return Handler
