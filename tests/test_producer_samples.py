"""What the ``predicted-latency-producer`` sends: a feature row per candidate, and training
entries built from the chosen endpoint's row when the request completes."""
from __future__ import annotations

from collections import Counter

from epp_client import EncoderMatch, Endpoint, EndpointMetrics, InFlightLoad, PrefixMatch
from epp_client.plugins.producer.request_state import RequestContext
from epp_client.plugins.producer.samples import NO_METRICS, SampleEmitter, feature_rows, rows_for_predictor
from epp_client.training import ListSink
from features.schema import parse_training_entry


def _eps():
    return [Endpoint(name="d", labels={"role": "decode"}, metrics=EndpointMetrics(0.25, 2, 7),
                     prefix_match=PrefixMatch(3, 4), inflight=InFlightLoad(500, 3),
                     encoder_match=EncoderMatch(input_size=40, matched_size=90)),
            Endpoint(name="x", labels={"role": "both"}, metrics=None)]


def test_rows_carry_the_wire_fields_known_pod_types_and_mark_endpoints_without_metrics():
    ctx = RequestContext("r", 1000)
    d, x = feature_rows(ctx, _eps(), use_encoder_cache_features=True, endpoint_role_label="role")
    assert d == {"kv_cache_percentage": 0.25, "input_token_length": 1000, "num_request_waiting": 2,
                 "num_request_running": 3, "num_tokens_generated": 0, "prefix_cache_score": 0.75,
                 "prefill_tokens_in_flight": 500, "decode_tokens_in_flight": 0, "encoder_input_size": 40,
                 "encoder_matched_size": 40, "pod_type": "decode"}
    assert "pod_type" not in x and x[NO_METRICS] is True and x["num_request_running"] == 0
    assert x["encoder_input_size"] == 40 and x["encoder_matched_size"] == 0
    plain = feature_rows(ctx, _eps(), use_encoder_cache_features=False, endpoint_role_label="")
    assert all("pod_type" not in r and r["encoder_input_size"] == 0 for r in plain)
    sent = rows_for_predictor([d, x])
    assert NO_METRICS not in sent[1] and sent[1]["kv_cache_percentage"] == 0.0
    assert rows_for_predictor([d]) == [d]


def test_completed_requests_give_valid_ttft_and_tpot_entries_with_the_chosen_prediction():
    ctx = RequestContext("r", 1000)
    d, x = feature_rows(ctx, _eps(), use_encoder_cache_features=True, endpoint_role_label="role")
    ctx.rows, ctx.predictions, ctx.model_version = {"d": d, "x": x}, {"d": (120.0, 9.0)}, "v5"
    ctx.target, ctx.ttft_ms, ctx.ttft_slo, ctx.tpot_slo = "d", 150.0, 100.0, 50.0
    sink, counters = ListSink(), Counter()
    emit = SampleEmitter(sink, wall_clock=lambda: 1_790_000_000.0, counters=counters)
    emit.ttft(ctx)
    emit.tpot(ctx, 12.5)
    ttft, tpot = sink.entries
    assert (ttft["actual_ttft_ms"], ttft["actual_tpot_ms"], ttft["predicted_ttft_ms"]) == (150.0, 0.0, 120.0)
    assert ttft["model_version"] == "v5" and ttft["timestamp"] == "2026-09-21T14:13:20Z"
    assert ttft["prefix_cache_score"] == 0.75 and tpot["prefix_cache_score"] == 0.0
    assert (tpot["actual_tpot_ms"], tpot["encoder_input_size"]) == (12.5, 0)
    for e in (ttft, tpot):
        parse_training_entry(e)                    # the wire contract accepts both
    assert counters == {"ttft_samples": 1, "tpot_samples": 1, "ttft_slo_violations": 1}
    ctx.target = "x"                                # no metrics: never trained on
    emit.ttft(ctx)
    emit.tpot(ctx, 12.5)
    assert len(sink.entries) == 2 and counters["skipped_samples"] == 2
