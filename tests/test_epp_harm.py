"""decode-harm-filter / decode-harm-scorer: the requests a placement's prefill pushes over their
TPOT SLO, from the producer's per-request decode state (``LatencyPrediction.decoding``)."""
from __future__ import annotations

import pytest

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.plugins import PredictedLatencyProducer
from epp_client.plugins.harm import DecodeHarmFilter, DecodeHarmScorer, harmed
from epp_client.types import LatencyPrediction
from test_epp_producer import Clock, TablePredictor


def test_a_stall_harms_the_decodes_it_pushes_over_their_slo_and_no_others():
    # 4 s of prefill at 150 ms a token against a 30 ms pace: 1 s decoded at 80 ms is pushed over
    # 100 ms; 60 s decoded at 40 ms keeps enough slack; one over its SLO either way is not harmed
    tight, slack, late = (1_000.0, 80.0, 100.0), (60_000.0, 40.0, 100.0), (20_000.0, 300.0, 100.0)
    assert harmed((tight,), 4_000.0, 150.0, 30.0) == 1
    assert harmed((slack,), 4_000.0, 150.0, 30.0) == 0
    assert harmed((late,), 4_000.0, 150.0, 30.0) == 0
    # a request not decoding yet decodes at the prefill's pace: harmed when that pace is over its SLO
    assert harmed(((0.0, 0.0, 100.0),), 4_000.0, 150.0, 30.0) == 1
    assert harmed(((0.0, 0.0, 200.0),), 4_000.0, 150.0, 30.0) == 0
    assert harmed((tight, slack, late), 0.0, 150.0, 30.0) == 0   # no stall, no harm


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
    tight = (1_000.0, 60.0, 100.0)
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


def test_filter_and_scorer_without_predictions_change_nothing():
    f = DecodeHarmFilter()
    eps = [Endpoint(name="a"), Endpoint(name="b")]
    assert f.filter(_request(), eps) == eps
    one = [_endpoint("a", 900.0, 40.0, [(1_000.0, 60.0, 100.0)])]
    assert f.filter(_request(), one) == one
    s = DecodeHarmScorer()
    mixed = [_endpoint("a", 900.0, 40.0, [(1_000.0, 60.0, 100.0)] * 3), _endpoint("b", 900.0, 40.0, []),
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
