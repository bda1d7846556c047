"""Decision rules and defaults of the EPP plugins (docs/plugins.md Part B2, B4) and the
public data types (A.1). Random choices use seeded rngs; the weighted picker is checked
statistically."""
from __future__ import annotations

import random
import sys
from collections import Counter

import pytest

from epp_client import (
    Admission,
    ConfigError,
    Endpoint,
    EndpointMetrics,
    InferenceRequest,
    InFlightLoad,
    LatencyPrediction,
    PrefixMatch,
    rank_endpoints,
)
from epp_client.framework.params import parse_duration
from epp_client.plugins import (
    KVCacheUtilizationScorer,
    LatencyScorer,
    LatencySloAdmitter,
    LoraAffinityScorer,
    MaxScorePicker,
    PredictedLatencyProducer,
    PrefixCacheAffinityFilter,
    PrefixCacheScorer,
    ProbabilisticAdmitter,
    QueueScorer,
    RandomPicker,
    SloHeadroomTierFilter,
    WeightedRandomPicker,
)

REQ = InferenceRequest()


def ep(name, kv=0.5, q=0, running=1, prefix=None, inflight=None, pred=None, labels=None, metrics=True):
    return Endpoint(name=name, labels=labels or {},
                    metrics=EndpointMetrics(kv_cache_usage=kv, waiting_queue_size=q, running_requests_size=running)
                    if metrics else None,
                    prefix_match=PrefixMatch(*prefix) if prefix else None,
                    inflight=InFlightLoad(*inflight) if inflight else None, prediction=pred)


def pred(ttft_h, tpot_h=0.0, ttft=100.0, tpot=10.0, valid=None, dispatched=1):
    v = (ttft_h > 0) if valid is None else valid
    return LatencyPrediction(ttft, tpot, ttft_h, tpot_h, v, tpot_h >= 0 if valid is None else valid, dispatched)


def names(eps):
    return [e.name for e in eps]


# ---------------------------------------------------------------------------- types
def test_slo_headers_new_name_wins_even_if_invalid_then_alias_then_zero():
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "250", "x-slo-ttft-ms": "900"}).ttft_slo_ms == 250
    assert InferenceRequest(headers={"x-slo-ttft-ms": "900"}).ttft_slo_ms == 900
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": "abc", "x-slo-ttft-ms": "900"}).ttft_slo_ms == 0
    assert InferenceRequest(headers={"x-llm-d-slo-ttft-ms": ""}).ttft_slo_ms == 0
    assert InferenceRequest(headers={"x-llm-d-slo-tpot-ms": "1e3"}).tpot_slo_ms == 1000
    assert InferenceRequest(headers={"x-slo-tpot-ms": "-5"}).tpot_slo_ms == -5
    assert InferenceRequest().ttft_slo_ms == 0 and InferenceRequest().tpot_slo_ms == 0
    assert InferenceRequest(priority=-1).sheddable and not InferenceRequest(priority=0).sheddable


def test_data_type_defaults_and_prefix_score():
    e = Endpoint()
    assert e.metrics == EndpointMetrics() and e.prediction is None and e.prefix_match is None
    assert EndpointMetrics().max_active_lora == 0 and EndpointMetrics().active_lora_adapters == frozenset()
    assert PrefixMatch(3, 4).score == 0.75 and PrefixMatch(3, 4).block_size_tokens == 16
    assert PrefixMatch(5, 0).score == 0.0  # A.2.7: never +Inf
    assert PrefixMatch(0, 0).score == 0.0
    p = LatencyPrediction(1, 2, 3, 4, True, False)
    assert not p.is_valid and LatencyPrediction(ttft_valid=True, tpot_valid=True).is_valid
    assert p.dispatched_request_count == 0 and p.model_version == ""
    assert Admission(False, "x", 429) != Admission()


def test_data_parallel_rank_endpoints():
    eps = rank_endpoints("vllm-0", "10.0.0.5", [8000, 8001, 8002], labels={"role": "decode"})
    assert [(e.name, e.port, e.rank) for e in eps] == [("vllm-0-rank-0", 8000, 0), ("vllm-0-rank-1", 8001, 1),
                                                         ("vllm-0-rank-2", 8002, 2)]
    assert eps[0].labels == {"role": "decode"} and eps[0].metrics is not eps[1].metrics
    # active-ports annotation: only listed ports that are also target ports
    act = rank_endpoints("p", "h", [8000, 8001, 8002], {"llm-d.ai/active-ports": "8002, 8000,9999"})
    assert [(e.name, e.port) for e in act] == [("p-rank-0", 8000), ("p-rank-2", 8002)]
    legacy = rank_endpoints("p", "h", [8000, 8001], {"inference.networking.k8s.io/active-ports": "8001"})
    assert [e.name for e in legacy] == ["p-rank-1"]
    assert rank_endpoints("p", "h", [8000], {"llm-d.ai/active-ports": ""}) == []


def test_go_duration_parsing():
    assert parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == pytest.approx(0.25) and parse_duration("1.5s") == 1.5
    with pytest.raises(ValueError):
        parse_duration("5 minutes")
    assert PredictedLatencyProducer.from_config({"contextTTL": "30s"}).context_ttl == 30
    with pytest.raises(ConfigError, match="contextTTL"):
        PredictedLatencyProducer.from_config({"contextTTL": "soon"})


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


# ------------------------------------------------------------------- other scorers
def test_queue_and_kv_scorers():
    eps = [ep("a", q=0), ep("b", q=5), ep("c", q=10)]
    assert QueueScorer().score(REQ, eps) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert QueueScorer().score(REQ, [ep("a", q=3), ep("b", q=3)]) == {"a": 1.0, "b": 1.0}
    assert QueueScorer().score(REQ, []) == {}
    assert KVCacheUtilizationScorer().score(REQ, [ep("a", kv=0.25), ep("b", kv=1.0)]) == {"a": 0.75, "b": 0.0}


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


def test_lora_affinity_scorer_order_of_rules():
    def lora(name, active=(), waiting=(), max_lora=0):
        return Endpoint(name=name, metrics=EndpointMetrics(active_lora_adapters=frozenset(active),
                                                           waiting_lora_adapters=frozenset(waiting),
                                                           max_active_lora=max_lora))
    req = InferenceRequest(target_model="sql")
    eps = [lora("active", active={"sql"}), lora("spare", active={"x"}, waiting={"sql"}, max_lora=4),
           lora("waiting", active={"x", "y"}, waiting={"sql"}, max_lora=3), lora("full", active={"x"}, max_lora=1),
           lora("nomax", waiting={"sql"}), Endpoint(name="nometrics", metrics=None)]
    assert LoraAffinityScorer().score(req, eps) == {"active": 1.0, "spare": 0.8, "waiting": 0.6, "full": 0.0,
                                                     "nomax": 0.6, "nometrics": 0.0}
    with pytest.raises(ConfigError):
        LoraAffinityScorer.from_config({"anything": 1})


# ------------------------------------------------------------------------ admitters
def test_latency_slo_admitter_rules():
    a = LatencySloAdmitter()
    slo = {"x-llm-d-slo-ttft-ms": "200"}
    shed = InferenceRequest(headers=slo, priority=-1)
    invalid = [ep("a", kv=0.5, running=2, pred=pred(-5, valid=False)), ep("b", kv=0.02, running=1, pred=pred(-5, valid=False))]
    d = a.admit(shed, invalid)
    assert d == Admission(False, "no valid endpoint available to serve the request", 429)  # A.2.2
    assert a.admit(None, invalid).admitted
    assert a.admit(InferenceRequest(headers=slo, priority=0), invalid).admitted  # not sheddable
    assert a.admit(InferenceRequest(priority=-1), invalid).admitted  # no SLO
    assert a.admit(InferenceRequest(headers={"x-slo-ttft-ms": "-3"}, priority=-1), invalid).admitted
    assert not a.admit(InferenceRequest(headers={"x-slo-tpot-ms": "20"}, priority=-1), invalid).admitted
    assert a.admit(shed, [ep("a", running=2), ep("b", running=1)]).admitted  # no predictions: fail-open
    assert a.admit(shed, invalid + [ep("cold", kv=0.0199, running=3)]).admitted  # cold: kv < 0.02
    assert a.admit(shed, invalid + [ep("idle", running=0)]).admitted  # idle by server metrics
    valid = LatencyPrediction(10, 1, 190, 0, True, True, 5)
    assert a.admit(shed, invalid + [ep("ok", running=9, pred=valid)]).admitted


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


def test_max_score_picker_breaks_ties_at_random():
    eps = [ep("a"), ep("b"), ep("c")]
    p = MaxScorePicker(rng=random.Random(4))
    assert p.pick(eps, {"a": 0.2, "b": 0.9, "c": 0.5})[0].name == "b"
    counts = Counter(p.pick(eps, {"a": 0.9, "b": 0.9, "c": 0.1})[0].name for _ in range(2000))
    assert counts["c"] == 0 and 0.45 < counts["a"] / 2000 < 0.55
    assert names(MaxScorePicker(max_num_of_endpoints=2, rng=random.Random(1)).pick(eps, {"a": 1, "b": 0.5, "c": 0})) \
        == ["a", "b"]
    assert MaxScorePicker().pick([], {}) == []


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


def test_same_seed_same_choices():
    eps = [ep(x) for x in "abcdefgh"]
    scores = {x: (i + 1) / 10 for i, x in enumerate("abcdefgh")}
    a = [WeightedRandomPicker(rng=random.Random(9)).pick(eps, scores)[0].name for _ in range(1)]
    picker1, picker2 = WeightedRandomPicker(rng=random.Random(9)), WeightedRandomPicker(rng=random.Random(9))
    seq1 = [picker1.pick(eps, scores)[0].name for _ in range(50)]
    seq2 = [picker2.pick(eps, scores)[0].name for _ in range(50)]
    assert seq1 == seq2 and a[0] == seq1[0] and len(set(seq1)) > 1


def test_max_float_constant():
    # the affinity gate's "+max" is the largest float, as upstream's math.MaxFloat64
    f = PrefixCacheAffinityFilter(ttft_source="latencyPredictor")
    assert f._ttft(ep("x")) == sys.float_info.max


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
