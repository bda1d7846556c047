"""plugins/scorer/prefix_cache.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import pytest

from epp_client import (
    ConfigError,
)
from epp_client.plugins import (
    PrefixCacheScorer,
)
from support.endpoints import REQ, ep


def test_prefix_cache_scorer():
    eps = [ep("a", prefix=(256, 512)), ep("b", prefix=(3, 0)), ep("c")]
    assert PrefixCacheScorer().score(REQ, eps) == {"a": 0.5, "b": 0.0, "c": 0.0}
    s = PrefixCacheScorer(match_length_weight=0.5)  # scale 8192: 256 blocks × 16 = 4096 tokens
    assert s.score(REQ, eps)["a"] == pytest.approx(0.5 * 0.25 + 0.5 * 0.5)
    long = [ep("a", prefix=(1024, 2048))]  # 16384 tokens: the length term saturates at 1
    assert PrefixCacheScorer(match_length_weight=1.0).score(REQ, long)["a"] == 1.0
    with pytest.raises(ConfigError, match="matchLengthWeight"):
        PrefixCacheScorer.from_config({"matchLengthWeight": 1.5})
    with pytest.raises(ConfigError, match="matchLengthScaleTokens"):
        PrefixCacheScorer.from_config({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0})
    assert PrefixCacheScorer.from_config({"matchLengthScaleTokens": 0}).match_length_scale_tokens == 0
