"""plugins/picker/weighted_random.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random
from collections import Counter

from epp_client.plugins import (
    WeightedRandomPicker,
)
from support.endpoints import ep


# --------------------------------------------------------------------------- pickers
def test_weighted_random_picker_probabilities():
    eps = [ep("a"), ep("b"), ep("c"), ep("z")]
    scores = {"a": 0.1, "b": 0.3, "c": 0.6, "z": 0.0}
    p = WeightedRandomPicker(rng=random.Random(11))
    n = 20000
    counts = Counter(p.pick(eps, scores)[0].name for _ in range(n))
    assert counts["z"] == 0
    for name, expected in (("a", 0.1), ("b", 0.3), ("c", 0.6)):
        assert abs(counts[name] / n - expected) < 0.015


def test_weighted_random_picker_k_and_zero_scores():
    eps = [ep("a"), ep("b"), ep("c")]
    p = WeightedRandomPicker(max_num_of_endpoints=2, rng=random.Random(2))
    got = p.pick(eps, {"a": 0.5, "b": 0.0, "c": 0.0})
    assert len(got) == 2 and got[0].name == "a"  # zero-score endpoints fill the rest
    # no score > 0: delegate to the random picker (uniform)
    p1 = WeightedRandomPicker(rng=random.Random(3))
    counts = Counter(p1.pick(eps, {"a": 0, "b": -1})[0].name for _ in range(3000))
    assert all(abs(counts[x] / 3000 - 1 / 3) < 0.04 for x in "abc")
    assert WeightedRandomPicker(max_num_of_endpoints=0).max_num_of_endpoints == 1
    assert WeightedRandomPicker.from_config({"maxNumOfEndpoints": -3}).max_num_of_endpoints == 1
    assert WeightedRandomPicker().pick([], {}) == []


def test_same_seed_same_choices():
    eps = [ep(x) for x in "abcdefgh"]
    scores = {x: (i + 1) / 10 for i, x in enumerate("abcdefgh")}
    a = [WeightedRandomPicker(rng=random.Random(9)).pick(eps, scores)[0].name for _ in range(1)]
    picker1, picker2 = WeightedRandomPicker(rng=random.Random(9)), WeightedRandomPicker(rng=random.Random(9))
    seq1 = [picker1.pick(eps, scores)[0].name for _ in range(50)]
    seq2 = [picker2.pick(eps, scores)[0].name for _ in range(50)]
    assert seq1 == seq2 and a[0] == seq1[0] and len(set(seq1)) > 1
