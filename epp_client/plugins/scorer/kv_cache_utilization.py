"""``kv-cache-utilization-scorer`` (B4.2): more free KV cache, higher score."""
from __future__ import annotations

from epp_client.framework.params import Plugin
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint, InferenceRequest


@plugin("kv-cache-utilization-scorer", Scorer)
class KVCacheUtilizationScorer(Plugin):
    """``kv-cache-utilization-scorer``: 1 - KV-cache usage (a fraction)."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return {e.name: 1.0 - (e.metrics.kv_cache_usage if e.metrics is not None else 0.0) for e in endpoints}
