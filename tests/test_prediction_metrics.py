"""The prediction server's Prometheus exposition: requests and rows per endpoint and source,
the latency histogram, every sync-failure reason from the start, one served-bundle series."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from prediction_server.metrics import LATENCY_BUCKETS, SYNC_FAILURE_REASONS, Metrics


def _samples(m: Metrics) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


def test_requests_rows_latency_and_the_served_bundle_are_exposed():
    m = Metrics()
    m.observe("/predict/bulk/strict", 200, 0.0004, 16, "learned")
    m.observe("/predict/bulk/strict", 200, 0.002, 4, "learned")
    m.count("/predict", 422)
    m.served("v1", "prior", "prior", "quantile", 0.9, 0.0)
    m.served("v2", "learned", "xgboost", "quantile", 0.9, 1_790_000_000.0)
    got = _samples(m)
    strict = ("endpoint", "/predict/bulk/strict")
    assert got[("latency_prediction_requests_total", (strict, ("status", "200")))] == 2
    assert got[("latency_prediction_requests_total", (("endpoint", "/predict"), ("status", "422")))] == 1
    assert got[("latency_prediction_rows_predicted_total", (("source", "learned"),))] == 20
    assert got[("latency_prediction_request_seconds_bucket", (strict, ("le", "0.0005")))] == 1
    assert got[("latency_prediction_request_seconds_count", (strict,))] == 2
    assert len([k for k in got if k[0] == "latency_prediction_request_seconds_bucket"]) == len(LATENCY_BUCKETS) + 1
    info = {k: v for k, v in got.items() if k[0] == "latency_prediction_model_info"}
    assert info == {("latency_prediction_model_info", (("model_type", "xgboost"), ("objective_type", "quantile"),
                                                       ("quantile", "0.9"), ("source", "learned"),
                                                       ("version", "v2"))): 1.0}
    assert got[("latency_prediction_bundle_loaded_timestamp_seconds", ())] == 1_790_000_000.0
    failures = {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "latency_prediction_sync_failures_total"}
    assert failures == dict.fromkeys(SYNC_FAILURE_REASONS, 0.0)


def test_bound_children_are_created_once_per_endpoint_status_and_source():
    m = Metrics()
    assert m.bind("/predict", 200, "prior") is m.bind("/predict", 200, "prior")
    assert m.bind("/predict", 200, "prior") is not m.bind("/predict", 200, "learned")
