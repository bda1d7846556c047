"""Random feature rows for the predictor client and the built-in prior's answers for them."""
from __future__ import annotations

import random

from features.loaded import LoadedBundle
from features.matrix import raw_matrix


def rows(n=16, seed=0):
    rng = random.Random(seed)
    return [{"kv_cache_percentage": rng.random(), "input_token_length": rng.randrange(1, 4000),
             "num_request_waiting": rng.randrange(0, 5), "num_request_running": rng.randrange(0, 20),
             "num_tokens_generated": 0, "prefix_cache_score": rng.random(),
             "prefill_tokens_in_flight": rng.randrange(0, 5000)} for _ in range(n)]


def expected(rs):
    t, p = LoadedBundle.builtin_prior().predict(raw_matrix(rs))
    return t, p
