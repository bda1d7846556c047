"""Live feedback of the training server: (actual, predicted) pairs of entries that carry a
prediction, split into the served bundle's live-error window and the correction backlog."""
from __future__ import annotations

import numpy as np

from features.schema import parse_training_entry
from training_server.feedback import LiveFeedback, pair_entries

BASE = {"kv_cache_percentage": 0.2, "input_token_length": 100, "num_request_waiting": 0,
        "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0,
        "actual_ttft_ms": 120.0, "actual_tpot_ms": 0.0}


def _entry(**kw):
    return parse_training_entry({**BASE, **kw})


def test_pairs_go_live_for_the_served_version_and_to_correction_for_learned_ones():
    entries = [_entry(predicted_ttft_ms=100.0, predicted_tpot_ms=9.0, model_version="v-served"),
               _entry(predicted_ttft_ms=90.0, model_version="v-old"),
               _entry(predicted_ttft_ms=80.0, model_version="prior-default"),
               _entry(predicted_ttft_ms=70.0),                 # no version: counts as the served one
               _entry()]                                       # no prediction: nothing
    live, corr = pair_entries(entries, "v-served", lambda v: v.startswith("v-"))
    assert live == {"ttft": [(120.0, 100.0), (120.0, 70.0)], "tpot": []}   # TPOT actual 0: no pair
    assert corr == {"ttft": [(120.0, 100.0, "v-served"), (120.0, 90.0, "v-old")], "tpot": []}


def test_the_backlog_is_taken_once_and_the_window_scores_and_detects_drift():
    fb = LiveFeedback(quantile=0.9, live_window=300)
    fb.observe({"ttft": [(150.0, 100.0)] * 250}, {"ttft": [(150.0, 100.0, "v1"), (90.0, 100.0)]})
    actual, predicted, versions = fb.take("ttft")
    assert actual.tolist() == [150.0, 90.0] and predicted.tolist() == [100.0, 100.0] and versions == ["v1", None]
    assert fb.take("ttft")[0].size == 0 and fb.added == {"ttft": 2, "tpot": 0}
    scores = fb.live_scores()
    assert set(scores) == {"ttft"} and scores["ttft"]["n"] == 250 and scores["ttft"]["coverage"] == 0.0
    assert fb.drifting(min_n=200) == ["ttft"] and fb.drifting(min_n=251) == []
    fb.observe({"ttft": [(50.0, 100.0)] * 300})                 # the window keeps the last 300
    assert fb.live_scores()["ttft"]["coverage"] == 100.0 and np.isclose(fb.live_scores()["ttft"]["n"], 300)
    fb.reset_live()
    assert fb.live_scores() == {}
