"""Readiness and health checks of one server: ready when ``GET /health`` is 200 and
``/v1/models`` lists the served model; its health is the status ``GET /health`` answers,
if any. A local Prometheus (role ``prometheus``) is ready when ``GET /-/ready`` is 200
and alive when ``/-/healthy`` is. pdctl's router (role ``router``) with keys answers
``/v1/models`` 401 to this keyless check: its own auth error, from a router whose
``/health`` (both roles have a healthy instance) was already 200, so it is ready."""

from __future__ import annotations

import httpx


async def check_ready(
    client: httpx.AsyncClient,
    url: str,
    served_name: str,
    timeout_s: float = 2.0,
    *,
    role: str = "",
) -> tuple[bool, str]:
    """(ready, why-not). Never raises for network problems."""
    try:
        if role == "prometheus":
            r = await client.get(f"{url}/-/ready", timeout=timeout_s)
            ok = r.status_code == 200
            return ok, "ready" if ok else f"/-/ready answered {r.status_code}"
        r = await client.get(f"{url}/health", timeout=timeout_s)
        if r.status_code != 200:
            return False, f"/health answered {r.status_code}"
        r = await client.get(f"{url}/v1/models", timeout=timeout_s)
        if r.status_code == 401 and role == "router" and _router_auth_error(r):
            return True, "ready (its models listing needs a key)"
        if r.status_code != 200:
            return False, f"/v1/models answered {r.status_code}"
        ids = [m.get("id") for m in r.json().get("data", []) if isinstance(m, dict)]
    except httpx.ConnectError:
        return False, "not listening yet"
    except httpx.TimeoutException:
        return False, "readiness check timed out"
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        return False, f"readiness check failed: {type(e).__name__}"
    if served_name not in ids:
        return False, f"model {served_name!r} not listed (have {ids})"
    return True, "ready"


def _router_auth_error(r: httpx.Response) -> bool:
    """The 401 is pdctl's router's own (OpenAI-shaped ``authentication_error``)."""
    try:
        err = r.json().get("error", {})
    except ValueError:
        return False
    return isinstance(err, dict) and err.get("type") == "authentication_error"


async def health_status(
    client: httpx.AsyncClient, url: str, timeout_s: float = 2.0, *, role: str = ""
) -> int | None:
    """The status code of ``GET /health`` (Prometheus: ``/-/healthy``); None when
    nothing answers in time."""
    endpoint = "/-/healthy" if role == "prometheus" else "/health"
    try:
        r = await client.get(f"{url}{endpoint}", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return r.status_code
