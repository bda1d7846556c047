"""``queue-scorer`` (B4.1): shorter waiting queue, higher score."""
from __future__ import annotations

from epp_client.framework.params import Plugin
from epp_client.framework.protocols import Scorer
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint, InferenceRequest


@plugin("queue-scorer", Scorer)
class QueueScorer(Plugin):
    """``queue-scorer``: (maxQ - q) / (maxQ - minQ) over waiting queues; 1.0 when all equal."""

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        qs = [e.metrics.waiting_queue_size if e.metrics is not None else 0 for e in endpoints]
        if not qs:
            return {}
        lo, hi = min(qs), max(qs)
        if hi == lo:
            return {e.name: 1.0 for e in endpoints}
        return {e.name: (hi - q) / (hi - lo) for e, q in zip(endpoints, qs)}
