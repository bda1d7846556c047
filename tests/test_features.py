"""The one feature definition: validation, raw columns, model matrix, prior, bundles."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from features import FieldError, RAW_COLUMNS, model_matrix, parse_row, parse_training_entry, raw_matrix, row_from_raw
from features.bundle import BundleError, list_bundles, make_version, prune_bundles, read_bundle, validate_manifest, write_bundle
from features.matrix import FEATURES, UPSTREAM_FEATURES, monotone_constraints, regimes, schema_description
from features.prior import DEFAULT_PRIOR, LinearPrior, fit_linear_quantile

BASE = {"kv_cache_percentage": 0.5, "input_token_length": 1000, "num_request_waiting": 2,
        "num_request_running": 3, "num_tokens_generated": 0, "prefix_cache_score": 0.25}


def test_parse_row_defaults_and_order():
    raw = parse_row(BASE)
    assert len(raw) == len(RAW_COLUMNS)
    d = dict(zip(RAW_COLUMNS, raw))
    assert d["kv_cache_percentage"] == 0.5 and d["input_token_length"] == 1000
    assert d["pod_type"] == 0 and d["prefill_tokens_in_flight"] == 0 and d["encoder_matched_size"] == 0
    assert parse_row({**BASE, "pod_type": "decode"})[RAW_COLUMNS.index("pod_type")] == 2
    # unknown fields are ignored, never an error
    assert parse_row({**BASE, "some_future_field": [1, 2]}) == raw


@pytest.mark.parametrize("field,value,kind", [
    ("kv_cache_percentage", 1.5, "range_error"),
    ("kv_cache_percentage", -0.1, "range_error"),
    ("prefix_cache_score", 2, "range_error"),
    ("input_token_length", -1, "range_error"),
    ("input_token_length", 1.5, "int_type"),
    ("input_token_length", "12", "type_error"),
    ("num_request_waiting", True, "type_error"),
    ("num_request_running", None, "type_error"),
    ("pod_type", "gpu", "enum_error"),
    ("pod_type", 3, "type_error"),
    ("input_token_length", 2**40, "range_error"),
])
def test_parse_row_rejects_with_field_named(field, value, kind):
    with pytest.raises(FieldError) as e:
        parse_row({**BASE, field: value}, ("requests", 4))
    assert e.value.loc == ("requests", 4, field)
    assert e.value.kind == kind
    assert field in str(e.value)


def test_missing_field_and_non_object():
    row = dict(BASE)
    del row["prefix_cache_score"]
    with pytest.raises(FieldError) as e:
        parse_row(row)
    assert e.value.loc == ("prefix_cache_score",) and e.value.kind == "missing"
    with pytest.raises(FieldError):
        parse_row([1, 2, 3])


def test_encoder_matched_not_above_input():
    with pytest.raises(FieldError) as e:
        parse_row({**BASE, "encoder_input_size": 3, "encoder_matched_size": 4})
    assert e.value.loc[-1] == "encoder_matched_size"


def test_integral_float_accepted_for_int_fields():
    assert parse_row({**BASE, "input_token_length": 12.0})[1] == 12.0


def test_training_entry_targets_zero_means_absent():
    e = parse_training_entry({**BASE, "actual_ttft_ms": 120.5, "actual_tpot_ms": 0,
                              "timestamp": "2026-08-01T10:00:00Z", "predicted_ttft_ms": 100, "model_version": "v1"})
    assert e.actual_ttft_ms == 120.5 and e.actual_tpot_ms == 0 and e.predicted_ttft_ms == 100
    assert e.timestamp == pytest.approx(1785578400.0)
    with pytest.raises(FieldError, match="both 0"):
        parse_training_entry({**BASE, "actual_ttft_ms": 0, "actual_tpot_ms": 0})
    with pytest.raises(FieldError) as err:
        parse_training_entry({**BASE, "actual_ttft_ms": math.inf, "actual_tpot_ms": 0})
    assert err.value.loc[-1] == "actual_ttft_ms"
    with pytest.raises(FieldError) as err:
        parse_training_entry({**BASE, "actual_ttft_ms": 5, "actual_tpot_ms": 0, "timestamp": "yesterday"})
    assert err.value.loc[-1] == "timestamp"


def test_row_round_trip(sharegpt_rows):
    for r in sharegpt_rows[:50]:
        raw = parse_row(r)
        assert parse_row(row_from_raw(raw)) == raw


def test_model_matrix_columns_match_definitions(sharegpt_rows):
    raw = raw_matrix(sharegpt_rows[:64])
    for target in ("ttft", "tpot"):
        x = model_matrix(raw, target)
        assert x.shape == (64, len(FEATURES[target]))
        assert len(monotone_constraints(target)) == x.shape[1]
    x = model_matrix(raw, "ttft")
    cols = FEATURES["ttft"]
    pfx, inp = raw[:, RAW_COLUMNS.index("prefix_cache_score")], raw[:, RAW_COLUMNS.index("input_token_length")]
    np.testing.assert_allclose(x[:, cols.index("uncached_input_tokens")], (1 - pfx) * inp)
    up = model_matrix(raw, "ttft", UPSTREAM_FEATURES["ttft"])
    assert up.shape[1] == len(UPSTREAM_FEATURES["ttft"])
    # the same row gives the same numbers however it is batched (one builder, no batch effects)
    single = np.vstack([model_matrix(raw[i:i + 1], "ttft") for i in range(8)])
    np.testing.assert_array_equal(single, x[:8])


def test_raw_matrix_names_the_row():
    rows = [dict(BASE), {**BASE, "kv_cache_percentage": "full"}]
    with pytest.raises(FieldError) as e:
        raw_matrix(rows)
    assert e.value.loc == ("requests", 1, "kv_cache_percentage")
    assert raw_matrix([]).shape == (0, len(RAW_COLUMNS))


def test_regimes():
    raw = raw_matrix([{**BASE, "num_request_waiting": 0, "kv_cache_percentage": 0.1},
                      {**BASE, "num_request_waiting": 3, "kv_cache_percentage": 0.9}])
    assert list(regimes(raw)) == [0, 3]


def test_default_prior_is_monotone_and_positive():
    prior = LinearPrior()
    rows = [dict(BASE, num_request_waiting=w) for w in range(5)]
    ttft, tpot = prior.predict(raw_matrix(rows), "ttft"), prior.predict(raw_matrix(rows), "tpot")
    assert (np.diff(ttft) > 0).all() and (tpot > 0).all()
    with pytest.raises(ValueError, match="unknown feature"):
        LinearPrior({"ttft": {"intercept": 1, "coef": {"bogus": 1}}, "tpot": DEFAULT_PRIOR["tpot"]})


def test_linear_quantile_min_rise_without_sign_constraint():
    """A positive min_rise floors a coefficient also when signs are free (it used to compare
    the missing lower bound None with the floor and raise TypeError)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (40, 2))
    y = -1.0 * x[:, 0] + 2.0 * x[:, 1] - 3.0
    intercept, coef = fit_linear_quantile(x, y, 0.5, non_negative=False)
    assert intercept == pytest.approx(-3.0) and coef == pytest.approx([-1.0, 2.0])
    floor = 5.0 / np.abs(x[:, 0]).max()
    intercept, coef = fit_linear_quantile(x, y, 0.5, non_negative=False, min_rise=np.array([5.0, 0.0]))
    assert coef[0] >= floor - 1e-9 and intercept < 0  # the floor holds, the intercept may still be negative
    _, coef = fit_linear_quantile(x, y, 0.5, non_negative=True, min_rise=np.array([5.0, 0.0]))
    assert coef[0] >= floor - 1e-9 and (coef >= 0).all()


def _primal_pinball(x, y, q, w, lower):
    """The optimal pinball loss by the textbook primal LP (one equality per row): the reference
    the fast dual formulation must reach."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, hstack, identity

    n, p = x.shape
    a = hstack([csr_matrix(np.c_[x, np.ones(n)]), identity(n, format="csr"), -identity(n, format="csr")], format="csr")
    cost = np.r_[np.zeros(p + 1), q * w, (1 - q) * w]
    bounds = [(None if not np.isfinite(v) else v, None) for v in lower] + [(0, None)] * (2 * n)
    res = linprog(cost, A_eq=a, b_eq=y, bounds=bounds, method="highs")
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("non_negative", [True, False])
@pytest.mark.parametrize("q", [0.5, 0.9])
def test_linear_quantile_reaches_the_primal_optimum(non_negative, q):
    """The dual solve finds the exact optimum: its pinball loss equals the primal LP's, with the
    sign constraints and slope floors (including binding ones) respected, weighted or not."""
    rng = np.random.default_rng(3)
    n = 300
    x = rng.gamma(2.0, 1.0, (n, 4)) * np.array([1000.0, 3.0, 20.0, 0.5])
    y = 20 + x @ np.array([0.1, -4.0, 2.0, 0.0]) + rng.exponential(50, n)
    w = rng.uniform(0.5, 2.0, n)
    rise = np.array([0.0, 0.0, 0.0, 30.0])  # column 3 has no effect: its floor binds
    for weights in (None, w):
        ww = np.ones(n) if weights is None else weights
        intercept, coef = fit_linear_quantile(x, y, q, ww if weights is not None else None, non_negative, rise)
        floors = rise / np.abs(x).max(axis=0)
        assert coef[3] == pytest.approx(floors[3], rel=1e-6)
        if non_negative:
            assert intercept >= 0 and (coef >= 0).all() and coef[1] == pytest.approx(0, abs=1e-9)
        lo = 0.0 if non_negative else -np.inf
        lower = np.r_[np.where(floors > 0, floors, lo), lo]
        r = y - intercept - x @ coef
        ours = float(np.sum(ww * np.where(r > 0, q * r, (q - 1) * r)))
        assert ours == pytest.approx(_primal_pinball(x, y, q, ww, lower), rel=1e-6)


def test_linear_quantile_without_rows_returns_the_bounds():
    intercept, coef = fit_linear_quantile(np.zeros((0, 2)), np.zeros(0), 0.9)
    assert intercept == 0.0 and list(coef) == [0.0, 0.0]


def _manifest(seq: int, models: dict | None = None) -> dict:
    return {"version": make_version(seq), "schema_version": 1, "features": schema_description(),
            "model_kind": "prior" if not models else "xgboost", "objective": "quantile", "quantile": 0.9,
            "mode": "e2e", "models": models or {}, "prior": DEFAULT_PRIOR}


def test_bundle_write_read_verify_prune(tmp_path):
    data = b'{"not": "a real model, only bytes for the checksum path"}'
    spec = {"ttft": {"file": "ttft.json", "format": "xgboost-json", "size": 0, "sha256": "0" * 64}}
    path = write_bundle(tmp_path, _manifest(1, spec), {"ttft.json": data})
    manifest, files = read_bundle(path)
    assert files["ttft.json"] == data and manifest["models"]["ttft"]["size"] == len(data)
    # tampering is detected
    (path / "ttft.json").write_bytes(data[:-3])
    with pytest.raises(BundleError, match="size"):
        read_bundle(path)
    (path / "ttft.json").write_bytes(data[:-3] + b"xyz")
    with pytest.raises(BundleError, match="sha256"):
        read_bundle(path)
    for seq in range(2, 6):
        write_bundle(tmp_path, _manifest(seq), {})
    assert [p.name.split("-")[0] for p in list_bundles(tmp_path)] == ["v000001", "v000002", "v000003", "v000004", "v000005"]
    prune_bundles(tmp_path, keep=2)
    assert [p.name.split("-")[0] for p in list_bundles(tmp_path)] == ["v000004", "v000005"]


@pytest.mark.parametrize("mutate,msg", [
    (lambda m: m.update(schema_version=999), "schema_version"),
    (lambda m: m.update(model_kind="pickle"), "model_kind"),
    (lambda m: m.update(quantile=1.5), "quantile"),
    (lambda m: m.update(version="../../etc"), "version"),
    (lambda m: m.update(models={"ttft": {"file": "../x.json", "format": "xgboost-json", "size": 1, "sha256": "0" * 64}},
                        model_kind="xgboost"), "file"),
    (lambda m: m["features"].update(raw_columns=["a"]), "raw_columns"),
])
def test_manifest_validation_names_the_key(mutate, msg):
    m = json.loads(json.dumps(_manifest(1)))
    mutate(m)
    with pytest.raises(BundleError, match=msg):
        validate_manifest(m)
