"""Prediction server HTTP API: wire shapes, errors, prior/readiness, identical numbers, whatif.

Real servers: the app under uvicorn on loopback, real XGBoost/LightGBM bundles trained on
the recorded sharegpt trace (load.demo_bundle), loaded from a bundle dir.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import pytest

from features.bundle import read_bundle
from features.loaded import LoadedBundle
from features.schema import ROW_FIELDS, parse_row
from load.demo_bundle import build_bundle
from prediction_server.app import create_app
from support.prediction import ROW, settings_for, trace_rows, xgb_bundle_root
from support.servers import run_app

PRED_FIELDS = {
    "ttft_ms": float, "tpot_ms": float, "ttft_uncertainty": float, "tpot_uncertainty": float,
    "ttft_prediction_bounds": list, "tpot_prediction_bounds": list, "predicted_at": str, "model_type": str,
    "objective_type": str, "quantile": float, "last_model_load": str, "model_version": str, "model_source": str,
}


def wait_ready(client: httpx.Client, timeout: float = 20.0) -> None:
    import time

    end = time.monotonic() + timeout
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < end, "server never became ready"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def xgb_dir(tmp_path_factory) -> Path:
    return xgb_bundle_root(tmp_path_factory)


@pytest.fixture(scope="module")
def learned(xgb_dir):
    with run_app(create_app(settings_for(xgb_dir, max_batch_rows=100, max_body_bytes=64 * 1024))) as url:
        with httpx.Client(base_url=url, timeout=10) as c:
            wait_ready(c)
            yield c


@pytest.fixture(scope="module")
def prior_only():
    with run_app(create_app(settings_for(None, quantile_alpha=0.95))) as url:
        with httpx.Client(base_url=url, timeout=10) as c:
            yield c


def check_prediction(p: dict, version: str, source: str) -> None:
    assert set(p) >= set(PRED_FIELDS), set(PRED_FIELDS) - set(p)
    for k, t in PRED_FIELDS.items():
        assert isinstance(p[k], t), (k, p[k])
    assert p["ttft_ms"] >= 0 and p["tpot_ms"] >= 0
    for t in ("ttft", "tpot"):
        lo, hi = p[f"{t}_prediction_bounds"]
        assert 0 <= lo <= p[f"{t}_ms"] <= hi
        w = 1.645 * p[f"{t}_uncertainty"]
        assert hi == pytest.approx(p[f"{t}_ms"] + w)
        assert lo == pytest.approx(max(0.0, p[f"{t}_ms"] - w))
    datetime.fromisoformat(p["predicted_at"].replace("Z", "+00:00"))
    datetime.fromisoformat(p["last_model_load"].replace("Z", "+00:00"))
    assert p["model_version"] == version and p["model_source"] == source


# ---- wire shapes -----------------------------------------------------------------------

def test_strict_shape_and_row_order(learned, xgb_dir):
    rows = trace_rows(16)
    r = learned.post("/predict/bulk/strict", json={"requests": rows})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    d = r.json()
    assert d["total_requests"] == d["successful_predictions"] == 16 and d["failed_predictions"] == 0
    assert isinstance(d["processing_time_ms"], float) and d["processing_time_ms"] > 0
    version = d["model_version"]
    assert version.startswith("v000001-") and d["model_source"] == "learned"
    for p in d["predictions"]:
        check_prediction(p, version, "learned")
        assert p["model_type"] == "xgboost" and p["objective_type"] == "quantile" and p["quantile"] == 0.9
        assert p["ttft_uncertainty"] > 0  # from the manifest's residual_std
    # predictions in row order: the same as predicting each row alone
    singles = [learned.post("/predict", json=row).json()["ttft_ms"] for row in rows[:4]]
    assert singles == [p["ttft_ms"] for p in d["predictions"][:4]]
    assert len({p["ttft_ms"] for p in d["predictions"]}) > 1


def test_identical_numbers_on_every_endpoint_and_training_side(learned, xgb_dir):
    """The upstream pitfall: endpoints dropping features. Every path gives the same numbers."""
    manifest, files = read_bundle(sorted(xgb_dir.iterdir())[-1])
    offline = LoadedBundle.from_files(manifest, files)
    rows = trace_rows(6, start=7)
    rows[0].update(pod_type="decode", encoder_input_size=300, encoder_matched_size=100, prefix_cache_score=0.6)
    t_off, p_off = offline.predict(np.array([parse_row(r) for r in rows]))
    strict = learned.post("/predict/bulk/strict", json={"requests": rows}).json()["predictions"]
    bulk = learned.post("/predict/bulk", json={"requests": rows}).json()["predictions"]
    for i, row in enumerate(rows):
        one = learned.post("/predict", json=row).json()
        what = learned.post("/v1/whatif", json={"request": row, "grid": {}}).json()["points"][0]
        for got in (strict[i], bulk[i], one, what):
            assert got["ttft_ms"] == float(t_off[i]) and got["tpot_ms"] == float(p_off[i])


def test_bulk_shape_with_per_row_errors(learned):
    rows = trace_rows(4)
    bad = dict(rows[1], kv_cache_percentage=1.5)
    missing = {k: v for k, v in rows[2].items() if k != "input_token_length"}
    r = learned.post("/predict/bulk", json={"requests": [rows[0], bad, missing, rows[3], "nope"]})
    assert r.status_code == 200
    d = r.json()
    assert d["total_requests"] == 5 and d["successful_predictions"] == 2 and d["failed_predictions"] == 3
    preds = d["predictions"]
    assert preds[1] is None and preds[2] is None and preds[4] is None
    check_prediction(preds[0], d["model_version"], "learned")
    check_prediction(preds[3], d["model_version"], "learned")
    errs = {e["index"]: e for e in d["errors"]}
    assert set(errs) == {1, 2, 4}
    assert "kv_cache_percentage" in errs[1]["error"] and errs[1]["request"] == bad
    assert errs[1]["loc"] == ["body", "requests", 1, "kv_cache_percentage"]
    assert "input_token_length" in errs[2]["error"]
    assert errs[4]["request"] == "nope"
    # the same bad row fails the whole strict call
    r = learned.post("/predict/bulk/strict", json={"requests": [rows[0], bad]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "requests", 1, "kv_cache_percentage"]


def test_status_healthz_readyz_metrics(learned):
    s = learned.get("/status").json()
    assert s["is_ready"] is True and s["model_type"] == "xgboost" and s["objective_type"] == "quantile"
    assert s["quantile"] == 0.9 and s["models_exist"] == {"ttft": True, "tpot": True}
    assert s["model_version"].startswith("v000001-") and s["model_source"] == "learned"
    assert s["training_server_url"] is None
    datetime.fromisoformat(s["last_model_load"].replace("Z", "+00:00"))
    assert learned.get("/healthz").status_code == 200
    assert learned.get("/readyz").json()["model_version"] == s["model_version"]
    learned.post("/predict/bulk/strict", json={"requests": trace_rows(3)})
    learned.post("/predict/bulk/strict", json={"requests": []})
    m = learned.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    text = m.text
    assert 'latency_prediction_requests_total{endpoint="/predict/bulk/strict",status="200"}' in text
    assert 'latency_prediction_rows_predicted_total{source="learned"}' in text
    assert 'latency_prediction_requests_total{endpoint="/predict/bulk/strict",status="422"}' in text
    assert 'source="none"' not in text
    assert 'latency_prediction_request_seconds_bucket{endpoint="/predict/bulk/strict",le="0.0001"}' in text
    assert f'version="{s["model_version"]}"' in text
    assert "latency_prediction_bundle_age_seconds" in text
    assert 'latency_prediction_sync_attempts_total{result="updated"}' in text


def test_openapi_documents_bodies(learned):
    spec = learned.get("/openapi.json").json()
    for path in ("/predict/bulk/strict", "/predict/bulk", "/predict", "/v1/whatif"):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["type"] == "object"
    row = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(row["properties"]) == {f.name for f in ROW_FIELDS}
    assert "/bench/noop" not in spec["paths"]
    assert learned.post("/bench/noop", json={}).status_code in (404, 405)


# ---- bad input: documented 4xx naming the field, never a 500 ---------------------------

BAD_ROWS = [
    (dict(ROW, kv_cache_percentage="0.5"), "kv_cache_percentage", "type_error"),
    (dict(ROW, kv_cache_percentage=True), "kv_cache_percentage", "type_error"),  # booleans are not numbers
    (dict(ROW, num_request_waiting=False), "num_request_waiting", "type_error"),
    (dict(ROW, input_token_length=-1), "input_token_length", "range_error"),
    (dict(ROW, input_token_length=1.5), "input_token_length", "int_type"),
    (dict(ROW, prefix_cache_score=1.01), "prefix_cache_score", "range_error"),
    (dict(ROW, num_request_running=2**40), "num_request_running", "range_error"),
    (dict(ROW, kv_cache_percentage=None), "kv_cache_percentage", "type_error"),
    ({k: v for k, v in ROW.items() if k != "num_tokens_generated"}, "num_tokens_generated", "missing"),
    (dict(ROW, pod_type="gpu"), "pod_type", "enum_error"),
    (dict(ROW, encoder_input_size=1, encoder_matched_size=2), "encoder_matched_size", "range_error"),
]


@pytest.mark.parametrize("row,field,kind", BAD_ROWS, ids=[f"{b[1]}-{b[2]}-{i}" for i, b in enumerate(BAD_ROWS)])
def test_bad_rows_named(learned, row, field, kind):
    r = learned.post("/predict/bulk/strict", json={"requests": [ROW, row]})
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "requests", 1, field] and d["type"] == kind and d["msg"]
    r = learned.post("/predict", json=row)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field]
    r = learned.post("/predict/bulk", json={"requests": [ROW, row]})
    assert r.status_code == 200 and r.json()["errors"][0]["loc"] == ["body", "requests", 1, field]


def test_unknown_fields_ignored(learned):
    r = learned.post("/predict/bulk/strict", json={"requests": [dict(ROW, some_new_field=[1, 2])], "x": 1})
    assert r.status_code == 200


@pytest.mark.parametrize("path", ["/predict/bulk/strict", "/predict/bulk"])
@pytest.mark.parametrize("body,loc,kind", [
    (b"{not json", ["body"], "json_invalid"),
    (b"", ["body"], "json_invalid"),
    (b"[1, 2]", ["body"], "type_error"),
    (b"{}", ["body", "requests"], "missing"),
    (b'{"requests": null}', ["body", "requests"], "missing"),
    (b'{"requests": {"a": 1}}', ["body", "requests"], "type_error"),
    (b'{"requests": []}', ["body", "requests"], "too_short"),
    (json.dumps({"requests": [ROW] * 101}).encode(), ["body", "requests"], "too_long"),
    (b"\xff\xfe\x00", ["body"], "json_invalid"),
])
def test_malformed_bodies(learned, path, body, loc, kind):
    r = learned.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert d["loc"] == loc and d["type"] == kind


def test_body_too_large_413(learned):
    big = json.dumps({"requests": [dict(ROW, pad="x" * 1000)] * 80}).encode()
    assert len(big) > 64 * 1024
    for path in ("/predict/bulk/strict", "/predict/bulk", "/predict", "/v1/whatif"):
        r = learned.post(path, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "bytes" in r.json()["detail"][0]["msg"]

    def chunks():  # no content-length: the limit is enforced while reading
        for _ in range(100):
            yield b" " * 1024

    r = learned.post("/predict/bulk/strict", content=chunks())
    assert r.status_code == 413
    assert learned.post("/predict/bulk/strict", json={"requests": [ROW]}).status_code == 200  # still serving


# ---- prior before any bundle, refusing mode ----------------------------------------------

def test_prior_answers_before_any_bundle(prior_only):
    r = prior_only.post("/predict/bulk/strict", json={"requests": [ROW, dict(ROW, num_request_waiting=5)]})
    assert r.status_code == 200
    d = r.json()
    for p in d["predictions"]:
        check_prediction(p, "prior-default", "prior")
        assert p["model_type"] == "prior" and p["quantile"] == 0.95
    assert d["predictions"][1]["ttft_ms"] > d["predictions"][0]["ttft_ms"]  # queueing costs time
    assert prior_only.get("/readyz").status_code == 503
    s = prior_only.get("/status").json()
    assert s["is_ready"] is False and s["models_exist"] == {"ttft": False, "tpot": False}
    assert s["model_source"] == "prior"


def test_refuse_without_model_gives_503():
    with run_app(create_app(settings_for(None, refuse_without_model=True))) as url:
        with httpx.Client(base_url=url) as c:
            for path, body in (("/predict/bulk/strict", {"requests": [ROW]}), ("/predict/bulk", {"requests": [ROW]}),
                               ("/predict", ROW), ("/v1/whatif", {"request": ROW})):
                r = c.post(path, json=body)
                assert r.status_code == 503 and "no learned model" in r.json()["detail"]
            assert c.get("/readyz").status_code == 503 and c.get("/healthz").status_code == 200


def test_lightgbm_bundle_served(tmp_path):
    build_bundle(tmp_path, 3, "lightgbm")
    manifest, files = read_bundle(tmp_path / sorted(p.name for p in tmp_path.iterdir())[-1])
    offline = LoadedBundle.from_files(manifest, files)
    rows = trace_rows(5)
    t_off, p_off = offline.predict(np.array([parse_row(r) for r in rows]))
    with run_app(create_app(settings_for(tmp_path))) as url:
        with httpx.Client(base_url=url) as c:
            wait_ready(c)
            d = c.post("/predict/bulk/strict", json={"requests": rows}).json()
            assert [p["model_type"] for p in d["predictions"]] == ["lightgbm"] * 5
            assert [p["ttft_ms"] for p in d["predictions"]] == t_off.tolist()
            assert [p["tpot_ms"] for p in d["predictions"]] == p_off.tolist()
            assert c.get("/status").json()["model_type"] == "lightgbm"


# ---- what-if -----------------------------------------------------------------------------

def test_whatif_grid(learned):
    req = {k: v for k, v in ROW.items() if k != "num_request_waiting"}
    r = learned.post("/v1/whatif", json={"request": req, "grid": {"num_request_waiting": [0, 2, 8],
                                                                  "input_token_length": [100, 4000]}})
    assert r.status_code == 200
    d = r.json()
    assert d["n_points"] == 6 and len(d["points"]) == 6 and d["model_source"] == "learned"
    combos = [(p["values"]["num_request_waiting"], p["values"]["input_token_length"]) for p in d["points"]]
    assert combos == [(0, 100), (0, 4000), (2, 100), (2, 4000), (8, 100), (8, 4000)]
    batch = learned.post("/predict/bulk/strict", json={"requests": [
        dict(req, num_request_waiting=w, input_token_length=n) for w, n in combos]}).json()["predictions"]
    assert [p["ttft_ms"] for p in d["points"]] == [p["ttft_ms"] for p in batch]
    assert [p["tpot_ms"] for p in d["points"]] == [p["tpot_ms"] for p in batch]


@pytest.mark.parametrize("body,loc", [
    ({"request": ROW, "grid": {"num_request_waiting": list(range(50)), "input_token_length": list(range(50))}},
     ["body", "grid"]),  # 2500 > max_points (capped by LATENCY_MAX_BATCH_ROWS=100)
    ({"request": ROW, "grid": {"num_request_waiting": [0, 1]}, "max_points": 1}, ["body", "grid"]),
    ({"request": ROW, "max_points": 0}, ["body", "max_points"]),
    ({"request": ROW, "max_points": True}, ["body", "max_points"]),
    ({"request": ROW, "grid": {"gpu_count": [1, 2]}}, ["body", "grid", "gpu_count"]),
    ({"request": ROW, "grid": {"kv_cache_percentage": [0.5, 2.0]}}, ["body", "grid", "kv_cache_percentage", 1]),
    ({"request": ROW, "grid": {"kv_cache_percentage": "high"}}, ["body", "grid", "kv_cache_percentage"]),
    ({"request": ROW, "grid": {"kv_cache_percentage": []}}, ["body", "grid", "kv_cache_percentage"]),
    ({"request": dict(ROW, input_token_length=-5), "grid": {}}, ["body", "request", "input_token_length"]),
    ({"request": {"kv_cache_percentage": 0.5}, "grid": {}}, ["body", "request", "input_token_length"]),
    ({"request": [1], "grid": {}}, ["body", "request"]),
    ({"request": ROW, "grid": [1]}, ["body", "grid"]),
    ([], ["body"]),
    # typos are refused, not ignored (the bulk endpoints ignore unknown row fields, as llm-d's do)
    ({"request": dict(ROW, num_request_wating=8), "grid": {}}, ["body", "request", "num_request_wating"]),
    ({"request": ROW, "grids": {"num_request_waiting": [0, 8]}}, ["body", "grids"]),
])
def test_whatif_errors(learned, body, loc):
    r = learned.post("/v1/whatif", json=body)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == loc
    if loc[-1] in ("num_request_wating", "grids"):
        assert r.json()["detail"][0]["msg"].startswith("unknown field; ")
