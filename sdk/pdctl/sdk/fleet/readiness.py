"""Readiness and health checks of one server: ready when ``GET /health`` is 200 and
``/v1/models`` lists the served model; its health is the status ``GET /health`` answers,
if any. A local Prometheus (role ``prometheus``) is ready when ``GET /-/ready`` is 200
and alive when ``/-/healthy`` is."""

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
