"""plugins/producer/approx_prefix.py: the approximate prefix index configured from an EndpointPickerConfig."""
from __future__ import annotations

import pytest

from epp_client import ConfigError, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.plugins import ApproxPrefixProducer
from support.lifecycle import PREFIX_CONFIG, eps


def test_prefix_producer_is_built_from_the_config_with_its_parameters():
    s = build_scheduler(PREFIX_CONFIG)
    p = s.prefix_producer
    assert isinstance(p, ApproxPrefixProducer)
    assert (p.block_size_tokens, p.max_prefix_blocks, p.capacity) == (128, 10, 3)
    with pytest.raises(ConfigError) as e:
        build_scheduler(PREFIX_CONFIG.replace("blockSizeTokens: 128", "blockSizeTokens: 0"))
    assert "blockSizeTokens" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_scheduler(PREFIX_CONFIG.replace("lruCapacityPerServer", "lruCapacity"))
    assert "lruCapacity" in str(e.value)
    assert build_scheduler("plugins: [{type: queue-scorer}]").prefix_producer is None


def test_prefix_producer_matches_leading_blocks_and_evicts_least_recent():
    p = ApproxPrefixProducer(block_size_tokens=16, lru_capacity_per_endpoint=3)
    cands = eps(2)
    assert p.record("e0", ["a", "b", "c"]) == PrefixMatch(0, 3, 16)
    p.produce(["a", "b", "x"], cands)
    assert cands[0].prefix_match == PrefixMatch(2, 3, 16) and cands[1].prefix_match == PrefixMatch(0, 3, 16)
    p.record("e0", ["d"])                       # capacity 3: "a" (least recent) goes
    assert p.match("e0", ["a", "b"]).match_blocks == 0 and p.match("e0", ["b", "c", "d"]).match_blocks == 3
    assert p.match("e0", ["b"], total_blocks=5) == PrefixMatch(1, 5, 16)
