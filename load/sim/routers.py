"""Heuristic routing policies in the loop, on the request lifecycle, and the oracle.

Each router is the simulator's :class:`~load.sim.driver.LifecycleRouter` driving a
policy of :mod:`epp_client.heuristics` (``random``, ``round-robin``, ``least-queue``:
fewest requests in flight as counted by the policy's own in-flight tracker) or the
oracle below. The llm-d policies (``llmd-default``, ``llmd-token-load``,
``predicted-upstream``, ``predicted-llmd``, ``predicted``) live in ``epp_routers`` and run epp_client's plugins.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

from epp_client.heuristics import HeuristicScheduler, LeastRequestsScheduler, RandomScheduler, RoundRobinScheduler

from .driver import LifecycleRouter, doc_note
from .request import SimRequest

if TYPE_CHECKING:
    from .engine import Simulation
    from .server import ModelServer


class RandomRouter(LifecycleRouter):
    """Uniformly random endpoint (seeded)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("random", lambda rng, clock, wall: RandomScheduler(rng), seed)


class RoundRobinRouter(LifecycleRouter):
    """Endpoints in turn."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("round-robin", lambda rng, clock, wall: RoundRobinScheduler(rng), seed)


class LeastQueueRouter(LifecycleRouter):
    """Fewest requests in flight as counted by the router itself (like a least-request
    load balancer: exact, never stale); ties broken at random."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("least-queue", lambda rng, clock, wall: LeastRequestsScheduler(rng), seed)


class OracleRouter(LifecycleRouter):
    """The per-request oracle (:class:`OracleScheduler`)."""

    def __init__(self, seed: int = 0, decode_probe: int = 4, max_steps: int = 150) -> None:
        super().__init__("oracle", lambda rng, clock, wall: OracleScheduler(rng, decode_probe, max_steps), seed,
                         description=doc_note(OracleScheduler))


class OracleScheduler(HeuristicScheduler):
    """Per-request oracle (the design's "upper bound"; myopic, so not a bound under overload):
    for each candidate, clone the true server state, add the request and
    simulate forward (no later arrivals) until its first token plus ``decode_probe``
    decode steps; pick the endpoint with the smallest SLO-normalised latency
    max(TTFT/TTFT_SLO, TPOT/TPOT_SLO) (raw TTFT when the request has no SLO). Myopic: it
    knows every server's true state but not future arrivals. For speed, candidates are
    visited in order of an optimistic TTFT bound and skipped once the bound cannot beat
    the best probe; a queue deeper than ``max_steps`` full steps is scored by the bound
    instead of being simulated, and a probe is cut at ``max_steps`` steps and extrapolated. A
    stretch where every request on the clone decodes is taken in one go (the same steps:
    :meth:`~load.sim.server.ModelServer.decode_stretch`)."""

    name = "oracle"

    def __init__(self, rng: random.Random, decode_probe: int = 4, max_steps: int = 150) -> None:
        super().__init__(rng)
        self.sim: Simulation | None = None
        self.driver: LifecycleRouter | None = None
        self.decode_probe = decode_probe
        self.max_steps = max_steps
        self.forward_steps = 0
        self.pruned = 0
        self.extrapolated = 0

    def bind(self, sim, driver: LifecycleRouter) -> None:
        """The oracle sees the simulation (true server state) and the simulated request."""
        self.sim, self.driver = sim, driver

    def _sim(self) -> Simulation:
        if self.sim is None:
            raise RuntimeError("oracle: not bound to a simulation (its LifecycleRouter binds it)")
        return self.sim

    def order(self, request, candidates):
        if self.driver is None:
            raise RuntimeError("oracle: not bound to a LifecycleRouter")
        idx = self.route(self.driver.current, self._sim().now)   # the driver's simulation: bound together
        return [] if idx is None else [candidates[idx]]

    def _start(self, idx: int, now: float) -> tuple[ModelServer, float]:
        """A clone of server ``idx`` and the time it starts from: the step in progress on the real
        server ends at its scheduled time."""
        srv = self._sim().servers[idx].clone()
        t = now
        if srv._batch:
            t = self._step_end(idx)
            srv.finish_step(t, None, None)
        return srv, t

    def _run_with(self, idx: int, req: SimRequest, now: float) -> tuple[ModelServer, SimRequest, float, list]:
        """Server ``idx`` cloned, a fresh copy of ``req`` added and run until its first token plus
        ``decode_probe`` decode steps: (the clone, the copy, the time reached, the clone's requests
        from before the copy was added)."""
        srv, t = self._start(idx, now)
        before = [*srv.running, *srv.waiting]
        probe = req.clone()
        probe.reset_progress()
        probe.hit_tokens = -1
        srv.add(probe, now)
        t = self._advance(srv, t, probe=probe, want=min(probe.output_len, 1 + self.decode_probe))
        return srv, probe, t, before

    def probe(self, idx: int, req: SimRequest, now: float) -> tuple[float, float]:
        """(TTFT ms, TPOT ms) of ``req`` on server ``idx`` from its true state (no later arrivals)."""
        srv, probe, t, _ = self._run_with(idx, req, now)
        if probe.first_token_t < 0:
            # extrapolate: remaining prompt tokens queued ahead at the full budget's pace
            spec = srv.spec
            ahead = sum(r.target - r.computed for r in (*srv.running, *srv.waiting))
            b = spec.max_num_batched_tokens
            t += (ahead / b) * spec.step_ms(b, 0, 0, 0) / 1000.0
            return (t - now) * 1000.0, spec.step_ms(b, 0, 0, 0)
        ttft = (probe.first_token_t - now) * 1000.0
        gen_after = probe.generated - 1
        tpot = (t - probe.first_token_t) * 1000.0 / gen_after if gen_after > 0 else 0.0
        return ttft, tpot

    def _advance(self, srv, t: float, until_t: float | None = None, probe: SimRequest | None = None,
                 want: int = 0) -> float:
        """Run the cloned server ``srv`` forward from ``t`` until ``probe`` has ``want`` tokens or
        the clock passes ``until_t`` (at most ``max_steps`` steps); the time reached."""
        steps = 0
        while steps < self.max_steps:
            if probe is not None and probe.generated >= want:
                break
            if until_t is not None and t >= until_t:
                break
            # a stretch where all decode, in one go (the probe stops at its want-th token)
            limit = self.max_steps - steps
            if probe is not None:
                limit = min(limit, want - probe.generated)
            t, k = srv.decode_stretch(t, limit, until_t)
            if k:
                steps += k
                continue
            dur = srv.plan_step(t)
            if dur <= 0:
                break
            t += dur
            srv.finish_step(t, None, None)
            steps += 1
        self.forward_steps += steps
        return t

    def _step_end(self, idx: int) -> float:
        return self._sim().servers[idx].busy_until

    def _score(self, req, ttft: float, tpot: float) -> tuple[float, float]:
        if req.ttft_slo_ms > 0 or req.tpot_slo_ms > 0:
            return (max(ttft / req.ttft_slo_ms if req.ttft_slo_ms > 0 else 0.0,
                        tpot / req.tpot_slo_ms if req.tpot_slo_ms > 0 else 0.0), ttft)
        return (ttft, tpot)

    def _ttft_bound(self, idx: int, req, now: float) -> tuple[float, int]:
        """Optimistic TTFT in ms and the prompt tokens it counts: every prompt token ahead of
        this request in FCFS order (and its own uncached ones) at the best per-token pace of a
        full step. Waiting requests are credited with today's cache hits (later hits from
        requests ahead are not foreseen)."""
        srv = self._sim().servers[idx]
        kv, bs = srv.kv, srv.bs
        ahead = 0
        for r in srv.running:
            ahead += r.target - r.computed
        for r in srv.waiting:
            _, pages = kv.match(r.segments, r.full_pages)
            ahead += max(1, r.target - pages * bs)
        _, pages = kv.match(req.segments, req.full_pages)
        ahead += max(1, req.input_len - pages * bs)
        spec = srv.spec
        b = spec.max_num_batched_tokens
        t0 = max(0.0, self._step_end(idx) - now) if srv._batch else 0.0
        return t0 * 1000.0 + ahead * spec.step_ms(b, 0, 0, 0) / b, ahead

    def route(self, req, now):
        servers = self._sim().servers
        n = len(servers)
        order = list(range(n))
        self.rng.shuffle(order)
        bounds = []
        for k, i in enumerate(order):
            ms, ahead = self._ttft_bound(i, req, now)
            bounds.append((self._score(req, ms, 0.0), k, i, ms, ahead))
        bounds.sort()
        best, best_score = None, None
        for lb, _, i, ms, ahead in bounds:
            if best_score is not None and lb >= best_score:
                self.pruned += 1
                continue
            spec = servers[i].spec
            b = spec.max_num_batched_tokens
            if ahead > self.max_steps * b:
                # too deep a queue to simulate forward: score the optimistic bound, with the
                # TPOT of prefill-saturated steps
                self.extrapolated += 1
                score = self._score(req, ms, spec.step_ms(b, 0, 0, 0))
            else:
                score = self._score(req, *self.probe(i, req, now))
            if best_score is None or score < best_score:
                best, best_score = i, score
        return best

    def stats(self) -> dict:
        return {"oracle_forward_steps": self.forward_steps, "oracle_pruned_candidates": self.pruned,
                "oracle_extrapolated_candidates": self.extrapolated}


NATIVE = {"random": RandomRouter, "round-robin": RoundRobinRouter, "least-queue": LeastQueueRouter,
          "oracle": OracleRouter}
