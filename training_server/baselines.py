"""The two baselines of docs/evaluation.md §1, trained on the same rows as ours and scored alike.

* ``upstream``: the llm-d reference recipe (:data:`training_server.trainer.UPSTREAM_XGB`,
  ``recipe="upstream"``: its hyper-parameters and features, XGBoost ``reg:quantileerror``, no
  constraints, no calibration), served through the same LoadedBundle.
* ``linear``: linear quantile regression at the same quantile (exact pinball minimum by linear
  programming, :func:`features.prior.fit_linear_quantile`, unconstrained signs) on §1's
  features: TTFT on uncached prompt tokens, prefill tokens in flight, waiting, running and KV
  use; TPOT on running, KV use, decode tokens in flight and input length.
"""
from __future__ import annotations

import numpy as np

from features.matrix import TARGETS, model_matrix
from features.prior import fit_linear_quantile

from . import trainer

BASELINES = ("upstream", "linear")
LINEAR_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("uncached_input_tokens", "prefill_tokens_in_flight", "num_request_waiting", "num_request_running",
             "kv_cache_percentage"),
    "tpot": ("num_request_running", "kv_cache_percentage", "decode_tokens_in_flight", "input_token_length"),
}


def upstream_predictions(raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, raw_test: np.ndarray,
                         quantile: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Per target with a model: predictions of the upstream recipe on ``raw_test``."""
    cfg = trainer.TrainConfig(model_type="xgboost", objective="quantile", quantile=quantile, recipe="upstream",
                              calibrate=False, seed=seed)
    res = trainer.train_models(raw, ttft, tpot, config=cfg)
    if not res.models:
        return {}
    pred = dict(zip(TARGETS, trainer.loaded_bundle(res).predict(raw_test)))
    return {t: pred[t] for t in res.models}


def linear_predictions(raw: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, raw_test: np.ndarray,
                       quantile: float, min_rows: int = 30) -> dict[str, np.ndarray]:
    """Per target with at least ``min_rows`` rows (target > 0): linear quantile predictions."""
    out: dict[str, np.ndarray] = {}
    for t, y in (("ttft", ttft), ("tpot", tpot)):
        m = y > 0
        if m.sum() < min_rows:
            continue
        names = LINEAR_FEATURES[t]
        intercept, coef = fit_linear_quantile(model_matrix(raw[m], t, names), y[m], quantile, non_negative=False)
        out[t] = model_matrix(raw_test, t, names) @ coef + intercept
    return out
