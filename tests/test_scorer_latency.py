"""plugins/scorer/latency.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

import random

import pytest

from epp_client import (
    ConfigError,
    LatencyPrediction,
)
from epp_client.plugins import (
    LatencyScorer,
    WeightedRandomPicker,
)
from support.endpoints import REQ, ep, pred


# ---------------------------------------------------------------- latency scorer
def test_latency_scorer_defaults():
    s = LatencyScorer()
    assert (s.ttft_weight, s.tpot_weight, s.headroom_selection_strategy) == (0.8, 0.2, "least")
    assert (s.composite_kv_weight, s.composite_queue_weight, s.composite_prefix_weight) == (1, 1, 1)


def test_composite_fallback_without_predictions():
    eps = [ep("a", kv=0.5, q=2, prefix=(1, 2)), ep("b", kv=0.2, q=0)]
    assert LatencyScorer().score(REQ, eps) == {"a": 0.33, "b": 0.6}
    # zero queues everywhere: relQueue = 1
    assert LatencyScorer().score(REQ, [ep("a", kv=0.0, q=0)]) == {"a": 0.67}
    # weights summing to <= 0 -> (1, 0, 0); rounding is half away from zero (12.5 -> 13)
    s = LatencyScorer(composite_kv_weight=0, composite_queue_weight=0, composite_prefix_weight=0)
    assert s.score(REQ, [ep("a", kv=0.875, q=3)]) == {"a": 0.13}
    # total_blocks = 0 contributes 0 (A.2.7)
    s = LatencyScorer(composite_kv_weight=0, composite_queue_weight=0, composite_prefix_weight=1)
    assert s.score(REQ, [ep("a", prefix=(4, 0))]) == {"a": 0.0}


def test_latency_scorer_positive_bucket_least_and_most():
    eps = [ep("near", pred=pred(100)), ep("far", pred=pred(300)), ep("neg", pred=pred(-50))]
    assert LatencyScorer().score(REQ, eps) == {"near": 1.01, "far": 0.01, "neg": 0.0}
    assert LatencyScorer(headroom_selection_strategy="most").score(REQ, eps) == {"near": 0.01, "far": 1.01, "neg": 0.0}
    # anything other than "most" acts as "least"
    assert LatencyScorer(headroom_selection_strategy="whatever").score(REQ, eps)["near"] == 1.01
    mid = [ep("a", pred=pred(100)), ep("b", pred=pred(200)), ep("c", pred=pred(300))]
    assert LatencyScorer().score(REQ, mid)["b"] == 0.51


def test_latency_scorer_slo_normalised_headroom():
    # TTFT SLO 2000 ms, TPOT SLO 100 ms: "a" has three times "b"'s TTFT headroom, "b" 2 ms more TPOT headroom
    a = ep("a", pred=LatencyPrediction(500, 60, 1500, 40, True, True, 1))
    b = ep("b", pred=LatencyPrediction(1500, 58, 500, 42, True, True, 1))
    neg = ep("neg", pred=pred(-50))
    w = {"ttft_weight": 0.5, "tpot_weight": 0.5, "headroom_selection_strategy": "most"}
    # range (upstream): each headroom stretched over the candidates, so 2 ms of TPOT weigh as much as 1 s of TTFT
    assert LatencyScorer(**w).score(REQ, [a, b, neg]) == {"a": 0.51, "b": 0.51, "neg": 0.0}
    # slo: a 0.5 x 0.75 + 0.5 x 0.40 against b 0.5 x 0.25 + 0.5 x 0.42
    assert LatencyScorer(**w, headroom_normalization="slo").score(REQ, [a, b, neg]) == {"a": 1.01, "b": 0.01,
                                                                                        "neg": 0.0}
    # a TPOT difference that is large against its SLO still wins
    c = ep("c", pred=LatencyPrediction(1400, 10, 600, 90, True, True, 1))
    assert LatencyScorer(**w, headroom_normalization="slo").score(REQ, [a, c])["c"] == 1.01
    # only the positive bucket under "most" changes: "least" keeps upstream's rule
    least = LatencyScorer(ttft_weight=0.5, tpot_weight=0.5, headroom_normalization="slo")
    assert least.score(REQ, [a, b]) == LatencyScorer(ttft_weight=0.5, tpot_weight=0.5).score(REQ, [a, b])
    assert LatencyScorer.from_config({"headroomNormalization": "slo"}).headroom_normalization == "slo"
    with pytest.raises(ConfigError, match="headroomNormalization"):
        LatencyScorer.from_config({"headroomNormalization": "ratio"})


def test_latency_scorer_reweighting_and_float_quirk():
    # both ranges <= 1e-9 -> weights kept, nT = nP = 0.5 -> c = 0.5
    same = [ep("a", pred=pred(100, 3)), ep("b", pred=pred(100, 3))]
    assert LatencyScorer().score(REQ, same) == {"a": 0.51, "b": 0.51}
    # only TPOT varies -> (0, 1): the smaller |tpot headroom| wins under least
    tp = [ep("a", pred=pred(100, 1)), ep("b", pred=pred(100, 9))]
    assert LatencyScorer().score(REQ, tp) == {"a": 1.01, "b": 0.01}
    # weights summing to <= 0 -> (1, 0)
    both = [ep("a", pred=pred(100, 9)), ep("b", pred=pred(300, 1))]
    assert LatencyScorer(ttft_weight=0, tpot_weight=0).score(REQ, both) == {"a": 1.01, "b": 0.01}
    # B6.12: c = 0.8 gives int((1 - 0.8) × 100) = 19, so w = 20 (not 21)
    q = [ep("a", pred=pred(0)), ep("b", pred=pred(80)), ep("c", pred=pred(100))]
    assert LatencyScorer().score(REQ, q)["b"] == 0.2
    # mixed weights: α·nT + β·nP with α = 0.8, β = 0.2
    mixed = [ep("a", pred=pred(0, 0)), ep("b", pred=pred(100, 10)), ep("c", pred=pred(50, 0))]
    # c: nT = 0.5, nP = 0 -> c = 0.4 -> w = int(60.000000000000004)+1 = 61
    assert LatencyScorer().score(REQ, mixed) == {"a": 1.01, "b": 0.01, "c": 0.61}


def test_latency_scorer_idle_preference_forces_least():
    eps = [ep("busy", pred=pred(-10, dispatched=3)), ep("idle1", pred=pred(-50, dispatched=0)),
           ep("idle2", pred=pred(-400, dispatched=0))]
    for strategy in ("least", "most"):
        scores = LatencyScorer(headroom_selection_strategy=strategy).score(REQ, eps)
        assert scores == {"busy": 0.0, "idle1": 1.01, "idle2": 0.01}


def test_latency_scorer_deficit_buckets_in_order():
    tpot_only = ep("tpot_only", pred=pred(10, -5, dispatched=2))
    ttft_only = ep("ttft_only", pred=pred(-10, 5, dispatched=2))
    both = ep("both", pred=pred(-10, -5, dispatched=2))
    s = LatencyScorer()
    assert s.score(REQ, [both, ttft_only, tpot_only]) == {"both": 0.0, "ttft_only": 0.0, "tpot_only": 0.51}
    assert s.score(REQ, [both, ttft_only]) == {"both": 0.0, "ttft_only": 0.51}
    b2 = ep("both2", pred=pred(-30, -5, dispatched=1))
    assert s.score(REQ, [both, b2]) == {"both": 1.01, "both2": 0.01}


def test_a21_endpoint_without_prediction_never_outranks_a_predicted_one():
    # upstream would count "none" as positive with headroom (0, 0) and give it the top score
    eps = [ep("none"), ep("neg", pred=pred(-20, dispatched=4))]
    scores = LatencyScorer().score(REQ, eps)
    assert scores["none"] == 0.0 and scores["neg"] > 0
    eps = [ep("none"), ep("pos", pred=pred(30))]
    scores = LatencyScorer().score(REQ, eps)
    assert scores["none"] == 0.0 and scores["pos"] > 0
    picker = WeightedRandomPicker(rng=random.Random(5))
    assert all(picker.pick(eps, scores)[0].name == "pos" for _ in range(200))


def test_latency_scorer_negative_selection_strategy():
    """No busy endpoint meets the SLO: upstream's `least` takes the smallest deficit; `most`
    the largest (in the same first non-empty deficit bucket), keeping a hopeless request off
    the endpoints that can still serve others in time. Idle endpoints still come first."""
    near = ep("near", pred=pred(-10, -5, dispatched=2))
    far = ep("far", pred=pred(-400, -50, dispatched=2))
    tpot_only = ep("tpot_only", pred=pred(10, -5, dispatched=2))
    assert LatencyScorer().score(REQ, [near, far]) == {"near": 1.01, "far": 0.01}
    most = LatencyScorer(negative_selection_strategy="most")
    assert most.score(REQ, [near, far]) == {"near": 0.01, "far": 1.01}
    assert most.score(REQ, [near, far, tpot_only]) == {"near": 0.0, "far": 0.0, "tpot_only": 0.51}  # bucket order kept
    idle = ep("idle", pred=pred(-900, -90, dispatched=0))
    assert most.score(REQ, [near, far, idle])["idle"] == 0.51
    with pytest.raises(ConfigError, match="negativeSelectionStrategy"):
        LatencyScorer.from_config({"negativeSelectionStrategy": "sink"})
