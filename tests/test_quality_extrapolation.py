"""Predictions beyond anything seen in training (issue 11).

The simulator's ramp trace (recorded by this repository: ``load.record_traces``) takes load
from 0.5 to 1.4 of capacity; a model trained on its first half has seen queues only up to a
point. Through the served bundle (written, read back, loaded by the prediction server's
LoadedBundle), TTFT keeps rising at 2x, 5x and 10x the largest queued work seen in training,
and TPOT at 2x, 5x and 10x the largest number of running requests; and the forward protocol
on the ramp covers what a tree model alone cannot.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from features.bundle import BundleError, make_version, read_bundle, validate_manifest, write_bundle
from features.schema import COL
from load import record_traces
from features.loaded import LoadedBundle
from training_server import evaluate, trainer

from conftest import SHAREGPT

QUEUE = ("num_request_waiting", "prefill_tokens_in_flight")   # queued work ahead of a request
BATCH = ("num_request_running", "decode_tokens_in_flight")    # the decode batch


@pytest.fixture(scope="module")
def ramp(tmp_path_factory):
    out = tmp_path_factory.mktemp("ramp")
    assert record_traces.main([str(out), "--only", "sim-ramp"]) == 0
    return evaluate.read_trace(out / "sim-ramp.jsonl")


def _served(tmp_path, raw, ttft, tpot, **cfg) -> LoadedBundle:
    result = trainer.train_models(raw, ttft, tpot, config=evaluate.production_config(**cfg))
    manifest, files = trainer.build_bundle(result, make_version(1))
    return LoadedBundle.from_files(*read_bundle(write_bundle(tmp_path, manifest.to_json(), files)))


def test_the_ramp_trace_is_deterministic_and_ramps(ramp, tmp_path):
    assert record_traces.main([str(tmp_path), "--only", "sim-ramp"]) == 0
    again = evaluate.read_trace(tmp_path / "sim-ramp.jsonl")
    np.testing.assert_array_equal(again.raw, ramp.raw)
    np.testing.assert_array_equal(again.ttft, ramp.ttft)
    n = len(ramp)
    wait = ramp.raw[:, COL["num_request_waiting"]]
    kv = ramp.raw[:, COL["kv_cache_percentage"]]
    # light load first, then queues and a full KV cache (preemptions) past anything seen before
    assert wait[: n // 10].max() <= 5 and wait[-n // 10:].max() > 10 * max(1.0, wait[: n // 2].mean())
    assert np.median(kv[: n // 10]) < 0.5 and np.median(kv[-n // 10:]) > 0.95
    first, last = ramp.ttft[: n // 10], ramp.ttft[-n // 10:]
    assert np.median(last[last > 0]) > 50 * np.median(first[first > 0])


@pytest.mark.parametrize("link", ["beyond", "add", "ratio"])
@pytest.mark.parametrize("source", ["ramp", "sharegpt"])
def test_predictions_keep_rising_past_the_largest_work_seen(ramp, tmp_path, link, source):
    tr = ramp if source == "ramp" else evaluate.read_trace(SHAREGPT)
    half = len(tr) // 2
    raw, ttft, tpot = tr.raw[:half], tr.ttft[:half], tr.tpot[:half]
    bundle = _served(tmp_path, raw, ttft, tpot, base_link=link)
    assert {t: b["link"] for t, b in bundle.manifest.to_json()["base"].items()} == {"ttft": link, "tpot": link}
    for target, cols, rows in ((0, QUEUE, ttft > 0), (1, BATCH, tpot > 0)):
        seen = raw[rows]
        top = seen[np.argmax(seen[:, COL[cols[0]]])]  # the busiest row seen, as served features
        probe = np.repeat(top[None, :], 4, axis=0)
        for i, mult in enumerate((1.0, 2.0, 5.0, 10.0)):
            for c in cols:
                probe[i, COL[c]] = max(1.0, seen[:, COL[c]].max()) * mult
        y = bundle.predict(probe)[target]
        assert np.all(np.diff(y) > 0), (("ttft", "tpot")[target], y)
        # and not by a rounding error: 10x the work costs clearly more than the largest seen
        assert y[3] > 1.2 * y[0], (("ttft", "tpot")[target], y)


@pytest.fixture(scope="module")
def ramp_forward(ramp):
    return evaluate.evaluate_trace(ramp)["ttft"]


def test_forward_protocol_on_the_ramp_covers_where_trees_alone_do_not(ramp_forward):
    res = ramp_forward
    up, lin = res["baselines"]["upstream"], res["baselines"]["linear"]
    assert up["coverage"] < 50                       # trees predict a constant past the last queue seen
    # 85% measured: the model ships as calibrated on the newest 15% of its rows, and each next
    # block of a ramp lies further out than they did (the linear baseline: 78%)
    assert 80 <= res["coverage"] <= 95 and res["coverage"] > lin["coverage"]
    assert res["pinball"] < 0.3 * up["pinball"]


def test_forward_protocol_on_the_ramp_beats_the_linear_baseline(ramp_forward):
    # 576 against 631 ms measured (docs/forward-accuracy.md): TTFT's trees are fitted on all but
    # the newest 15% of the rows, and the line of queued work on all of them
    assert ramp_forward["pinball"] < ramp_forward["baselines"]["linear"]["pinball"]


@pytest.mark.parametrize("change, needle", [
    ({"link": "log"}, "base.ttft.link"),
    ({"coef": {"num_request_waiting": -1.0}}, "base.ttft.coef.num_request_waiting"),
    ({"coef": {"bogus": 1.0}}, "unknown feature 'bogus'"),
    ({"upper": {}}, "base.ttft.upper"),
    ({"upper": {"num_request_waiting": "x"}}, "base.ttft.upper"),
    ({"link": "ratio"}, "base.ttft.floor"),
    ({"link": "ratio", "floor": 0.0}, "base.ttft.floor"),
    ({"link": "ratio", "floor": "NaN"}, "base.ttft.floor"),
])
def test_a_malformed_base_is_refused_naming_the_field(tmp_path, change, needle):
    tr = evaluate.read_trace(SHAREGPT)
    result = trainer.train_models(tr.raw[:600], tr.ttft[:600], tr.tpot[:600],
                                  config=evaluate.production_config(base_link="beyond"))
    manifest, files = trainer.build_bundle(result, make_version(3))
    good = json.loads(json.dumps(manifest.to_json()))
    validate_manifest(good)
    bad = json.loads(json.dumps(manifest.to_json()))
    bad["base"]["ttft"] = {"intercept": 1.0, "coef": {"num_request_waiting": 1.0}, "link": "beyond",
                           "upper": {"num_request_waiting": 3.0}}
    bad["base"]["ttft"].update(change)
    with pytest.raises(BundleError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        validate_manifest(bad)


def test_the_ratio_link_multiplies_the_trees_by_the_base_and_never_by_less_than_its_floor():
    """link "ratio": prediction = trees x max(intercept + x . coef, floor), so past the range seen
    the prediction grows in proportion to the work; below the floor the floor holds."""
    from features.prior import LinearBase, validate_base, with_base

    spec = validate_base({"ttft": {"intercept": 10.0, "coef": {"num_request_waiting": 100.0}, "link": "ratio",
                                   "floor": 50.0}})
    names = ("num_request_waiting",)
    x = np.array([[0.0], [1.0], [10.0], [100.0]])
    trees = np.array([1.5, 1.5, 1.5, 1.5])
    y = with_base(trees, x, *LinearBase(spec).applier("ttft", names))
    np.testing.assert_allclose(y, [1.5 * 50.0, 1.5 * 110.0, 1.5 * 1010.0, 1.5 * 10010.0])


def test_trees_that_cannot_answer_an_ordinary_row_give_way_to_the_base_alone(tmp_path):
    """sim-high-kv has no short prompt on an idle server: from the fifth forward fold on, TTFT
    trees answer the probe rows (features.loaded.probe_rows, which every served bundle must
    answer with a positive latency) with <= 0. Even with the base alone off as a selection
    candidate, it stands in for them: every fold's bundle loads and answers. (With the additive
    links: trees over the base by link "ratio" answer the base's floor times a positive ratio.)"""
    assert record_traces.main([str(tmp_path), "--only", "sim-high-kv"]) == 0
    tr = evaluate.read_trace(tmp_path / "sim-high-kv.jsonl")
    additive = ("beyond", "add")
    cfg = evaluate.production_config(base_alone={}, auto_links={"ttft": additive, "tpot": additive})
    alone = 0
    for seed, train, _ in evaluate.folds(len(tr))[2:]:
        result = trainer.train_models(tr.raw[train], tr.ttft[train], tr.tpot[train],
                                      config=trainer.with_config(cfg, seed=seed))
        bundle = trainer.loaded_bundle(result)  # BundleError if a target cannot answer the probe rows
        assert bundle.has_model("ttft") and bundle.has_model("tpot")
        alone += bundle.manifest.base_only("ttft")
    assert alone >= 1


def test_a_recorded_trace_has_no_ttft_for_a_request_whose_client_left_before_its_first_token(tmp_path):
    """A router never observes the TTFT of a request whose client left before the first token
    (the simulator's client deadline): such a request is no training entry, never one with a
    made-up TTFT. Overloaded servers and a 0.5 s deadline: every client leaves, most of them
    before their first token."""
    from load import simulate_cli

    path = tmp_path / "t.jsonl"
    assert simulate_cli.main(["--scenario", "high-kv", "--policies", "llmd-default", "--load", "2", "--limit", "300",
                              "--deadline", "0.5", "--seed", "0", "--record-trace", str(path),
                              "--out", str(tmp_path / "run"), "--no-plots", "--quiet"]) == 0
    run = json.loads((tmp_path / "run" / "results.json").read_text())["results"]["2"]["llmd-default"]
    assert run["requests"] == run["abandoned"] == 300
    tr = evaluate.read_trace(path)
    ttft = tr.ttft[tr.ttft > 0]
    assert 0 < len(ttft) < 30                       # the few first tokens that came in time, and only those
    assert ttft.max() < 500.0                       # each within the deadline
    assert not (tr.tpot > 0).any()                  # no request finished: no TPOT either
