"""predicted-latency-producer (B1.2-B1.8), its training samples and the A.2 differences
(3, 4, 5, 6, 7), plus the in-flight load accounting of B4.4. Predictions come from the
real model runtime (the built-in prior bundle) or, where a test needs exact numbers, from
a table predictor that answers given values by row position."""
from __future__ import annotations

import pytest

from epp_client import ConfigError, EncoderMatch, Endpoint, EndpointMetrics, InferenceRequest, InFlightLoad, PrefixMatch
from epp_client.plugins import PredictedLatencyProducer
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.predictor import BulkPrediction, InProcessPredictor
from epp_client.training import ListSink
from features.loaded import LoadedBundle
from features.schema import parse_training_entry


class TablePredictor:
    """Answers fixed (ttft, tpot) per row position; records the rows it was asked about."""

    def __init__(self, values, version="v-test"):
        self.values = values
        self.version = version
        self.calls = []

    def predict_bulk(self, rows):
        self.calls.append(rows)
        if self.values is None:
            return None
        vals = self.values[: len(rows)]
        return BulkPrediction([v[0] for v in vals], [v[1] for v in vals], self.version)

    async def apredict_bulk(self, rows):
        return self.predict_bulk(rows)


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def eps3():
    return [
        Endpoint(name="a", labels={"role": "decode"}, metrics=EndpointMetrics(0.25, 2, 7),
                 prefix_match=PrefixMatch(3, 4), inflight=InFlightLoad(500, 3)),
        Endpoint(name="b", labels={"role": "prefill"}, metrics=EndpointMetrics(0.5, 0, 4)),
        Endpoint(name="c", labels={"role": "both"}, metrics=EndpointMetrics(0.0, 1, 0), prefix_match=PrefixMatch(2, 0)),
    ]


def req(rid="r1", ttft=None, tpot=None, tokens=1000, priority=0):
    h = {}
    if ttft is not None:
        h["x-llm-d-slo-ttft-ms"] = str(ttft)
    if tpot is not None:
        h["x-llm-d-slo-tpot-ms"] = str(tpot)
    return InferenceRequest(request_id=rid, headers=h, input_tokens=tokens, priority=priority)


def make(values=((100.0, 10.0), (200.0, 20.0), (300.0, 30.0)), **kw):
    clock = Clock()
    sink = ListSink()
    pr = TablePredictor(None if values is None else list(values))
    p = PredictedLatencyProducer(pr, sink, clock=clock, wall_clock=lambda: 1.7e9, **kw)
    return p, pr, sink, clock


def dispatch(p, request, eps, i=0):
    """The scheduler's two calls for one request: produce over ``eps``, then dispatch to ``eps[i]``."""
    p.produce(request, eps)
    p.pre_request(request, eps[i])


def test_defaults_and_config_validation():
    p = PredictedLatencyProducer()
    assert (p.slo_buffer_factor, p.context_ttl, p.streaming_mode, p.endpoint_role_label, p.predict_in_produce) == \
        (1.0, 300.0, False, "", True)
    for params, bad in (({"sloBufferFactor": 0}, "sloBufferFactor"), ({"sloBufferFactor": -1}, "sloBufferFactor"),
                        ({"streamingMode": "yes"}, "streamingMode"), ({"bogus": 1}, "bogus")):
        with pytest.raises(ConfigError, match=bad):
            PredictedLatencyProducer.from_config(params)
    # deprecated parameters are accepted and ignored
    assert PredictedLatencyProducer.from_config({"samplingMean": 50, "maxDecodeTokenSamplesForPrediction": 3})


def test_rows_one_bulk_call_per_candidate_set():
    p, pr, _, _ = make(endpoint_role_label="role")
    eps = eps3()
    p.produce(req(), eps)
    assert len(pr.calls) == 1
    a, b, c = pr.calls[0]
    assert a == {"kv_cache_percentage": 0.25, "input_token_length": 1000, "num_request_waiting": 2,
                 "num_request_running": 3, "num_tokens_generated": 0, "prefix_cache_score": 0.75,
                 "prefill_tokens_in_flight": 500, "decode_tokens_in_flight": 0, "encoder_input_size": 0,
                 "encoder_matched_size": 0, "pod_type": "decode"}
    # no in-flight attribute: tokens 0, running from server metrics; role "prefill" sent
    assert (b["num_request_running"], b["prefill_tokens_in_flight"], b["pod_type"]) == (4, 0, "prefill")
    # A.2.7: total_blocks = 0 gives 0 (upstream: +Inf fails the whole call); "both" is not a wire pod type
    assert c["prefix_cache_score"] == 0.0 and "pod_type" not in c
    assert [e.prediction.ttft_ms for e in eps] == [100.0, 200.0, 300.0]
    assert all(e.prediction.model_version == "v-test" for e in eps)
    # without endpointRoleLabel, pod_type is omitted
    p2, pr2, _, _ = make()
    p2.produce(req(), eps3())
    assert all("pod_type" not in r for r in pr2.calls[0])


def test_a25_num_tokens_generated_same_in_prediction_and_ttft_training_rows():
    p, pr, sink, clock = make()
    eps = eps3()
    dispatch(p, req(), eps)
    clock.t += 0.25
    p.on_complete("r1")
    assert pr.calls[0][0]["num_tokens_generated"] == 0 == sink.entries[0]["num_tokens_generated"]


def test_headroom_and_validity_non_streaming():
    p, _, _, _ = make(values=[(100.0, 10.0), (200.0, 20.0), (300.0, 30.0)])
    eps = eps3()
    p.produce(req(ttft=200, tpot=5), eps)
    a, b, c = (e.prediction for e in eps)
    assert (a.ttft_headroom_ms, a.ttft_valid) == (100.0, True)
    assert (b.ttft_headroom_ms, b.ttft_valid) == (0.0, False)  # strict: pred == SLO is invalid, headroom 0
    assert (c.ttft_headroom_ms, c.ttft_valid) == (-100.0, False)
    # E2E mode neutralises TPOT
    assert all(e.prediction.tpot_headroom_ms == 0 and e.prediction.tpot_valid for e in eps)
    eps = eps3()
    p.produce(req("r2"), eps)  # no SLO headers: headroom = -pred
    assert [e.prediction.ttft_headroom_ms for e in eps] == [-100.0, -200.0, -300.0]


def test_headroom_streaming_buffer_factor_prefill_and_missing_tpot_slo():
    p, _, _, _ = make(values=[(100.0, 10.0), (200.0, 20.0), (300.0, 30.0)], streaming_mode=True,
                      endpoint_role_label="role", slo_buffer_factor=1.5)
    eps = eps3()
    p.produce(req(ttft=1000, tpot=20), eps)
    a, b, c = (e.prediction for e in eps)
    assert (a.tpot_headroom_ms, a.tpot_valid) == (20.0, True)  # 20 × 1.5 − 10
    assert (b.tpot_headroom_ms, b.tpot_valid) == (0.0, True)  # label exactly "prefill" is neutralised
    assert (c.tpot_headroom_ms, c.tpot_valid) == (0.0, False)  # "both" is not; 30 < 30 is false
    assert a.ttft_headroom_ms == 900.0  # the buffer factor never applies to TTFT
    eps = eps3()
    p.produce(req("r2", ttft=1000), eps)  # streaming without TPOT SLO: invalid everywhere but prefill
    assert [(e.prediction.tpot_headroom_ms, e.prediction.tpot_valid) for e in eps] == \
        [(-10.0, False), (0.0, True), (-30.0, False)]


def test_running_queue_min_tpot_tightens_headroom_and_counts_dispatched():
    p, _, _, _ = make(values=[(100.0, 10.0)] * 3, streaming_mode=True)
    eps = eps3()
    dispatch(p, req("r1", tpot=15), eps)
    eps = eps3()
    p.produce(req("r2", tpot=50), eps)
    a, b, _ = (e.prediction for e in eps)
    assert a.tpot_headroom_ms == 15 - 10 and a.dispatched_request_count == 1  # min(50, podMin 15)
    assert b.tpot_headroom_ms == 50 - 10 and b.dispatched_request_count == 0
    # quirk: a request without TPOT SLO joins with 0, which disables the tightening
    p.produce(req("r2b"), eps3())
    p.pre_request(req("r2b"), eps[0])
    eps = eps3()
    p.produce(req("r3", tpot=50), eps)
    assert eps[0].prediction.tpot_headroom_ms == 40 and eps[0].prediction.dispatched_request_count == 2
    p.on_complete("r1")
    p.on_complete("r2b")
    assert p.running.size("a") == 0 and p.running.endpoints() == []


def test_prediction_failure_writes_nothing_and_training_only_mode():
    p, pr, _, _ = make(values=None)
    eps = eps3()
    p.produce(req(), eps)
    assert all(e.prediction is None for e in eps) and p.counters["prediction_failures"] == 1
    p, pr, _, _ = make(values=[(1.0, 1.0)])  # count mismatch: 1 prediction for 3 rows
    eps = eps3()
    p.produce(req(), eps)
    assert all(e.prediction is None for e in eps)
    p, pr, sink, clock = make(predict_in_produce=False)
    eps = eps3()
    p.produce(req(), eps)
    assert pr.calls == [] and all(e.prediction is None for e in eps)
    p.pre_request(req(), eps[1])
    clock.t += 0.5
    p.on_complete("r1")
    assert sink.entries[0]["actual_ttft_ms"] == 500 and "predicted_ttft_ms" not in sink.entries[0]


def test_e2e_mode_training_sample_from_scheduling_snapshot_with_a24_fields():
    p, _, sink, clock = make()
    eps = eps3()
    p.produce(req(ttft=500), eps)
    eps[0].metrics.waiting_queue_size = 99  # later changes do not leak into the sample
    eps[0].inflight.tokens = 12345
    p.pre_request(req(ttft=500), eps[0])
    clock.t += 0.0123
    p.on_chunk("r1")  # intermediate chunks are ignored in E2E mode
    clock.t += 1.2345
    p.on_complete("r1")
    (e,) = sink.entries
    assert e["actual_ttft_ms"] == 1246.0 and e["actual_tpot_ms"] == 0.0  # whole ms, truncated, from PreRequest
    assert p.counters["ttft_slo_violations"] == 1  # 1246 > 500
    assert (e["num_request_waiting"], e["prefill_tokens_in_flight"], e["prefix_cache_score"]) == (2, 500, 0.75)
    assert (e["predicted_ttft_ms"], e["predicted_tpot_ms"], e["model_version"]) == (100.0, 10.0, "v-test")
    assert e["timestamp"].startswith("2023-11-14T22:13:20")
    entry = parse_training_entry(e)  # the wire contract accepts it
    assert entry.predicted_ttft_ms == 100.0 and entry.model_version == "v-test"
    assert p.tracked_requests() == 0 and p.counters["ttft_samples"] == 1


@pytest.mark.parametrize("kw", [{"aborted": True}, {"status": 500}, {"status": 404}, {"status": 199}])
def test_a23_aborted_or_failed_responses_train_nothing(kw):
    p, _, sink, clock = make()
    eps = eps3()
    dispatch(p, req(), eps)
    clock.t += 2.0
    p.on_complete("r1", **kw)
    assert list(sink.entries) == [] and p.tracked_requests() == 0 and p.running.size("a") == 0


def test_streaming_ttft_at_first_chunk_and_tpot_over_chunks():
    p, _, sink, clock = make(streaming_mode=True)
    eps = eps3()
    dispatch(p, req(tpot=30), eps)
    clock.t += 0.1005
    p.on_first_chunk("r1")
    assert sink.entries[0]["actual_ttft_ms"] == 100.0 and sink.entries[0]["actual_tpot_ms"] == 0
    for _ in range(8):
        clock.t += 0.010
        p.on_chunk("r1")
    clock.t += 0.010
    p.on_complete("r1")  # the EOS call is the 10th chunk
    tp = sink.entries[1]
    assert p.counters["ttft_slo_violations"] == 0 and p.counters["tpot_slo_violations"] == 0  # no TTFT SLO; 10 < 30
    assert tp["actual_ttft_ms"] == 0.0 and tp["actual_tpot_ms"] == pytest.approx((190 - 100) / 9)
    assert tp["prefix_cache_score"] == 0.0 and tp["encoder_input_size"] == 0 and tp["num_tokens_generated"] == 0
    assert tp["num_request_waiting"] == 2 and tp["predicted_tpot_ms"] == 10.0


def test_a26_tpot_counts_tokens_when_reported():
    p, _, sink, clock = make(streaming_mode=True)
    eps = eps3()
    dispatch(p, req(), eps)
    clock.t += 0.1
    p.on_first_chunk("r1", tokens=1)
    for _ in range(3):
        clock.t += 0.1
        p.on_chunk("r1", tokens=10)  # 3 chunks of 10 tokens
    p.on_complete("r1", output_tokens=31)
    assert sink.entries[1]["actual_tpot_ms"] == pytest.approx((400 - 100) / 30)
    # without usage, the reported per-chunk tokens are summed: 1 + 3 × 10 = 31
    p.produce(req("r2"), eps3())
    p.pre_request(req("r2"), eps[0])
    clock.t += 0.1
    p.on_first_chunk("r2", tokens=1)
    for _ in range(3):
        clock.t += 0.1
        p.on_chunk("r2", tokens=10)
    p.on_complete("r2")
    assert sink.entries[3]["actual_tpot_ms"] == pytest.approx(300 / 30)


def test_streaming_edge_cases():
    p, _, sink, clock = make(streaming_mode=True)
    eps = eps3()
    dispatch(p, req(), eps)
    clock.t += 0.2
    p.on_complete("r1")  # single-chunk streaming response: nothing recorded
    assert list(sink.entries) == [] and p.tracked_requests() == 0
    dispatch(p, req("r2"), eps)
    clock.t += 0.2
    p.on_first_chunk("r2")
    clock.t += 0.2
    p.on_complete("r2", aborted=True)  # TTFT was real and is kept; no TPOT sample
    assert [e["actual_ttft_ms"] for e in sink.entries] == [200.0]
    p.on_chunk("unknown")  # hooks for unknown requests are no-ops
    p.on_complete("unknown")


def test_pd_ttft_sample_uses_prefill_target_and_queue_tracks_decode():
    p, _, sink, clock = make(streaming_mode=True, endpoint_role_label="role")
    eps = eps3()
    p.produce(req(tpot=40), eps)
    p.pre_request(req(tpot=40), {"decode": eps[0], "prefill": eps[1]})
    assert p.running.size("a") == 1 and p.running.size("b") == 0
    clock.t += 0.3
    p.on_first_chunk("r1")
    clock.t += 0.1
    p.on_chunk("r1")
    clock.t += 0.1
    p.on_complete("r1")
    ttft, tpot = sink.entries
    assert ttft["pod_type"] == "prefill" and ttft["num_request_running"] == 4 and ttft["predicted_ttft_ms"] == 200.0
    assert tpot["pod_type"] == "decode" and tpot["num_request_running"] == 3 and tpot["predicted_tpot_ms"] == 10.0


def test_encoder_cache_features():
    for enabled in (False, True):
        p, pr, _, _ = make(use_encoder_cache_features=enabled)
        eps = eps3()
        eps[0].encoder_match = EncoderMatch(input_size=500, matched_size=900)  # matched is clamped
        eps[2].encoder_match = EncoderMatch(input_size=400, matched_size=100)  # the last one sets the input size
        p.produce(req(), eps)
        got = [(r["encoder_input_size"], r["encoder_matched_size"]) for r in pr.calls[0]]
        assert got == ([(400, 400), (400, 0), (400, 100)] if enabled else [(0, 0)] * 3)


def test_redispatch_moves_the_running_queue_entry():
    p, _, sink, clock = make()
    eps = eps3()
    dispatch(p, req(tpot=7), eps)
    p.pre_request(req(tpot=7), {"default": eps[2]})  # retried on another endpoint
    assert p.running.size("a") == 0 and p.running.size("c") == 1
    clock.t += 0.25
    p.on_complete("r1")
    (e,) = sink.entries
    assert e["predicted_ttft_ms"] == 300.0 and e["actual_ttft_ms"] == 250.0  # the endpoint that served it
    assert p.counters["ttft_slo_violations"] == 0
    assert p.running.size("c") == 0


def test_context_ttl_touch_on_read_and_expiry_removes_running_entry():
    p, _, sink, clock = make(context_ttl=10.0)
    eps = eps3()
    dispatch(p, req(), eps)
    clock.t += 8
    p.on_chunk("r1")  # a read refreshes the TTL
    clock.t += 8
    p.produce(req("r2"), eps3())
    assert p.tracked_requests() == 2 and p.running.size("a") == 1
    clock.t += 10.5
    p.produce(req("r3"), eps3())  # r1 and r2 expire
    assert p.tracked_requests() == 1 and p.running.size("a") == 0 and p.counters["expired_contexts"] == 2
    p.on_complete("r1")
    assert list(sink.entries) == []


def test_dump_state():
    p, _, _, _ = make(values=[(1.0, 1.0)] * 3)
    for rid, target, tpot in (("x", 1, 20), ("y", 0, 5), ("z", 1, 9)):
        eps = eps3()
        p.produce(req(rid, tpot=tpot), eps)
        p.pre_request(req(rid, tpot=tpot), eps[target])
    assert p.dump_state() == {"endpoints": [{"endpoint": "b", "runningRequests": 2, "minTpotSlo": 9.0},
                                            {"endpoint": "a", "runningRequests": 1, "minTpotSlo": 5.0}],
                              "totalEndpoints": 2, "maxEndpoints": 100, "truncated": False, "trackedRequests": 3,
                              "promptScale": {"enginePerEstimatedToken": 1.0, "samples": 0}}


def test_real_prior_bundle_in_process():
    bundle = LoadedBundle.builtin_prior()
    pr = InProcessPredictor(lambda: bundle)
    p = PredictedLatencyProducer(pr, ListSink())
    eps = eps3()
    p.produce(req(ttft=400), eps)
    assert all(e.prediction is not None and e.prediction.model_version == "prior-default" for e in eps)
    # the endpoint with queued requests and in-flight prompt tokens is predicted slower
    assert eps[0].prediction.ttft_ms > eps[2].prediction.ttft_ms
    bad = eps3()
    bad[0].metrics.kv_cache_usage = 1.5  # invalid row: the whole call fails, nothing written
    p.produce(req("r2"), bad)
    assert all(e.prediction is None for e in bad) and pr.metrics.failures == {"invalid_rows": 1}


# ----------------------------------------------------------------- in-flight (B4.4)
def test_inflight_tokens_and_release():
    t = InFlightTracker()
    a = Endpoint(name="a", prefix_match=PrefixMatch(2, 5, 16))
    b = Endpoint(name="b")
    t.pre_request(InferenceRequest(request_id="s", input_tokens=100), {"decode": a})
    # (5 − 2) × 16 + max(0, 100 − 80) = 68 uncached
    assert (t.load("a").tokens, t.load("a").requests) == (68, 1)
    t.on_complete("s")
    r = InferenceRequest(request_id="r", input_tokens=100)
    t.pre_request(r, {"decode": a, "prefill": b})
    # disaggregated: the prompt is prefill work on b only (b has no prefix info -> 100);
    # a receives its KV (upstream counts the 68 on a too; docs/pd.md)
    assert (t.load("a").tokens, t.load("a").requests, t.load("b").tokens, t.load("b").requests) == (0, 1, 100, 1)
    t.on_first_chunk("r")  # tokens released everywhere; the prefill entry completely
    assert (t.load("a").tokens, t.load("a").requests, t.load("b").tokens, t.load("b").requests) == (0, 1, 0, 0)
    t.on_complete("r")
    assert (t.load("a").tokens, t.load("a").requests) == (0, 0)
    t.on_complete("r")  # idempotent, floors at 0
    assert t.load("a").requests == 0 and t.tracked_requests() == 0


def test_inflight_estimated_output_tokens():
    t = InFlightTracker(add_estimated_output_tokens=True, max_estimated_output_tokens=1000)
    a = Endpoint(name="a")
    t.pre_request(InferenceRequest(request_id="r", input_tokens=101), {"default": a})
    assert t.load("a").tokens == 101 + 152  # round(101 × 1.5) = 151.5 -> 152
    t.on_first_chunk("r")  # only prefill entries are released on the first chunk
    assert t.load("a").tokens == 253
    t.on_complete("r")
    assert t.load("a").tokens == 0
    t.pre_request(InferenceRequest(request_id="s", input_tokens=1000, max_tokens=20), {"default": a})
    assert t.load("a").tokens == 1020  # min(1500, max_tokens 20, cap 1000)
    t.pre_request(InferenceRequest(request_id="u", input_tokens=2000), {"default": a})
    assert t.load("a").tokens == 1020 + 3000
    with pytest.raises(ConfigError, match="outputRatio"):
        InFlightTracker.from_config({"outputRatio": -1})
