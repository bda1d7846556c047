"""``python -m load.feature_ceiling``: flexible learners against the linear baseline on random splits."""
from __future__ import annotations

import json

import numpy as np

from features.schema import COL, RAW_COLUMNS
from load import feature_ceiling
from training_server.evaluate import Trace

from conftest import SHAREGPT, load_jsonl


def _trace(ttft: np.ndarray, raw: np.ndarray) -> Trace:
    n = len(ttft)
    z = np.zeros(n)
    return Trace("synthetic", raw, ttft, z, z, z, z)


def _raw(rng: np.random.Generator, n: int) -> np.ndarray:
    raw = np.zeros((n, len(RAW_COLUMNS)))
    raw[:, COL["input_token_length"]] = rng.integers(100, 8000, n)
    raw[:, COL["num_request_waiting"]] = rng.integers(0, 6, n)
    raw[:, COL["num_request_running"]] = rng.integers(0, 30, n)
    raw[:, COL["kv_cache_percentage"]] = rng.uniform(0, 1, n)
    return raw


def test_an_interaction_the_line_cannot_draw_is_found_by_the_learners():
    rng = np.random.default_rng(0)
    raw = _raw(rng, 1500)
    # queueing multiplies the prompt's cost: a product of two features, small noise
    ttft = 50 + 0.05 * raw[:, COL["input_token_length"]] * (1 + raw[:, COL["num_request_waiting"]]) ** 2
    ttft *= rng.uniform(0.97, 1.03, len(ttft))
    r = feature_ceiling.ceiling(_trace(ttft, raw), splits=1)["ttft"]
    assert r["n"] == 1500 and set(r["pinball"]) == {"linear", *feature_ceiling.LEARNERS}
    assert r["best_ratio"] < 0.3, r


def test_noise_the_features_do_not_explain_keeps_every_learner_near_the_line():
    rng = np.random.default_rng(1)
    raw = _raw(rng, 1500)
    # a line of the prompt plus heavy noise no feature carries
    ttft = 80 + 0.2 * raw[:, COL["input_token_length"]] + rng.exponential(300.0, len(raw))
    r = feature_ceiling.ceiling(_trace(ttft, raw), splits=1)["ttft"]
    assert r["best_ratio"] > 0.9, r
    assert "tpot" not in feature_ceiling.ceiling(_trace(ttft, raw), splits=1,
                                                 learners={"xgboost-d6": feature_ceiling.LEARNERS["xgboost-d6"]})


def test_cli_on_a_real_trace_prints_json_and_a_table(tmp_path, capsys):
    p = tmp_path / "part.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in load_jsonl(SHAREGPT, limit=600)))
    assert feature_ceiling.main([str(p), "--splits", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["splits"] == 1 and set(doc["traces"]["part"]) == {"ttft", "tpot"}
    for r in doc["traces"]["part"].values():
        assert r["pinball"]["linear"] > 0 and r["best"] in feature_ceiling.LEARNERS
        assert r["best_ratio"] == min(r["ratio"].values())
    assert feature_ceiling.main([str(p), "--splits", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| trace | target |") and "| part | ttft |" in out


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert feature_ceiling.main([str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
