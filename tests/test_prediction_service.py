"""The prediction service without HTTP: the prior until a learned bundle is swapped in (and
only a newer one after it), every prediction body's answer and error naming the field, the
refusal mode, status and the request counts."""
from __future__ import annotations

import json

import pytest

from features.bundle import read_bundle
from features.loaded import LoadedBundle
from load.demo_bundle import build_bundle
from prediction_server.service import PredictionService
from support.prediction import ROW, settings_for


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    return [LoadedBundle.from_files(*read_bundle(build_bundle(root, seq, rounds=10))) for seq in (1, 2)]


def _json(answer):
    status, body = answer
    return status, json.loads(body)


def test_the_prior_serves_until_a_learned_bundle_and_only_newer_bundles_replace_it(bundles):
    svc = PredictionService(settings_for(None))
    assert not svc.is_ready() and svc.status()["model_source"] == "prior"
    status, p = _json(svc.predict_one(json.dumps(ROW).encode()))
    assert status == 200 and p["model_source"] == "prior" and p["ttft_ms"] > 0
    first, second = bundles
    assert svc.swap(first) and svc.is_ready() and svc.bundle is first
    assert not svc.swap(first)                                  # not newer: kept
    assert not svc.swap(LoadedBundle.builtin_prior(0.9))        # a prior never replaces a learned model
    assert svc.bundle is first and svc.is_ready()
    assert svc.swap(second) and svc.status()["model_version"] == second.version
    assert svc.status()["models_exist"] == {"ttft": True, "tpot": True}
    assert "latency_prediction_bundle_swaps_total 2.0" in svc.metrics.render().decode()


def test_each_body_kind_answers_or_names_the_bad_field(bundles):
    svc = PredictionService(settings_for(None, max_batch_rows=8))
    svc.swap(bundles[0])
    bad = dict(ROW, prefix_cache_score=2)
    status, out = _json(svc.predict_bulk(json.dumps({"requests": [ROW, bad, ROW]}).encode()))
    assert status == 200 and out["predictions"][1] is None and out["successful_predictions"] == 2
    assert out["errors"][0]["index"] == 1 and out["errors"][0]["loc"] == ["body", "requests", 1, "prefix_cache_score"]
    assert out["predictions"][0] == {**out["predictions"][2], "predicted_at": out["predictions"][0]["predicted_at"]}
    status, out = _json(svc.predict_strict(json.dumps({"requests": [ROW, bad]}).encode()))
    assert status == 422 and out["detail"][0]["loc"] == ["body", "requests", 1, "prefix_cache_score"]
    status, out = _json(svc.predict_strict(json.dumps({"requests": [ROW] * 9}).encode()))
    assert status == 422 and out["detail"][0]["type"] == "too_long"
    status, out = _json(svc.whatif(json.dumps({"request": ROW, "grid": {"num_request_waiting": [0, 4, 8]}}).encode()))
    assert status == 200 and out["n_points"] == 3 and out["grid_fields"] == ["num_request_waiting"]
    assert out["points"][0]["ttft_ms"] <= out["points"][2]["ttft_ms"]      # a longer queue never waits less
    status, out = _json(svc.whatif(json.dumps({"request": ROW, "gird": {}}).encode()))
    assert status == 422 and out["detail"][0]["loc"] == ["body", "gird"]
    status, out = _json(svc.predict_one(b"{nope"))
    assert status == 422 and out["detail"][0]["loc"] == ["body"]
    text = svc.metrics.render().decode()
    assert 'latency_prediction_requests_total{endpoint="/predict/bulk/strict",status="422"} 2.0' in text
    assert 'latency_prediction_rows_predicted_total{source="learned"} 5.0' in text


def test_refusing_without_a_learned_model_is_503_until_one_is_served(bundles):
    svc = PredictionService(settings_for(None, refuse_without_model=True))
    status, out = _json(svc.predict_strict(json.dumps({"requests": [ROW]}).encode()))
    assert status == 503 and "no learned model" in out["detail"]
    svc.swap(bundles[0])
    assert svc.predict_strict(json.dumps({"requests": [ROW]}).encode())[0] == 200
