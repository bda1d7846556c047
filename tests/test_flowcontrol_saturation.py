"""epp_client.flowcontrol.saturation: the utilization (roofline) and concurrency detectors."""
from __future__ import annotations

import pytest

from epp_client import ConfigError
from epp_client.flowcontrol import (
    ConcurrencyDetector,
    EndpointLoad,
    UtilizationDetector,
)


# ---- saturation ----------------------------------------------------------------------------
def test_utilization_detector_roofline_mean_and_fail_closed():
    d = UtilizationDetector()
    assert (d.queue_depth_threshold, d.kv_cache_util_threshold, d.metrics_staleness_s) == (5, 0.8, 0.2)
    now = 10.0
    fresh = now - 0.05
    assert d.saturation([EndpointLoad(5, 0.1, fresh), EndpointLoad(0, 0.4, fresh)], now) == pytest.approx(0.75)
    assert not d.saturated([EndpointLoad(2, 0.72, fresh)], now)                 # 0.9
    assert d.saturated([EndpointLoad(0, 0.8, fresh)], now)                      # kv at threshold
    # stale or missing metrics count as fully saturated; an empty pool is saturated
    assert d.saturation([EndpointLoad(0, 0.0, now - 0.5), EndpointLoad(0, 0.0, None)], now) == 1.0
    assert d.saturation([], now) == 1.0
    with pytest.raises(ConfigError, match="kvCacheUtilThreshold"):
        UtilizationDetector.from_config({"kvCacheUtilThreshold": 1.5})
    assert UtilizationDetector.from_config({"metricsStalenessThreshold": "1s"}).metrics_staleness_s == 1.0


def load(requests=0, tokens=0):
    return EndpointLoad(99, 1.0, None, requests, tokens)     # scraped metrics: ignored by this detector


def test_concurrency_detector_modes_defaults_and_pending():
    d = ConcurrencyDetector()
    assert (d.concurrency_mode, d.max_concurrency, d.max_token_concurrency, d.headroom) == ("requests", 100, 10**6, 0.0)
    # requests: in flight over the pool's capacity (endpoints x maxConcurrency); metrics age is irrelevant
    d = ConcurrencyDetector(max_concurrency=4)
    assert d.saturation([load(3), load(3)], 0.0) == pytest.approx(0.75)
    assert d.saturation([load(8), load(0)], 0.0) == 1.0 and d.saturated([load(8), load(0)], 0.0)   # aggregate
    assert not d.saturated([load(3), load(4)], 0.0)
    # released but not yet counted by any endpoint: counts as a request
    assert d.saturated([load(3), load(4)], 0.0, pending=1)
    assert d.saturation([], 0.0) == 1.0
    t = ConcurrencyDetector(concurrency_mode="tokens", max_token_concurrency=1000)
    assert t.saturation([load(50, 500), load(50, 1000)], 0.0) == pytest.approx(0.75)
    assert t.saturation([load(0, 500)], 0.0, pending=5) == pytest.approx(0.5)    # pending tokens unknown
    # hybrid: per endpoint the larger ratio, then the mean
    h = ConcurrencyDetector(concurrency_mode="hybrid", max_concurrency=4, max_token_concurrency=1000)
    assert h.saturation([load(4, 0), load(0, 500)], 0.0) == pytest.approx(0.75)
    for bad in ({"concurrencyMode": "bytes"}, {"maxConcurrency": 0}, {"maxTokenConcurrency": -1}, {"headroom": -0.1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ConcurrencyDetector.from_config(bad)
