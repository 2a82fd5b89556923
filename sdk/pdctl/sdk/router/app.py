"""The router's HTTP face: a bare ASGI app (no framework on the hot path).

Endpoints: ``POST /v1/completions`` and ``/v1/chat/completions`` (JSON or SSE),
``GET /v1/models``, ``/health``, ``/ready`` (200 once every role was found healthy after
start, then for good: a Kubernetes readiness probe), ``/metrics`` and
``/v1/pdctl/requests``; operator
control: ``GET /v1/pdctl/state`` (mode, per-instance in-flight legs and drained flags),
``POST /v1/pdctl/drain`` ``{"instance": NAME, "drain": true|false}`` and
``POST /v1/pdctl/mode`` ``{"mode": MODE}``, ``POST /v1/pdctl/policy``
``{"policy": POLICY}`` (cache_aware only where the router was started with it) and
``POST /v1/pdctl/instance``
``{"instance": NAME, "event": "up"|"down"}`` (the supervisor's word that an instance was
restarted and is ready, or stopped/failed: no waiting for the next health check),
``POST /v1/pdctl/admission`` (admission limits and thresholds: :mod:`.admission`) and
``GET /v1/pdctl/audit`` (the audit log's recent entries).
Who may call what is the :class:`~pdctl.sdk.router.guard.Guard`'s: inference endpoints
need a key once any is configured, everything under ``/v1/pdctl/`` an admin key once one
is; keys are compared in constant time and never logged; completions pass the tenant's
and key's rate limits (429 with ``Retry-After``), then admission control (a bounded
priority queue; :mod:`.admission`, with the request's terms from :mod:`.terms`) and, when
it has one, a first-byte deadline (:mod:`.deadline`); control actions and refused keys go
to the audit log.
Errors use OpenAI's shape. The request body is capped (413) and a client that
disconnects cancels both legs (told by the router's server through the scope's
:data:`~pdctl.sdk.router.hardening.GONE` extension, else by the ASGI ``http.disconnect``).
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol
from urllib.parse import parse_qs

from pdctl.sdk.apikey import read_api_key
from pdctl.sdk.client.admission import ADMISSION_SETTINGS
from pdctl.sdk.fleetplan import priority_scheduling
from pdctl.sdk.router.admission import Admission
from pdctl.sdk.router.asgi import Message, Receive, Scope, Send
from pdctl.sdk.router.asgi import send_body as _send
from pdctl.sdk.router.asgi import send_error as _send_error
from pdctl.sdk.router.auth import KeyRing, Principal
from pdctl.sdk.router.core import Router
from pdctl.sdk.router.flightrec import FlightRecorder
from pdctl.sdk.router.gate import Gate
from pdctl.sdk.router.guard import Guard
from pdctl.sdk.router.hardening import json_too_deep
from pdctl.sdk.router.limits import Refusal
from pdctl.sdk.router.terms import pass_priority, terms_of
from pdctl.sdk.router.timeline import Timeline

DEFAULT_MAX_BODY = 8 * 1024 * 1024
_COMPLETION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
_CONTROL_ENDPOINTS = (
    "/v1/pdctl/drain",
    "/v1/pdctl/mode",
    "/v1/pdctl/instance",
    "/v1/pdctl/policy",
    "/v1/pdctl/admission",
)


def load_api_key(router: Router) -> bytes | None:
    """The key clients must present, from the spec's env var or file (never the spec)."""
    return read_api_key(router.settings.api_key)


class Cluster(Protocol):
    """The router's other workers, when it is one of several processes sharing the port
    (:mod:`pdctl.sdk.router.workers`): the merged views, and a control change carried to
    every worker before it is answered."""

    async def metrics(self) -> bytes: ...

    async def requests(
        self, limit: int, instance: str | None, outcome: str | None
    ) -> list[dict[str, Any]]: ...

    async def state(self) -> dict[str, Any]: ...

    async def audit(self) -> list[dict[str, Any]]: ...

    async def changed(self, setting: str, req: dict[str, Any]) -> dict[str, Any]: ...


class _BodyTooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


class RouterApp:
    """ASGI application over a :class:`Router`."""

    def __init__(
        self,
        router: Router,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        api_key: bytes | None = None,
        guard: Guard | None = None,
        share: float = 1.0,
    ) -> None:
        """``guard`` decides who may do what; without one, ``api_key`` (when given) is
        the one admin key, else nothing is guarded (a loopback-only router). ``share``:
        the part of the admission limits this process enforces (1/N of N workers)."""
        self.router = router
        adm = router.settings.admission
        self.admission: Admission | None = None
        """Admission control (:mod:`.admission`; None: router.admission.enabled = false)."""
        self.priority_scheduling = priority_scheduling(router.plan)
        """Every engine runs vLLM's priority scheduler: requests carry their class."""
        if adm.enabled:
            p, d = router.prefills, router.decodes
            self.admission = Admission(adm, p, d, router.registry, share=share)
        self.gate = Gate(router, self.admission)
        self.flights = FlightRecorder(router.upstreams)
        self.max_body = max_body
        if guard is None:
            ring = KeyRing.single(api_key) if api_key is not None else KeyRing()
            guard = Guard(ring, router.registry)
        self.guard = guard
        self.cluster: Cluster | None = None
        """The other workers (None: this process is the whole router)."""
        self._models = json.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": router.served_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "pdctl",
                    }
                ],
            }
        ).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        method, endpoint = scope["method"], scope["path"]
        verdict = self.guard.check(scope)
        if not verdict.ok:
            kind = "authentication_error" if verdict.status == 401 else "permission_error"
            await _send_error(send, verdict.status, verdict.message, kind)
            return
        who = verdict.principal
        if endpoint in _COMPLETION_ENDPOINTS:
            if method != "POST":
                await _send_error(send, 405, f"use POST for {endpoint}", "invalid_request_error")
                return
            await self._completion(scope, receive, send, endpoint, who)
            return
        if endpoint in _CONTROL_ENDPOINTS and method == "POST":
            ex = _Exchange(receive, send)
            await self._control(ex.receive, ex.send, endpoint)
            self.guard.control_done(who, scope, ex.request(), ex.status)
            return
        if method != "GET":
            await _send_error(
                send, 405, f"{method} is not allowed on {endpoint}", "invalid_request_error"
            )
            return
        if endpoint in ("/health", "/ready"):
            i = self.router.instances
            ok, why = i.health() if endpoint == "/health" else i.ready()
            await _send(send, 200 if ok else 503, json.dumps({"status": why}).encode())
        elif endpoint == "/metrics":
            c = self.cluster
            text = self.router.registry.expose() if c is None else await c.metrics()
            await _send(send, 200, text, [(b"content-type", b"text/plain; version=0.0.4")])
        elif endpoint == "/v1/models":
            await _send(send, 200, self._models)
        elif endpoint == "/v1/pdctl/audit":
            c = self.cluster
            entries = list(self.guard.audit.recent)[::-1] if c is None else await c.audit()
            await _send(send, 200, json.dumps({"entries": entries}).encode())
        elif endpoint == "/v1/pdctl/requests":
            await self._requests(scope, send)
        elif endpoint == "/v1/pdctl/state":
            await _send(send, 200, json.dumps(await self.state()).encode())
        else:
            await _send_error(send, 404, f"no route {endpoint}", "not_found_error")

    # ------------------------------------------------------------------ endpoints

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await self.router.start()
                if self.admission is not None:
                    self.admission.saturation.start(self.router.upstreams)
                    self.admission.loop_lag.start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self.admission is not None:
                    await self.admission.saturation.stop()
                    await self.admission.loop_lag.stop()
                await self.router.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _requests(self, scope: Scope, send: Send) -> None:
        q = parse_qs(scope.get("query_string", b"").decode())
        try:
            limit = max(1, min(int(q.get("limit", ["100"])[0]), 10_000))
        except ValueError:
            await _send_error(send, 400, "limit must be an integer", "invalid_request_error")
            return
        inst = q.get("instance", [None])[0]
        outcome = q.get("outcome", [None])[0]
        c = self.cluster
        if c is None:
            found = await self.recent(limit, inst, outcome)
        else:
            found = await c.requests(limit, inst, outcome)
        await _send(send, 200, json.dumps({"mode": self.router.mode, "requests": found}).encode())

    async def recent(
        self, limit: int, instance: str | None = None, outcome: str | None = None
    ) -> list[dict[str, Any]]:
        """This process's ``limit`` most recent requests (on ``instance``, ending in
        ``outcome`` when given), newest first, their TTFT splits joined."""

        def match(t: Any) -> bool:
            return (instance is None or instance in (t.prefill, t.decode)) and (
                outcome is None or t.outcome == outcome
            )

        await self.flights.fill(list(self.router.history), time.perf_counter())
        return self.router.recent(limit, match)

    async def state(self) -> dict[str, Any]:
        """``/v1/pdctl/state``: this process's, or every worker's merged."""
        if self.cluster is None:
            return self.control_state()
        return await self.cluster.state()

    def control_state(self) -> dict[str, Any]:
        """This process's control state: the instance set's and the admission's."""
        adm = {"enabled": False} if self.admission is None else self.admission.state()
        return {**self.router.instances.control_state(), "admission": adm}

    def apply(self, setting: str, req: dict[str, Any]) -> tuple[int, str, str] | None:
        """Apply one control change (every worker applies the same one through here):
        ``admission`` to the admission control, the rest to the instance set."""
        if setting != "admission":
            return self.router.instances.apply(setting, req)
        if self.admission is None:
            return 409, "admission control is off (router.admission.enabled)", "conflict_error"
        return self.admission.apply(req)

    async def _control(self, receive: Receive, send: Send, endpoint: str) -> None:
        try:
            req = json.loads(await self._read_body(receive))
        except (_BodyTooLarge, _Disconnected, ValueError, RecursionError):
            req = None
        if not isinstance(req, dict):
            await _send_error(send, 400, "send a JSON object", "invalid_request_error")
            return
        setting = endpoint.rsplit("/", 1)[-1]
        refused = self.apply(setting, req)
        if refused is not None:
            await _send_error(send, *refused)
            return
        if self.cluster is None:
            await _send(send, 200, json.dumps(self.control_state()).encode())
            return
        # every worker has it before the answer (the parent's word on how many did)
        change = await self.cluster.changed(setting, req)
        answer = {**await self.cluster.state(), "change": change}
        await _send(send, 200, json.dumps(answer).encode())

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, endpoint: str, who: Principal | None
    ) -> None:
        t0 = time.perf_counter()
        try:
            raw = await self._read_body(receive)
        except _BodyTooLarge:
            await _send_error(
                send,
                413,
                f"request body larger than {self.max_body} bytes",
                "invalid_request_error",
            )
            return
        except _Disconnected:
            return
        body, problem = self._validate(raw, endpoint)
        if body is None:
            status = 404 if problem.startswith("model") else 400
            await _send_error(
                send,
                status,
                problem,
                "not_found_error" if status == 404 else "invalid_request_error",
            )
            return
        admitted = self.guard.limits.admit(who, body)
        if isinstance(admitted, Refusal):
            await _send_error(send, 429, admitted.message, "rate_limit_error", admitted.headers())
            self.guard.limits.meter.refusal_s.observe(time.perf_counter() - t0, admitted.tenant)
            return
        default_ms = self.router.settings.admission.default_deadline_ms
        terms = terms_of(scope["headers"], body, default_ms)
        tl: Timeline | None = None
        if isinstance(terms, str):
            admitted.settle(0.0)
            await _send_error(send, 400, terms, "invalid_request_error")
            return
        pass_priority(body, terms.klass, self.priority_scheduling)
        try:
            tl = await self.gate.serve(scope, receive, send, endpoint, body, terms, t0)
        finally:
            admitted.settle(0.0 if tl is None else _tokens_used(tl))

    async def _read_body(self, receive: Receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _Disconnected
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _BodyTooLarge
            parts.append(chunk)
            if not msg.get("more_body"):
                return b"".join(parts)

    def _validate(self, raw: bytes, endpoint: str) -> tuple[dict[str, Any] | None, str]:
        depth = self.router.settings.http.max_json_depth
        try:
            body = json.loads(raw)
        except ValueError as e:
            return None, f"request body is not valid JSON: {e}"
        except RecursionError:
            return None, f"request body nests deeper than {depth} levels"
        # nesting n deep takes n opening brackets: a body with no more is not walked
        if raw.count(b"[") + raw.count(b"{") > depth and json_too_deep(body, depth):
            return None, f"request body nests deeper than {depth} levels"
        if not isinstance(body, dict):
            return None, "request body must be a JSON object"
        model = body.get("model")
        if model is None:
            body["model"] = self.router.served_name
        elif not isinstance(model, str):
            return None, "'model' must be a string"
        elif model != self.router.served_name:
            return (
                None,
                f"model {model!r} does not exist; this fleet serves {self.router.served_name!r}",
            )
        if endpoint.endswith("/chat/completions"):
            if not isinstance(body.get("messages"), list) or not body["messages"]:
                return None, "'messages' must be a non-empty list"
        elif not isinstance(body.get("prompt"), str | list):
            return None, "'prompt' is required (a string or a list)"
        for key in ("max_tokens", "max_completion_tokens", "n"):
            v = body.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                return None, f"'{key}' must be a positive integer"
        if "stream" in body and not isinstance(body["stream"], bool):
            return None, "'stream' must be true or false"
        if "kv_transfer_params" in body:
            return None, "'kv_transfer_params' is set by the router; remove it"
        return body, ""


_AUDITED_FIELDS = ("instance", "drain", "event", "mode", "policy", *ADMISSION_SETTINGS)


class _Exchange:
    """A control request's body and answer status, seen on the way (for the audit log)."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive, self._send = receive, send
        self.body = bytearray()
        self.status = 0

    async def receive(self) -> Message:
        msg = await self._receive()
        if msg["type"] == "http.request":
            self.body += msg.get("body", b"")
        return msg

    async def send(self, msg: Message) -> None:
        if msg["type"] == "http.response.start":
            self.status = int(msg["status"])
        await self._send(msg)

    def request(self) -> dict[str, Any] | None:
        """The fields an auditor needs (never the whole body: it is the caller's text)."""
        try:
            req = json.loads(bytes(self.body))
        except (ValueError, RecursionError):
            return None
        if not isinstance(req, dict):
            return None
        kinds = str | bool | int | float
        return {k: req[k] for k in _AUDITED_FIELDS if isinstance(req.get(k), kinds)}


def _tokens_used(tl: Timeline) -> float | None:
    """Tokens a finished request cost (its usage); 0 for one that failed before any was
    counted; None (keep the reservation) when it succeeded without a usage."""
    known = [n for n in (tl.prompt_tokens, tl.completion_tokens) if n is not None]
    if known:
        return float(sum(known))
    return None if tl.outcome == "ok" else 0.0
