"""plugins/scorer/queue.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

from epp_client.plugins import QueueScorer
from support.endpoints import REQ, ep


def test_queue_scorer():
    eps = [ep("a", q=0), ep("b", q=5), ep("c", q=10)]
    assert QueueScorer().score(REQ, eps) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert QueueScorer().score(REQ, [ep("a", q=3), ep("b", q=3)]) == {"a": 1.0, "b": 1.0}
    assert QueueScorer().score(REQ, []) == {}
