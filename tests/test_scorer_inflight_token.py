"""plugins/scorer/inflight_token.py: least in-flight uncached prompt tokens first, from the scheduler's own count."""
from __future__ import annotations

import random

from epp_client.framework.loader import build_scheduler
from support.lifecycle import PREFIX_CONFIG, eps, req


def test_inflight_token_scorer_from_config_follows_the_schedulers_own_count():
    s = build_scheduler(PREFIX_CONFIG, rng=random.Random(0))
    cands = eps(2)
    first = s.schedule(req(1, tokens=500), cands)
    s.pre_request(req(1, tokens=500), first)
    busy = first.endpoint.name
    second = s.schedule(req(2), cands)
    assert second.endpoint.name != busy and second.scores[busy] == 0.0
    s.on_first_chunk("r1")                      # tokens released: both equal again
    assert s.inflight.snapshot(busy).tokens == 0 and s.inflight.snapshot(busy).requests == 1
    s.on_complete("r1")
    assert s.inflight.snapshot(busy).requests == 0
