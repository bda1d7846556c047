"""plugins/scorer/kv_cache_utilization.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

from epp_client.plugins import KVCacheUtilizationScorer
from support.endpoints import REQ, ep


def test_kv_cache_utilization_scorer_is_the_free_fraction():
    assert KVCacheUtilizationScorer().score(REQ, [ep("a", kv=0.25), ep("b", kv=1.0)]) == {"a": 0.75, "b": 0.0}
    assert KVCacheUtilizationScorer().score(REQ, [ep("c", metrics=False)]) == {"c": 1.0}   # no metrics: empty cache
