"""A cluster of endpoints whose load grows with the index, and the reference wiring on the built-in prior."""
from __future__ import annotations

import random

from epp_client import Endpoint, EndpointMetrics, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.predictor import InProcessPredictor
from epp_client.profiles import REFERENCE_CONFIG
from epp_client.training import ListSink
from features.loaded import LoadedBundle


def cluster(n=8):
    # load grows with the index: queue, running, KV use
    return [Endpoint(name=f"pod{i}-rank-0", address=f"10.0.0.{i}", port=8000,
                     metrics=EndpointMetrics(kv_cache_usage=min(0.9, 0.1 * i), waiting_queue_size=i // 2,
                                             running_requests_size=i), prefix_match=PrefixMatch(0, 50))
            for i in range(n)]


def prior_predictor():
    bundle = LoadedBundle.builtin_prior()
    return InProcessPredictor(lambda: bundle)


def ref(predictor=None, sink=None, seed=1, config=REFERENCE_CONFIG):
    return build_scheduler(config, predictor=predictor if predictor is not None else prior_predictor(),
                           sink=sink if sink is not None else ListSink(), rng=random.Random(seed))
