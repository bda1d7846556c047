"""plugins/picker/random.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from epp_client import (
    ConfigError,
)
from epp_client.plugins import (
    RandomPicker,
)
from support.endpoints import ep, names


def test_random_picker():
    eps = [ep(x) for x in "abcd"]
    p = RandomPicker(rng=random.Random(5))
    counts = Counter(p.pick(eps)[0].name for _ in range(4000))
    assert all(abs(counts[x] / 4000 - 0.25) < 0.03 for x in "abcd")
    got = RandomPicker(max_num_of_endpoints=3, rng=random.Random(6)).pick(eps)
    assert len(got) == 3 and len(set(names(got))) == 3
    assert len(RandomPicker(max_num_of_endpoints=10).pick(eps)) == 4
    with pytest.raises(ConfigError, match="maxNumOfEndpoints"):
        RandomPicker.from_config({"maxNumOfEndpoints": "two"})
