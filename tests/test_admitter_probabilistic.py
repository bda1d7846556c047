"""plugins/admitter/probabilistic.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random

import pytest

from epp_client import (
    ConfigError,
    InferenceRequest,
)
from epp_client.plugins import (
    ProbabilisticAdmitter,
)
from support.endpoints import ep


def test_probabilistic_admitter_rules_and_rate():
    a = ProbabilisticAdmitter(rng=random.Random(1))
    assert (a.queue_depth_threshold, a.kv_cache_util_threshold, a.power, a.k) == (5, 0.8, 5.0, 300.0)
    shed = InferenceRequest(priority=-1)
    full = [ep("a", q=5, kv=0.0)]
    assert a.admit(InferenceRequest(priority=0), full).admitted
    assert a.admit(shed, []).admitted and a.admit(None, full).admitted
    d = a.admit(shed, full)
    assert d.admitted is False and d.status == 429
    assert d.reason == "probabilistic-admitter: rejected, saturation=1.000 prob=1.00"
    assert a.admit(shed, [ep("a", q=0, kv=0.0)]).admitted
    assert a.saturation([ep("a", q=1, kv=0.4), ep("b", metrics=False)]) == pytest.approx((0.5 + 1.0) / 2)
    # p = 0.5 at sat = (0.5/300)^(1/5)
    sat = (0.5 / 300) ** 0.2
    half = [ep("a", q=0, kv=sat * 0.8)]
    rejected = sum(not a.admit(shed, half).admitted for _ in range(4000))
    assert 0.46 < rejected / 4000 < 0.54


@pytest.mark.parametrize("params,bad", [
    ({"queueDepthThreshold": 0}, "queueDepthThreshold"), ({"kvCacheUtilThreshold": 0}, "kvCacheUtilThreshold"),
    ({"power": 0}, "power"), ({"k": -1}, "k"), ({"queueDepthThreshold": 2.5}, "queueDepthThreshold"),
])
def test_probabilistic_admitter_invalid_config(params, bad):
    with pytest.raises(ConfigError, match=bad):
        ProbabilisticAdmitter.from_config(params)
