"""epp_client.framework.profile: a scheduling profile clamps each scorer's scores to [0, 1] and sums them by weight."""
from __future__ import annotations

import random

import pytest

from epp_client import Endpoint, InferenceRequest
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import (
    KVCacheUtilizationScorer,
    MaxScorePicker,
    QueueScorer,
)
from support.scheduling import cluster


def test_profile_clamps_scores_and_applies_weights():
    class Raw:
        def __init__(self, values):
            self.values = values

        def score(self, request, endpoints):
            return dict(self.values)

    eps = [Endpoint(name="a"), Endpoint(name="b")]
    prof = SchedulingProfile("p", [], [(Raw({"a": 1.01, "b": -3.0}), 2.0), (Raw({"a": 0.25, "b": float("nan")}), 4.0)],
                             MaxScorePicker(rng=random.Random(1)))
    res = Scheduler(profiles=prof).schedule(InferenceRequest(), eps)
    assert res.scores == {"a": 2.0 + 1.0, "b": 0.0} and res.picked[0].name == "a"


def test_queue_and_kv_scorers_in_a_profile():
    prof = SchedulingProfile("h", [], [(QueueScorer(), 2.0), (KVCacheUtilizationScorer(), 2.0)],
                             MaxScorePicker(rng=random.Random(1)))
    res = Scheduler(profiles=[prof]).schedule(InferenceRequest(), cluster(4))
    # queues 0, 0, 1, 1 and KV 0, 0.1, 0.2, 0.3
    assert res.scores == pytest.approx({"pod0-rank-0": 4.0, "pod1-rank-0": 3.8, "pod2-rank-0": 1.6, "pod3-rank-0": 1.4})
    assert res.picked[0].name == "pod0-rank-0"
