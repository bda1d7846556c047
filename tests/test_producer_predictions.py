"""The ``predicted-latency-producer``'s predictions written onto the candidates: TTFT headroom
against the TTFT SLO; TPOT judged in streaming mode only, never on a prefill endpoint, against
the buffered TPOT SLO or the endpoint's lowest running TPOT SLO when lower."""
from __future__ import annotations

from epp_client import Endpoint
from epp_client.engine.twin import Running
from epp_client.plugins.producer.predictions import apply_predictions
from epp_client.plugins.producer.request_state import RequestContext, RunningQueue
from epp_client.predictor import BulkPrediction

RESULT = BulkPrediction([100.0, 200.0, 300.0], [10.0, 20.0, 30.0], "v3", "learned")


def _eps():
    return [Endpoint(name="a"), Endpoint(name="p", labels={"role": "prefill"}), Endpoint(name="c")]


def _ctx(ttft_slo=250.0, tpot_slo=20.0):
    ctx = RequestContext("r", 100)
    ctx.ttft_slo, ctx.tpot_slo = ttft_slo, tpot_slo
    return ctx


def test_non_streaming_judges_ttft_only_and_keeps_the_predictions_in_the_context():
    ctx, eps = _ctx(), _eps()
    apply_predictions(ctx, eps, RESULT, 5.0, running=RunningQueue(), streaming_mode=False,
                      endpoint_role_label="role", slo_buffer_factor=1.0, decoding=lambda e, t: ())
    a, p, c = (e.prediction for e in eps)
    assert (a.ttft_headroom_ms, a.ttft_valid, c.ttft_headroom_ms, c.ttft_valid) == (150.0, True, -50.0, False)
    assert all(e.prediction.tpot_headroom_ms == 0.0 and e.prediction.tpot_valid for e in eps)
    assert a.decoding is None and (a.model_version, a.model_source) == ("v3", "learned")
    assert ctx.predictions == {"a": (100.0, 10.0), "p": (200.0, 20.0), "c": (300.0, 30.0)}
    assert ctx.model_version == "v3"


def test_streaming_uses_the_tighter_running_slo_skips_prefill_and_defers_the_twin_view():
    running = RunningQueue()
    running.add("c", "other", 40.0)
    running.add("a", "tight", 8.0)
    asked = []
    view = (Running(1.0, 2, 8.0, 102),)

    def decoding(endpoint, now):
        asked.append((endpoint, now))
        return view

    eps = _eps()
    apply_predictions(_ctx(), eps, RESULT, 5.0, running=running, streaming_mode=True,
                      endpoint_role_label="role", slo_buffer_factor=1.5, decoding=decoding)
    a, p, c = (e.prediction for e in eps)
    assert (a.tpot_headroom_ms, a.tpot_valid) == (8.0 * 1.5 - 10.0, True)    # min(20, 8) × 1.5
    assert (p.tpot_headroom_ms, p.tpot_valid) == (0.0, True)                  # prefill: not judged
    assert (c.tpot_headroom_ms, c.tpot_valid) == (20.0 * 1.5 - 30.0, False)  # 30 < 30 is false
    assert (a.dispatched_request_count, p.dispatched_request_count) == (1, 0)
    assert asked == []                                  # computed on first use only
    assert a.decoding() == view and asked == [("a", 5.0)]
