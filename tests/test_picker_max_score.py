"""plugins/picker/max_score.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random
from collections import Counter

from epp_client.plugins import (
    MaxScorePicker,
)
from support.endpoints import ep, names


def test_max_score_picker_breaks_ties_at_random():
    eps = [ep("a"), ep("b"), ep("c")]
    p = MaxScorePicker(rng=random.Random(4))
    assert p.pick(eps, {"a": 0.2, "b": 0.9, "c": 0.5})[0].name == "b"
    counts = Counter(p.pick(eps, {"a": 0.9, "b": 0.9, "c": 0.1})[0].name for _ in range(2000))
    assert counts["c"] == 0 and 0.45 < counts["a"] / 2000 < 0.55
    assert names(MaxScorePicker(max_num_of_endpoints=2, rng=random.Random(1)).pick(eps, {"a": 1, "b": 0.5, "c": 0})) \
        == ["a", "b"]
    assert MaxScorePicker().pick([], {}) == []
