"""The prior: a small non-negative linear model used before any learned model exists.

It is fully described by JSON-able coefficients, so it travels inside a bundle manifest
(the trainer fits one from the first samples) and a built-in default answers from the
very first request. Coefficients are in ms per unit of the named model feature.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .matrix import FEATURES, model_matrix

#: Features the prior may use, per target (a subset of FEATURES[target]).
PRIOR_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("uncached_input_tokens", "prefill_tokens_in_flight", "num_request_waiting",
             "num_request_running", "kv_cache_percentage"),
    "tpot": ("num_request_running", "decode_tokens_in_flight", "kv_cache_percentage",
             "input_token_length", "prefill_tokens_in_flight"),
}

#: Conservative analytic default (roughly a 7-8B model on one A100, p90-ish): prefill
#: ~0.2 ms per uncached token, queued work ~0.1 ms per token, a queued request costs a
#: whole prefill slot; decode ~20 ms plus batch and context pressure.
DEFAULT_PRIOR: dict[str, dict] = {
    "ttft": {"intercept": 60.0, "coef": {"uncached_input_tokens": 0.2, "prefill_tokens_in_flight": 0.1,
                                         "num_request_waiting": 150.0, "num_request_running": 4.0,
                                         "kv_cache_percentage": 100.0}},
    "tpot": {"intercept": 20.0, "coef": {"num_request_running": 0.6, "decode_tokens_in_flight": 0.0002,
                                         "kv_cache_percentage": 15.0, "input_token_length": 0.001,
                                         "prefill_tokens_in_flight": 0.002}},
}


def validate_prior(params: Mapping) -> dict[str, dict]:
    """Check a prior description (from a manifest); raise ValueError naming the problem."""
    out: dict[str, dict] = {}
    for target in ("ttft", "tpot"):
        p = params.get(target)
        if not isinstance(p, Mapping):
            raise ValueError(f"prior.{target} missing")
        intercept = float(p.get("intercept", 0.0))
        coef = p.get("coef", {})
        if not isinstance(coef, Mapping):
            raise ValueError(f"prior.{target}.coef must be an object")
        for name, w in coef.items():
            if name not in FEATURES[target]:
                raise ValueError(f"prior.{target}.coef: unknown feature {name!r}")
            if not np.isfinite(float(w)):
                raise ValueError(f"prior.{target}.coef.{name} is not finite")
        if not np.isfinite(intercept):
            raise ValueError(f"prior.{target}.intercept is not finite")
        out[target] = {"intercept": intercept, "coef": {k: float(v) for k, v in coef.items()}}
    return out


class LinearPrior:
    """Evaluates a prior on raw matrices; vectors precomputed once per bundle."""

    def __init__(self, params: Mapping | None = None) -> None:
        self.params = validate_prior(params or DEFAULT_PRIOR)
        self._w: dict[str, tuple[float, np.ndarray]] = {}
        for target, p in self.params.items():
            names = FEATURES[target]
            w = np.zeros(len(names))
            for name, value in p["coef"].items():
                w[names.index(name)] = value
            self._w[target] = (p["intercept"], w)

    def predict_matrix(self, x: np.ndarray, target: str) -> np.ndarray:
        """Predict from a model matrix already built for ``target``."""
        intercept, w = self._w[target]
        return np.maximum(x @ w + intercept, 0.0)

    def predict(self, raw: np.ndarray, target: str) -> np.ndarray:
        return self.predict_matrix(model_matrix(raw, target), target)
