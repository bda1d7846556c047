"""The engine step model's fit (training_server.engine_fit): coefficients per class and a speed per
endpoint recovered from synthetic rows with outliers, the trimming that makes it robust, and the
minimum rows per class and per endpoint."""
from __future__ import annotations

import math

import numpy as np
import pytest

from features.schema import ENGINE_COEFFICIENTS
from training_server.engine_fit import fit_engine

TRUE = np.array([3.0, 0.06, 7e-5, 8.0, 3e-6])
SPEEDS = {"a0": 0.5, "a1": 0.55, "a2": 1.0, "a3": 1.1, "a4": 0.95, "a5": 1.05}


def synthetic_rows(n: int, seed: int = 0, outliers: float = 0.05):
    rng = np.random.default_rng(seed)
    eps = rng.choice(list(SPEEDS), n)
    steps = rng.integers(1, 60, n).astype(float)
    tok = steps * rng.uniform(10, 2048, n)
    f = np.c_[steps, tok, steps * rng.uniform(0, 5e5, n), np.minimum(steps, rng.integers(0, 60, n)),
              rng.uniform(0, 1, n) * tok ** 2 / 2]
    y = f @ TRUE / np.array([SPEEDS[e] for e in eps]) * rng.lognormal(0, 0.03, n)
    slow, fast = rng.random(n) < outliers, rng.random(n) < outliers
    y[slow] *= rng.uniform(3, 10, slow.sum())     # e.g. preempted requests: far slower than the twin says
    y[fast] *= rng.uniform(0.02, 0.1, fast.sum())  # e.g. a prompt far shorter than the router estimated
    return eps, f, y


def test_the_fit_recovers_coefficients_and_speeds_through_outliers():
    eps, f, y = synthetic_rows(3000)
    section = fit_engine(["llama|a100"] * len(y), eps, f, y)
    assert section is not None
    c = section["classes"]["llama|a100"]
    g = math.exp(np.mean(np.log(list(SPEEDS.values()))))   # the speeds are relative to their geometric mean
    for name, true in zip(ENGINE_COEFFICIENTS, TRUE):
        assert c["coefficients"][name] * g == pytest.approx(true, rel=0.1), name
    for e, s in SPEEDS.items():
        assert c["endpoints"][e]["speed"] == pytest.approx(s / g, rel=0.02), e
    assert c["n_train"] + c["n_heldout"] == 3000 and c["n_heldout"] == 300
    assert c["heldout_error"] < 0.05
    assert sum(e["n"] for e in c["endpoints"].values()) == c["n_train"]


def test_the_fit_without_trimming_is_pulled_off_by_the_outliers():
    eps, f, y = synthetic_rows(3000)
    g = math.exp(np.mean(np.log(list(SPEEDS.values()))))

    def worst(fit: dict) -> float:   # the coefficients not confounded with another (per step, per decode step)
        return max(abs(fit["coefficients"][k] * g / t - 1) for k, t in zip(ENGINE_COEFFICIENTS, TRUE)
                   if k not in ("fixed_ms", "decode_ms"))

    robust = fit_engine(["k"] * len(y), eps, f, y)["classes"]["k"]
    plain = fit_engine(["k"] * len(y), eps, f, y, trim=0.0)["classes"]["k"]
    assert worst(robust) < 0.05 and worst(plain) > 0.2
    assert robust["heldout_error"] < plain["heldout_error"]


def test_minimum_rows_per_class_and_per_endpoint():
    eps, f, y = synthetic_rows(400)
    classes = ["big"] * 360 + ["small"] * 40
    eps = np.array(["lonely"] * 10 + list(eps[10:]))     # 10 rows in class big: too few for its own speed
    section = fit_engine(classes, eps, f, y, min_class_rows=50, min_endpoint_rows=20)
    assert set(section["classes"]) == {"big"}
    assert "lonely" not in section["classes"]["big"]["endpoints"] and "a0" in section["classes"]["big"]["endpoints"]
    assert fit_engine(["small"] * 40, eps[:40], f[:40], y[:40]) is None
