"""decode-harm-filter / decode-harm-scorer: the requests a placement's prefill pushes over their
TPOT SLO, from the producer's per-request decode state (``LatencyPrediction.decoding``)."""
from __future__ import annotations

import pytest

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.plugins import PredictedLatencyProducer
from epp_client.plugins.harm import DecodeHarmFilter, DecodeHarmScorer, harmed
from epp_client.types import LatencyPrediction
from test_epp_producer import Clock, TablePredictor


def test_a_prefill_pushes_the_decodes_near_their_slo_over_it_and_no_others():
    # 2 s of prefill in 4 steps (500 ms each) starting 1 s from now, 40 ms a step otherwise,
    # judged 4 steps after it: 2,000 ms of decode at 80 ms a token (25 tokens) is pushed over 100 ms,
    # 60 s at 40 ms keeps enough slack; 20 s at 300 ms is over with or without the prefill
    tight, slack, late = (2_000.0, 80.0, 100.0), (60_000.0, 40.0, 100.0), (20_000.0, 300.0, 100.0)
    assert harmed((tight,), 2_000.0, 4, 1_000.0, 40.0, 4) == 1
    assert harmed((slack,), 2_000.0, 4, 1_000.0, 40.0, 4) == 0
    assert harmed((late,), 2_000.0, 4, 1_000.0, 40.0, 4) == 1                 # counted: over with it
    assert harmed((late,), 2_000.0, 4, 1_000.0, 40.0, 4, late=False) == 0     # not pushed over by it
    assert harmed((tight,), 2_000.0, 4, 1_000.0, 40.0, 4, late=False) == 1
    # a request not decoding yet starts as the queue drains: its first 8 tokens take 2.16 s
    assert harmed(((0.0, 0.0, 100.0),), 2_000.0, 4, 1_000.0, 40.0, 4) == 1
    assert harmed(((0.0, 0.0, 300.0),), 2_000.0, 4, 1_000.0, 40.0, 4) == 0
    # a short prefill (one 100 ms step) harms nobody within its SLO
    assert harmed((tight, slack, (0.0, 0.0, 100.0)), 100.0, 1, 1_000.0, 40.0, 4) == 0
    assert harmed((tight, slack, late), 0.0, 4, 0.0, 40.0, 4) == 0            # no prefill, nothing counted


def _endpoint(name, ttft, tpot, decoding, matched_blocks=0):
    slo_t, slo_p = 5_000.0, 100.0
    return Endpoint(name=name, metrics=EndpointMetrics(0.3, 0, len(decoding)),
                    prefix_match=PrefixMatch(matched_blocks, 64, block_size_tokens=64),
                    prediction=LatencyPrediction(ttft, tpot, slo_t - ttft, slo_p - tpot, True, True,
                                                 len(decoding), decoding=tuple(decoding)))


def _request(tokens=4096):
    return InferenceRequest(request_id="q", headers={"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "100"},
                            input_tokens=tokens)


def test_filter_keeps_the_endpoints_where_the_prefill_harms_fewest():
    tight = (1_000.0, 90.0, 100.0)
    a = _endpoint("a", 900.0, 40.0, [tight, tight])      # fastest, but two decodes near their SLO
    b = _endpoint("b", 1_000.0, 40.0, [(60_000.0, 30.0, 100.0)])
    c = _endpoint("c", 1_000.0, 40.0, [])
    f = DecodeHarmFilter()
    assert f.scores(_request(), [a, b, c]) == {"a": 2, "b": 0, "c": 0}
    assert [e.name for e in f.filter(_request(), [a, b, c])] == ["b", "c"]
    assert f.filtered == 1
    # the request's own predicted miss counts as one more
    late = _endpoint("b", 6_000.0, 40.0, [])
    assert f.scores(_request(), [late, c]) == {"b": 1, "c": 0}
    # a prompt mostly cached on an endpoint prefills there for a share of the best endpoint's TTFT
    cached = _endpoint("a", 900.0, 40.0, [tight, tight], matched_blocks=62)
    fastest = _endpoint("c", 800.0, 40.0, [])
    assert f.scores(_request(), [cached, fastest]) == {"a": 0, "c": 0}


def test_an_adapter_load_counts_where_the_pool_serves_adapters():
    def lora_endpoint(name, active, max_lora=2):
        e = _endpoint(name, 900.0, 40.0, [])
        e.metrics = EndpointMetrics(0.3, 0, 0, frozenset(active), frozenset(), max_lora)
        return e

    req = InferenceRequest(request_id="q", target_model="sql-lora", input_tokens=4096,
                           headers={"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "100"})
    eps = [lora_endpoint("a", {"sql-lora"}), lora_endpoint("b", {"x"}), lora_endpoint("c", {"x", "y"})]
    assert DecodeHarmFilter().scores(req, eps) == {"a": 0, "b": 2, "c": 2}
    assert DecodeHarmFilter.from_config({"adapterLoadCount": 0.5}).scores(req, eps) == {"a": 0, "b": 0.5, "c": 0.5}
    assert [e.name for e in DecodeHarmFilter().filter(req, eps)] == ["a"]
    # no adapter slots anywhere (a base-model pool): nothing added
    assert DecodeHarmFilter().scores(req, [lora_endpoint("a", set(), 0), lora_endpoint("b", set(), 0)]) == {
        "a": 0, "b": 0}


def test_a_kv_cache_near_full_counts_one_more():
    full, roomy = _endpoint("a", 900.0, 40.0, []), _endpoint("b", 900.0, 40.0, [])
    full.metrics = EndpointMetrics(0.97, 0, 0)
    assert DecodeHarmFilter().scores(_request(), [full, roomy]) == {"a": 1, "b": 0}
    assert DecodeHarmFilter.from_config({"kvUsageThreshold": 1.0}).scores(_request(), [full, roomy]) == {"a": 0, "b": 0}


def test_filter_and_scorer_without_predictions_change_nothing():
    f = DecodeHarmFilter()
    eps = [Endpoint(name="a"), Endpoint(name="b")]
    assert f.filter(_request(), eps) == eps
    one = [_endpoint("a", 900.0, 40.0, [(1_000.0, 60.0, 100.0)])]
    assert f.filter(_request(), one) == one
    s = DecodeHarmScorer()
    mixed = [_endpoint("a", 900.0, 40.0, [(1_000.0, 90.0, 100.0)] * 3), _endpoint("b", 900.0, 40.0, []),
             Endpoint(name="c")]
    assert s.score(_request(), mixed) == {"a": pytest.approx(0.25), "b": 1.0, "c": 0.0}


def test_producer_reports_each_running_requests_decode_state():
    clock = Clock(100.0)
    prod = PredictedLatencyProducer(TablePredictor([(200.0, 40.0), (300.0, 50.0)]), None, streaming_mode=True,
                                    clock=clock)
    eps = [Endpoint(name="a", metrics=EndpointMetrics(0.1, 0, 0)), Endpoint(name="b", metrics=EndpointMetrics(0, 0, 0))]
    r = InferenceRequest(request_id="r1", headers={"x-llm-d-slo-tpot-ms": "80"}, input_tokens=100)
    prod.produce(r, eps)
    prod.pre_request(r, eps[0])
    assert prod.decoding("a", clock()) == ((0.0, 0.0, 80.0),)       # dispatched, no first token yet
    clock.t = 100.5
    prod.on_first_chunk("r1", tokens=1)
    clock.t = 101.5
    # no token counts after the first chunk: the TPOT predicted at dispatch stands for its pace
    prod.on_chunk("r1")
    (elapsed, pace, slo), = prod.decoding("a", clock())
    assert elapsed == pytest.approx(1_000.0) and pace == 40.0 and slo == 80.0
    prod2 = PredictedLatencyProducer(TablePredictor([(200.0, 40.0)]), None, streaming_mode=True, clock=clock)
    prod2.produce(r, eps[:1])
    prod2.pre_request(r, eps[0])
    clock.t = 102.0
    prod2.on_first_chunk("r1", tokens=1)
    clock.t = 103.0
    prod2.on_chunk("r1", tokens=20)                                  # 20 tokens in 1 s: 50 ms each
    (elapsed, pace, _), = prod2.decoding("a", clock())
    assert elapsed == pytest.approx(1_000.0) and pace == pytest.approx(50.0)
    # the next request's predictions carry it
    prod2.produce(InferenceRequest(request_id="r2", input_tokens=10), eps[:1])
    assert eps[0].prediction.running_decodes() == prod2.decoding("a", clock())
    prod2.on_complete("r1", output_tokens=21)
    assert prod2.decoding("a", clock()) == ()
    assert prod.decoding("b", clock()) == ()
