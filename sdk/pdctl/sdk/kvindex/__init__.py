"""The router's prefix-cache index: which KV blocks each instance holds, from vLLM's KV
events (exact) or the router's own routing history (approximate)."""

from pdctl.sdk.kvindex.hashing import BlockHasher, event_key
from pdctl.sdk.kvindex.index import STATES, CacheIndex, IndexState, InstanceIndex

__all__ = ["STATES", "BlockHasher", "CacheIndex", "IndexState", "InstanceIndex", "event_key"]
