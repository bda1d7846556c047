"""The two baselines of docs/evaluation.md §1 on a recorded trace: the upstream XGBoost recipe
and linear quantile regression, each at the quantile, each only for targets with enough rows."""
from __future__ import annotations

import numpy as np

from load.demo_bundle import load_trace
from training_server.baselines import BASELINES, linear_predictions, upstream_predictions


def _split(n_train=600, n_test=400):
    raw, ttft, tpot = load_trace()
    return (raw[:n_train], ttft[:n_train], tpot[:n_train]), (raw[n_train:n_train + n_test],
                                                              ttft[n_train:n_train + n_test],
                                                              tpot[n_train:n_train + n_test])


def test_both_baselines_predict_every_target_near_the_quantile():
    assert BASELINES == ("upstream", "linear")
    (raw, ttft, tpot), (raw_t, ttft_t, tpot_t) = _split()
    for preds in (upstream_predictions(raw, ttft, tpot, raw_t, 0.9),
                  linear_predictions(raw, ttft, tpot, raw_t, 0.9)):
        assert set(preds) == {"ttft", "tpot"}
        for target, actual in (("ttft", ttft_t), ("tpot", tpot_t)):
            p, m = preds[target], actual > 0
            assert p.shape == (len(raw_t),) and np.isfinite(p).all()
            assert 0.8 < np.mean(actual[m] <= p[m]), target     # at q = 0.5 these cover 0.4 to 0.7


def test_a_target_with_too_few_rows_gets_no_baseline():
    (raw, ttft, tpot), (raw_t, _, _) = _split()
    few_tpot = np.where(np.arange(len(tpot)) < 10, tpot, 0.0)
    assert set(linear_predictions(raw, ttft, few_tpot, raw_t, 0.9)) == {"ttft"}
    assert set(upstream_predictions(raw, ttft, few_tpot, raw_t, 0.9)) == {"ttft"}
