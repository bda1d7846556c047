"""``oracle-harm``: the per-request oracle that also counts the harm a placement does.

The per-request oracle (:class:`~load.sim.routers.OracleScheduler`) places a request where *it*
is served best. A prompt's prefill slows every step of the server it lands on, and with it the
decode of every request already running there: on ``standard`` at 80% load the oracle misses
TPOT for 6% of the requests, as often as the heuristics, and fails 7% in all. This oracle, with
the same true server state, scores each candidate by

1. the number of requests this placement pushes over their TPOT SLO: the server is simulated
   forward (no later arrivals) with the request until its first token plus ``decode_probe``
   decode steps, and without it to the same moment; a request running there counts when its
   TPOT so far (its final TPOT if it finished) is over its SLO with the request and not without;
2. plus 1 if the request itself would miss its SLO there (the oracle's score above 1);

and breaks ties by the oracle's score (max of TTFT / TTFT SLO and TPOT / TPOT SLO). Like the
oracle it is a reference for what routing can reach, not a policy a router can run: it knows
every server's true state. It is not in the default sweep (``--policies oracle-harm``).
"""
from __future__ import annotations

from epp_client.engine.model import Outcome

from .driver import LifecycleRouter, doc_note
from .request import SimRequest
from .routers import OracleScheduler


class HarmOracleScheduler(OracleScheduler):
    __doc__ = __doc__

    name = "oracle-harm"

    def __init__(self, rng, decode_probe: int = 4, max_steps: int = 400) -> None:
        super().__init__(rng, decode_probe, max_steps)
        self.missed = 0   # placements where even the best candidate costs a miss (its own or another's)

    @staticmethod
    def _over_tpot(reqs: list[SimRequest], t: float) -> int:
        """Requests whose TPOT so far at ``t`` (final TPOT once finished) is over their TPOT SLO."""
        n = 0
        for r in reqs:
            if r.tpot_slo_ms <= 0 or r.first_token_t < 0 or r.generated < 2:
                continue
            tpot = r.tpot_ms if r.generated >= r.output_len else (t - r.first_token_t) * 1000.0 / (r.generated - 1)
            n += tpot > r.tpot_slo_ms
        return n

    def outcome(self, idx: int, req: SimRequest, now: float) -> tuple[int, float, float]:
        """Placing ``req`` on server ``idx`` now, the truth: (requests pushed over their TPOT SLO,
        its TTFT from now in ms, inf when not within ``max_steps``; its TPOT over the probe steps)."""
        _, probe, t_end, running = self._run_with(idx, req, now)
        over_with = self._over_tpot(running, t_end)
        base, t0 = self._start(idx, now)
        over_without = self._over_tpot([*base.running, *base.waiting], self._advance(base, t0, until_t=t_end))
        harm = max(0, over_with - over_without)
        if probe.first_token_t < 0:
            return harm, float("inf"), float("inf")
        gen = probe.generated - 1
        tpot = (t_end - probe.first_token_t) * 1000.0 / gen if gen > 0 else 0.0
        return harm, (probe.first_token_t - now) * 1000.0, tpot

    def _harm_score(self, idx: int, req: SimRequest, now: float) -> tuple[float, float]:
        harm, ttft, tpot = self.outcome(idx, req, now)
        # not even its first token within max_steps: as bad as it gets here
        own = float("inf") if ttft == float("inf") else self._score(req, ttft, tpot)[0]
        return harm + (own > 1.0), own

    def route(self, req, now):
        best, best_score = None, None
        for i in range(len(self._sim().servers)):
            score = self._harm_score(i, req, now)
            if best_score is None or score < best_score:
                best, best_score = i, score
        if best_score is not None and best_score[0] >= 1:
            self.missed += 1
        return best

    def stats(self) -> dict:
        return {"oracle_forward_steps": self.forward_steps, "oracle_placements_with_a_miss": self.missed}


class HarmOracleRouter(LifecycleRouter):
    """The harm-aware oracle (:class:`HarmOracleScheduler`)."""

    def __init__(self, seed: int = 0, decode_probe: int = 4, max_steps: int = 400) -> None:
        super().__init__("oracle-harm", lambda rng, clock, wall: HarmOracleScheduler(rng, decode_probe, max_steps),
                         seed, description=doc_note(HarmOracleScheduler))


TRUE_HARM_PARTS = ("all", "harm", "own")


class TrueHarm:
    """``simulate --true-harm [PART]``: the ``decode-harm-filter`` / ``decode-harm-scorer`` of a
    predicted policy judge placements with the simulator's truth instead of their engine twin, to
    see what a better estimate could give a profile (as ``--true-latencies`` does for the latency
    predictions). The truth reaches the plugins through their one engine interface
    (:class:`epp_client.engine.model.EngineModel`, :meth:`use_engine_model`): per candidate, the
    server simulated forward ``probe`` decode steps past the request's first token
    (:meth:`HarmOracleScheduler.outcome`); the plugins' rule (own miss, ``maxLateness``, adapter
    and KV terms, holds) is unchanged:

    - ``all``: the true outcome (requests pushed over their TPOT SLO, the request's TTFT and TPOT);
    - ``harm``: the true requests pushed over, the request's own TTFT and TPOT from the twin;
    - ``own``: the twin's harm, the request's true TTFT and TPOT."""

    def __init__(self, part: str = "all", probe: int = 4) -> None:
        import random

        if part not in TRUE_HARM_PARTS:
            raise ValueError(f"true harm: part {part!r} is not one of {', '.join(TRUE_HARM_PARTS)}")
        if probe < 1:
            raise ValueError(f"true harm: probe must be at least 1 decode step, got {probe}")
        self.part = part
        self.router: LifecycleRouter | None = None
        self.oracle = HarmOracleScheduler(random.Random(0), decode_probe=probe)

    def bind(self, router: LifecycleRouter) -> None:
        self.router = router

    def install(self, scheduler) -> int:
        """Give the harm plugins of ``scheduler``'s profiles the true engine model; how many."""
        from epp_client.plugins.filter.decode_harm import DecodeHarmCount

        n = 0
        for profile in scheduler.profiles:
            for plugin in (*profile.filters, *(s for s, _ in profile.scorers)):
                if isinstance(plugin, DecodeHarmCount):
                    plugin.use_engine_model(TrueEngine(self, plugin.engine_model))
                    n += 1
        return n

    def outcome(self, endpoint_name: str) -> Outcome:
        """The truth of placing the request being scheduled on that endpoint, now."""
        router = self.router
        if router is None or router.sim is None or router.current is None:
            raise RuntimeError("true harm: asked outside a scheduling decision of a bound router")
        self.oracle.bind(router.sim, router)
        return Outcome(*self.oracle.outcome(router.by_name[endpoint_name], router.current, router.sim.now))


class TrueEngine:
    """An engine model (``epp_client.engine.model.EngineModel``) answering with the truth, or for
    ``--true-harm harm`` / ``own`` with one part of it over the ``estimate``'s."""

    def __init__(self, truth: TrueHarm, estimate) -> None:
        self.truth, self.estimate = truth, estimate

    def placement(self, request, endpoint, prompt: int, cached: int) -> Outcome:
        true = self.truth.outcome(endpoint.name)
        part = self.truth.part
        if part == "all":
            return true
        est = self.estimate.placement(request, endpoint, prompt, cached)
        return true._replace(ttft_ms=est.ttft_ms, tpot_ms=est.tpot_ms) if part == "harm" else est._replace(
            ttft_ms=true.ttft_ms, tpot_ms=true.tpot_ms)
