"""A client for a pdctl router, and only a client: OpenAI completions and streams, the
flight recorder's timelines and operator control, blocking and asyncio.

    from pdctl.sdk.client import RouterClient

    with RouterClient("http://127.0.0.1:8000") as router:
        print(router.complete("the prefill engine", max_tokens=8).text)
        for chunk in router.stream("the decode engine", max_tokens=8):
            print(chunk.text, end="")
        router.set_mode("push-sequential")
        for r in router.requests(limit=5):
            print(r.id, r.prefill, r.decode, r.ttft_ms)

:class:`RouterClient` and :class:`AsyncRouterClient` carry out the same pure operations
(:mod:`pdctl.sdk.client.ops`) and have the same methods, one blocking, one awaited.
Importing this package imports httpx and nothing of the router server.
"""

from pdctl.sdk.client.admission import (
    ADMISSION_FIELDS,
    ADMISSION_SETTINGS,
    AdmissionSetting,
    admission_changes,
    refused_setting,
)
from pdctl.sdk.client.aio import AsyncChunkStream, AsyncRouterClient
from pdctl.sdk.client.base import CONTROL_TIMEOUT_S, DEFAULT_TIMEOUT_S
from pdctl.sdk.client.ops import InstanceEvent
from pdctl.sdk.client.results import (
    Chunk,
    Completion,
    RequestTimeline,
    RoutedInstance,
    RouterState,
    Segment,
)
from pdctl.sdk.client.sync import ChunkStream, RouterClient
from pdctl.sdk.errors import RouterError

__all__ = [
    "ADMISSION_FIELDS",
    "ADMISSION_SETTINGS",
    "CONTROL_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "AdmissionSetting",
    "AsyncChunkStream",
    "AsyncRouterClient",
    "Chunk",
    "ChunkStream",
    "Completion",
    "InstanceEvent",
    "RequestTimeline",
    "RoutedInstance",
    "RouterClient",
    "RouterError",
    "RouterState",
    "Segment",
    "admission_changes",
    "refused_setting",
]
