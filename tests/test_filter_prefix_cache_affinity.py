"""plugins/filter/prefix_cache_affinity.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random
import sys

import pytest

from epp_client import (
    ConfigError,
)
from epp_client.plugins import (
    PrefixCacheAffinityFilter,
)
from support.endpoints import REQ, ep, names, pred


# ---------------------------------------------------------------- affinity filter
def test_affinity_filter_defaults():
    f = PrefixCacheAffinityFilter()
    assert (f.affinity_threshold, f.exploration_probability, f.max_ttft_penalty_ms, f.ttft_source,
            f.peak_prefill_throughput) == (0.80, 0.0, 18000.0, "prefillThroughput", 15928.0)


def test_affinity_filter_trivial_inputs_and_disabled():
    f = PrefixCacheAffinityFilter(rng=random.Random(1))
    assert f.filter(REQ, []) == []
    one = [ep("a", prefix=(0, 10))]
    assert f.filter(REQ, one) == one
    eps = [ep("a", prefix=(9, 10)), ep("b", prefix=(1, 10))]
    assert names(PrefixCacheAffinityFilter(affinity_threshold=0).filter(REQ, eps)) == ["a", "b"]
    assert names(PrefixCacheAffinityFilter(affinity_threshold=-0.5).filter(REQ, eps)) == ["a", "b"]
    assert names(f.filter(REQ, eps)) == ["a"]


def test_affinity_threshold_is_inclusive_and_order_is_kept():
    f = PrefixCacheAffinityFilter(affinity_threshold=0.8, rng=random.Random(1))
    eps = [ep("x", prefix=(79, 100)), ep("a", prefix=(4, 5)), ep("m"), ep("b", prefix=(5, 5)), ep("z", prefix=(3, 0))]
    assert names(f.filter(REQ, eps)) == ["a", "b"]  # 0.8 kept, 0.79 / missing / total 0 not
    none_sticky = [ep("x", prefix=(1, 10)), ep("y")]
    assert names(f.filter(REQ, none_sticky)) == ["x", "y"]


def test_affinity_exploration_probability():
    eps = [ep("a", prefix=(10, 10)), ep("b", prefix=(0, 10))]
    assert names(PrefixCacheAffinityFilter(exploration_probability=1.0).filter(REQ, eps)) == ["a", "b"]
    f = PrefixCacheAffinityFilter(exploration_probability=0.3, rng=random.Random(7))
    explored = sum(len(f.filter(REQ, eps)) == 2 for _ in range(4000))
    assert 0.27 < explored / 4000 < 0.33


def test_affinity_load_gate_prefill_throughput_is_strict():
    # TTFT = in-flight tokens / peak × 1000 ms; sticky best 5000 ms, non-sticky best 0 ms
    eps = [ep("s", prefix=(10, 10), inflight=(5000, 1)), ep("n", prefix=(0, 10))]  # n: no in-flight -> 0
    gate = dict(peak_prefill_throughput=1000.0, rng=random.Random(1))
    assert names(PrefixCacheAffinityFilter(max_ttft_penalty_ms=5000, **gate).filter(REQ, eps)) == ["s"]
    assert names(PrefixCacheAffinityFilter(max_ttft_penalty_ms=4999, **gate).filter(REQ, eps)) == ["s", "n"]
    assert names(PrefixCacheAffinityFilter(max_ttft_penalty_ms=0, **gate).filter(REQ, eps)) == ["s"]  # always stick


def test_affinity_load_gate_latency_predictor_source():
    f = PrefixCacheAffinityFilter(ttft_source="latencyPredictor", max_ttft_penalty_ms=5000, rng=random.Random(1))
    fast_other = [ep("s", prefix=(10, 10), pred=pred(0, ttft=6000)), ep("n", pred=pred(0, ttft=500))]
    assert names(f.filter(REQ, fast_other)) == ["s", "n"]  # 5500 > 5000
    ok = [ep("s", prefix=(10, 10), pred=pred(0, ttft=5500)), ep("n", pred=pred(0, ttft=500))]
    assert names(f.filter(REQ, ok)) == ["s"]  # 5000 is not > 5000
    # a missing prediction counts as +max: sticky without prediction vs predicted other -> gate opens
    assert names(f.filter(REQ, [ep("s", prefix=(10, 10)), ep("n", pred=pred(0, ttft=1))])) == ["s", "n"]
    # nobody has predictions (predictor down): max - max = 0, stickiness stays
    assert names(f.filter(REQ, [ep("s", prefix=(10, 10)), ep("n")])) == ["s"]


@pytest.mark.parametrize("params,bad", [
    ({"affinityThreshold": 1.01}, "affinityThreshold"),
    ({"explorationProbability": 1.5}, "explorationProbability"),
    ({"explorationProbability": -0.1}, "explorationProbability"),
    ({"maxTTFTPenaltyMs": -1}, "maxTTFTPenaltyMs"),
    ({"ttftSource": ""}, "ttftSource"),
    ({"ttftSource": "magic"}, "ttftSource"),
    ({"peakPrefillThroughput": -1}, "peakPrefillThroughput"),
    ({"peakPrefillThroughput": 0}, "peakPrefillThroughput"),
    ({"affinityThreshold": "high"}, "affinityThreshold"),
    ({"affinityTreshold": 0.5}, "affinityTreshold"),
])
def test_affinity_filter_invalid_config(params, bad):
    with pytest.raises(ConfigError, match=bad) as ei:
        PrefixCacheAffinityFilter.from_config(params)
    assert bad in ei.value.param


def test_affinity_filter_config_accepts_camel_case_and_edge_values():
    f = PrefixCacheAffinityFilter.from_config({"affinityThreshold": 0.99, "ttftSource": "latencyPredictor",
                                               "maxTTFTPenaltyMs": 5000, "peakPrefillThroughput": 0})
    assert (f.affinity_threshold, f.ttft_source, f.max_ttft_penalty_ms) == (0.99, "latencyPredictor", 5000)
    assert PrefixCacheAffinityFilter.from_config({"peakPrefillThroughput": 0, "maxTTFTPenaltyMs": 0})
    assert PrefixCacheAffinityFilter.from_config({"affinityThreshold": 1.0}).affinity_threshold == 1.0


def test_max_float_constant():
    # the affinity gate's "+max" is the largest float, as upstream's math.MaxFloat64
    f = PrefixCacheAffinityFilter(ttft_source="latencyPredictor")
    assert f._ttft(ep("x")) == sys.float_info.max
