"""plugins/filter/slo_headroom_tier.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random

import pytest

from epp_client import (
    ConfigError,
)
from epp_client.plugins import (
    SloHeadroomTierFilter,
)
from support.endpoints import REQ, ep, names, pred


# ----------------------------------------------------------------- tier filter
def test_tier_filter_rules():
    f = SloHeadroomTierFilter(epsilon_explore_neg=0.0, rng=random.Random(1))
    assert SloHeadroomTierFilter().epsilon_explore_neg == 0.01
    assert f.filter(REQ, []) == []
    single = [ep("a", pred=pred(-5))]
    assert f.filter(REQ, single) == single
    assert names(f.filter(REQ, [ep("a"), ep("b")])) == ["a", "b"]  # nobody has a prediction
    # headroom 0 is positive; validity flags are ignored
    eps = [ep("p0", pred=pred(0, 0, valid=False)), ep("n", pred=pred(-1)), ep("m"), ep("p", pred=pred(5, 1))]
    assert names(f.filter(REQ, eps)) == ["p0", "p"]
    assert names(SloHeadroomTierFilter(epsilon_explore_neg=1.0).filter(REQ, eps)) == ["n", "m"]
    # only negative (+ no-prediction appended to it)
    assert names(f.filter(REQ, [ep("m"), ep("n1", pred=pred(-1)), ep("n2", pred=pred(3, -1))])) == ["n1", "n2", "m"]
    # only positive plus no-prediction: both tiers non-empty
    assert names(f.filter(REQ, [ep("m"), ep("p", pred=pred(1))])) == ["p"]


def test_tier_filter_exploration_rate_and_config():
    eps = [ep("p", pred=pred(1)), ep("n", pred=pred(-1))]
    f = SloHeadroomTierFilter(epsilon_explore_neg=0.2, rng=random.Random(3))
    neg = sum(names(f.filter(REQ, eps)) == ["n"] for _ in range(4000))
    assert 0.17 < neg / 4000 < 0.23
    for bad in (-0.1, 1.1):
        with pytest.raises(ConfigError, match="epsilonExploreNeg"):
            SloHeadroomTierFilter.from_config({"epsilonExploreNeg": bad})
