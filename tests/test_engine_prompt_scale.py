"""The engine's prompt tokens per estimated token, learned from the responses' usage."""
from __future__ import annotations

import random

import pytest

from epp_client.engine.prompt_scale import PromptScale


def test_it_is_one_until_enough_responses_report_their_count_then_their_median_ratio():
    s = PromptScale(window=64, min_samples=8)
    for _ in range(20):
        s.observe(1000, None)           # no usage reported: nothing learned
    assert s.factor == 1.0 and s.tokens(1000) == 1000
    rng = random.Random(1)
    for i in range(7):
        s.observe(1000, 700)
    assert s.factor == 1.0              # 7 < min_samples
    for i in range(200):
        est = rng.randint(100, 20_000)
        s.observe(est, round(est * 0.7 * rng.lognormvariate(0.0, 0.1)))
    assert s.factor == pytest.approx(0.7, rel=0.05)
    assert s.tokens(10_000) == pytest.approx(7_000, rel=0.05) and s.tokens(1) == 1 and s.tokens(0) == 0


def test_the_newest_window_decides_and_outliers_do_not():
    s = PromptScale(window=32, min_samples=8)
    for _ in range(100):
        s.observe(1000, 1400)
    assert s.factor == pytest.approx(1.4)
    for _ in range(10):
        s.observe(1000, 100_000)        # a few absurd counts move the median nowhere
    assert s.factor == pytest.approx(1.4)
    for _ in range(32):
        s.observe(1000, 900)            # the workload changed: the window follows
    assert s.factor == pytest.approx(0.9)


def test_bounds_and_bad_settings():
    s = PromptScale(window=8, min_samples=1, lo=0.5, hi=2.0)
    s.observe(100, 1000)
    assert s.factor == 2.0
    with pytest.raises(ValueError):
        PromptScale(window=4, min_samples=8)
