"""Heuristic routing policies on the request lifecycle (:mod:`epp_client.framework.lifecycle`).

No plugins and no predictions: each orders the candidates by a fixed rule, and counts
its in-flight requests with an :class:`~epp_client.plugins.producer.inflight_load.InFlightTracker` (shareable,
so a fallback and the scheduler it stands in for count in one place). Subclasses only
define ``order(request, candidates)``: best first, empty to drop the request.

- :class:`RandomScheduler` (``random``): uniformly random;
- :class:`RoundRobinScheduler` (``round-robin``): in turn;
- :class:`LeastRequestsScheduler` (``least-queue``): fewest requests in flight (exact,
  never stale, like a least-request load balancer), ties at random;
- :class:`LeastLoadScheduler` (``builtin-least-load``): prefix score minus normalised
  in-flight requests minus normalised waiting queue, ties at random (the gateway's router
  without a config, and its fallback when the configured scheduler fails).
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from epp_client.framework.lifecycle import ProfileResult, SchedulingResult, candidates_for, ensure_request_id
from epp_client.framework.protocols import InFlightLoadProducer
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.types import ADMITTED, Endpoint, InferenceRequest

PROFILE = "default"


class HeuristicScheduler:
    name = "heuristic"
    producer = None
    prefix_producer = None

    def __init__(self, rng: random.Random | None = None, inflight: InFlightLoadProducer | None = None) -> None:
        self.rng = rng or random.Random()
        self.inflight: InFlightLoadProducer = inflight if inflight is not None else InFlightTracker()

    def order(self, request: InferenceRequest, candidates: list[Endpoint]) -> list[Endpoint]:
        raise NotImplementedError

    def schedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                 now: float | None = None) -> SchedulingResult:
        rid = ensure_request_id(request)
        candidates = candidates_for(endpoints, self.inflight)
        if not candidates:
            return SchedulingResult(rid, [], {}, ADMITTED, status=503, reason="rejected-no-endpoints")
        picked = self.order(request, candidates)
        if not picked:
            return SchedulingResult(rid, [], {}, ADMITTED, candidates=candidates, status=429,
                                    reason="rejected-saturated")
        return SchedulingResult(rid, picked, {}, ADMITTED, {PROFILE: ProfileResult(PROFILE, picked[:1], {})},
                                candidates)

    async def aschedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                        now: float | None = None) -> SchedulingResult:
        return self.schedule(request, endpoints, now)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult, now: float | None = None, *,
                    endpoint: Endpoint | None = None) -> None:
        target = endpoint if endpoint is not None else result.endpoint
        if target is not None:
            self.inflight.pre_request(request, {PROFILE: target})

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        self.inflight.on_first_chunk(request_id)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        pass

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        self.inflight.on_complete(request_id)


class RandomScheduler(HeuristicScheduler):
    name = "random"

    def order(self, request, candidates):
        return [candidates[self.rng.randrange(len(candidates))]]


class RoundRobinScheduler(HeuristicScheduler):
    name = "round-robin"

    def __init__(self, rng: random.Random | None = None, inflight: InFlightLoadProducer | None = None) -> None:
        super().__init__(rng, inflight)
        self.next = 0

    def order(self, request, candidates):
        i = self.next % len(candidates)
        self.next = (i + 1) % len(candidates)
        return [candidates[i]]


class LeastRequestsScheduler(HeuristicScheduler):
    name = "least-queue"

    def order(self, request, candidates):
        load = [c.inflight.requests for c in candidates]
        m = min(load)
        best = [c for c, x in zip(candidates, load) if x == m]
        return [best[0] if len(best) == 1 else self.rng.choice(best)]


class LeastLoadScheduler(HeuristicScheduler):
    name = "builtin-least-load"

    def order(self, request, candidates):
        return self.rank(candidates)

    def rank(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """All of ``endpoints``, best first (the gateway's retry order too)."""
        if not endpoints:
            return []
        inflight = [self.inflight.snapshot(e.name).requests if e.inflight is None else e.inflight.requests
                    for e in endpoints]
        waiting = [e.metrics.waiting_queue_size if e.metrics is not None else 0 for e in endpoints]
        max_inf = max(inflight) or 1
        max_q = max(waiting) or 1
        keyed = []
        for e, n, q in zip(endpoints, inflight, waiting):
            prefix = e.prefix_match.score if e.prefix_match is not None else 0.0
            keyed.append(((-(prefix - n / max_inf - q / max_q), self.rng.random()), e))
        keyed.sort(key=lambda k: k[0])
        return [e for _, e in keyed]
