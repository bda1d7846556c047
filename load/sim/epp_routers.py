"""The llm-d policies in the loop, running epp_client's real decision code.

Each policy is an ``epp_client.framework.scheduler.Scheduler`` driven through its request
lifecycle by :class:`~load.sim.driver.LifecycleRouter` with simulated time (candidates
carry the *scraped* metrics, the approximate prefix producer's match and the
scheduler's own in-flight counters). Predicted-latency policies learn online (``online.OnlineLearner``: the training
server's store, retrain worker and registry in process, retraining on simulated time) or
use real servers on loopback (``RunOptions.predictor_url`` / ``training_url``).
``predicted`` runs the recommended profile, ``predicted-llmd`` and ``predicted-upstream``
llm-d's predicted-latency-slo config (:data:`PREDICTED_CONFIGS`); with
``RunOptions.opt_in_share`` their config becomes an opt-in one
(``epp_client.plugins.handler.opt_in.with_opt_in``) and that share of requests carries the header.
"""
from __future__ import annotations

import json
import random
from typing import Any

import numpy as np

from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile, default_profile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import InFlightTokenScorer, LoraAffinityScorer, MaxScorePicker, PrefixCacheAffinityFilter
from epp_client.plugins.handler.opt_in import HANDLER_TYPE as OPT_IN_HANDLER
from epp_client.plugins.handler.opt_in import with_opt_in
from epp_client.plugins.producer.inflight_load import InFlightTracker
from epp_client.profiles import PREDICTED_LATENCY_SLO_CONFIG, RECOMMENDED_CONFIG
from features.scoring import pinball_loss

from .driver import LifecycleRouter

__all__ = ["make", "PREDICTED_LORA_HISTORY_CONFIG"]
#: Weight of lora-affinity-scorer next to the default profile's queue 2 / KV 2 / prefix 3.
LORA_WEIGHT = 2.0
#: The recommended predicted-latency profile with its lora-affinity-scorer remembering what
#: this router sent where (``requestHistory: true``; docs/multi-lora.md §3).
PREDICTED_LORA_HISTORY_CONFIG = RECOMMENDED_CONFIG.replace(
    "- type: lora-affinity-scorer\n", "- type: lora-affinity-scorer\n  parameters:\n    requestHistory: true\n", 1)
_SLO_WIRING = ("streaming producer, affinity filters, SLO tier filter, latency scorer preferring the least headroom, "
               "weighted-random picker")
#: policy -> (EndpointPickerConfig, description)
PREDICTED_CONFIGS = {
    "predicted": (RECOMMENDED_CONFIG, "predicted latency, the recommended profile (well-known config "
                                      "predicted-latency-recommended: predicted-latency-slo with the decode-harm "
                                      "filter first, holding requests, a prefix index sized to the KV cache, the "
                                      "latency scorer preferring the most headroom, the KV-cache utilization and "
                                      "LoRA affinity scorers beside it and a max-score picker)"),
    "predicted-llmd": (PREDICTED_LATENCY_SLO_CONFIG, f"predicted latency, llm-d's well-known config "
                                                     f"predicted-latency-slo ({_SLO_WIRING})"),
    "predicted-upstream": (PREDICTED_LATENCY_SLO_CONFIG, f"predicted latency, llm-d's well-known config "
                                                         f"predicted-latency-slo ({_SLO_WIRING})"),
    "predicted-lora-history": (PREDICTED_LORA_HISTORY_CONFIG, "predicted latency, the recommended profile with "
                                                              "its lora-affinity-scorer's requestHistory: true"),
}


#: the twin's TTFT error is also reported over the requests after this many
TWIN_ERROR_AFTER = 1000


def twin_error(errors: list[float]) -> dict:
    """The engine twin's TTFT error for the chosen endpoint: the median of |twin TTFT at dispatch /
    measured TTFT - 1| over the requests completed with more than one token (``twin_ttft_error``), over the last
    half of them and over those after the first ``TWIN_ERROR_AFTER`` completed; none without the twin."""
    if not errors:
        return {}
    out = {"twin_ttft_n": len(errors), "twin_ttft_error": float(np.median(errors)),
           "twin_ttft_error_last_half": float(np.median(errors[len(errors) // 2:]))}
    if len(errors) > TWIN_ERROR_AFTER:
        out[f"twin_ttft_error_after_{TWIN_ERROR_AFTER}"] = float(np.median(errors[TWIN_ERROR_AFTER:]))
    return out


class _Sink:
    """Training-entry sink: forwards to the learner / reporter and optionally to a JSONL file."""

    def __init__(self, downstream=None, record=None, quantile: float = 0.9) -> None:
        self.downstream = downstream
        self.record = record
        self.entries = 0
        self.quantile = quantile
        # in-loop accuracy of what was predicted for the chosen endpoint: n, covered, |err|/actual, pinball
        self.acc = {"ttft": [0, 0, 0.0, 0.0], "tpot": [0, 0, 0.0, 0.0]}
        #: per entry with the twin's view (the TPOT entry, in completion order): |twin TTFT / measured - 1|
        self.twin_errors: list[float] = []

    def _score(self, e: dict) -> None:
        twin, y = e.get("engine_ttft_ms", 0) or 0, e.get("engine_actual_ttft_ms", 0) or 0
        if twin > 0 and y > 0:
            self.twin_errors.append(abs(twin / y - 1.0))
        q = self.quantile
        for t in ("ttft", "tpot"):
            y, p = e.get(f"actual_{t}_ms", 0) or 0, e.get(f"predicted_{t}_ms", 0) or 0
            if y > 0 and p > 0:
                a = self.acc[t]
                a[0] += 1
                a[1] += y <= p
                a[2] += abs(p - y) / y
                a[3] += pinball_loss((y,), (p,), q)

    def accuracy(self) -> dict:
        out = {}
        for t, (n, cov, ape, pin) in self.acc.items():
            if n:
                out[f"{t}_pred_n"] = n
                out[f"{t}_pred_coverage"] = cov / n
                out[f"{t}_pred_mape"] = ape / n
                out[f"{t}_pred_pinball_ms"] = pin / n
        return out | twin_error(self.twin_errors)

    def add(self, entries: list[dict]) -> None:
        self.entries += len(entries)
        for e in entries:
            self._score(e)
        if self.record is not None:
            for e in entries:
                self.record.write(json.dumps(e, separators=(",", ":")) + "\n")
        if self.downstream is not None:
            self.downstream.add(entries)


def _recording_producer(sink, clock, wall):
    """Training-only producer (predictInProduce=false, streaming) so any policy can record entries."""
    from epp_client.plugins import PredictedLatencyProducer

    return PredictedLatencyProducer(None, sink, streaming_mode=True, predict_in_produce=False, clock=clock,
                                    wall_clock=wall)


def _router(policy: str, factory, opts, **kw) -> LifecycleRouter:
    """The driver for a scheduler built by ``factory(rng, clock, wall)`` with a generator
    drawn from the router's seeded one (the prefix producer on: every llm-d policy uses it)."""
    def seeded(rng, clock, wall):
        return factory(random.Random(rng.random()), clock, wall)

    return LifecycleRouter(policy, seeded, opts.seed, prefix=True, **kw)


def make(policy: str, opts, n_servers: int) -> LifecycleRouter:
    record = opts.record_trace
    if policy == "llmd-default":
        sink = _Sink(None, record) if record is not None else None

        def factory(rng, clock, wall):
            prof = default_profile()
            prof.picker = MaxScorePicker(rng=rng)   # seeded: deterministic tie breaks
            producer = _recording_producer(sink, clock, wall) if sink is not None else None
            return Scheduler(producer, [], [prof], InFlightTracker())

        return _router(policy, factory, opts, sink=sink, description=(
            "llm-d default profile (epp_client): queue scorer 2, KV-cache scorer 2, prefix-cache scorer 3, "
            "max-score picker; prefix match from the approximate prefix index (64-token blocks)"))
    if policy == "llmd-token-load":
        sink = _Sink(None, record) if record is not None else None

        def factory(rng, clock, wall):
            prof = SchedulingProfile("default", [PrefixCacheAffinityFilter(affinity_threshold=0.8, rng=rng)],
                                     [(InFlightTokenScorer(), 1.0)], MaxScorePicker(rng=rng))
            producer = _recording_producer(sink, clock, wall) if sink is not None else None
            return Scheduler(producer, [], [prof], InFlightTracker())

        return _router(policy, factory, opts, sink=sink, description=(
            "llm-d token-load routing: prefix-cache-affinity filter (epp_client, threshold 0.8, "
            "prefillThroughput load gate) then least in-flight uncached tokens, max-score picker"))
    if policy in ("llmd-lora", "llmd-lora-history"):
        history = policy == "llmd-lora-history"

        def factory(rng, clock, wall):
            prof = default_profile()
            prof.scorers.append((LoraAffinityScorer(request_history=history), LORA_WEIGHT))
            prof.picker = MaxScorePicker(rng=rng)
            return Scheduler(None, [], [prof], InFlightTracker())

        return _router(policy, factory, opts, description=(
            f"llm-d default profile (queue 2, KV 2, prefix 3) plus lora-affinity-scorer (weight {LORA_WEIGHT:g}, "
            + ("requestHistory: true" if history else "metric-only") + "), max-score picker"))
    if policy in PREDICTED_CONFIGS:
        recipe = "upstream" if policy == "predicted-upstream" else "default"
        oracle_answers = None
        learner: Any = None
        predictor: Any
        if opts.true_latencies:
            from .true_latency import TrueLatencyPredictor

            predictor = oracle_answers = TrueLatencyPredictor()
            sink = _Sink(None, record)
        elif opts.predictor_url:
            from epp_client.predictor import PredictorClient
            from epp_client.training import TrainingReporter

            predictor = PredictorClient([u.strip() for u in opts.predictor_url.split(",") if u.strip()])
            reporter = TrainingReporter(opts.training_url)
            sink = _Sink(reporter, record)
            learner = _RemoteLearner(predictor, reporter)
        else:
            from .online import OnlineLearner

            learner = OnlineLearner(recipe=recipe, retrain_interval_s=opts.retrain_interval_s, seed=opts.seed)
            predictor = learner.predictor
            sink = _Sink(learner, record)

        config = opts.epp_config or PREDICTED_CONFIGS[policy][0]
        opt_in = opts.opt_in_share is not None
        if opt_in and OPT_IN_HANDLER not in config:   # a user config with its own handler is used as is
            config = with_opt_in(config)

        true_harm = None
        if opts.true_harm:
            from .harm_oracle import TrueHarm

            true_harm = TrueHarm(opts.true_harm, opts.true_harm_probe)

        def factory(rng, clock, wall):
            sched = build_scheduler(config, predictor=predictor, sink=sink, rng=rng,
                                    clock=clock, wall_clock=wall)
            if true_harm is not None and not true_harm.install(sched):
                raise ValueError("--true-harm: the config has no decode-harm-filter or decode-harm-scorer")
            return sched

        where = ("the simulator's true latencies instead of models (the oracle's probe)"
                 if oracle_answers is not None else
                 "real prediction/training servers" if opts.predictor_url else
                 f"training code in process, retrained every {opts.retrain_interval_s:g} simulated s")
        what = (PREDICTED_CONFIGS[policy][1] if not opts.epp_config else
                "predicted latency with a user EndpointPickerConfig (--epp-config)")
        if opt_in:
            what += (f"; opted in per request (x-prediction-based-scheduling: true) with probability "
                     f"{opts.opt_in_share:g}, the others on llm-d's default profile "
                     "(prediction-opt-in-profile-handler)")
        router = _router(policy, factory, opts, learner=learner, sink=sink, opt_in_share=opts.opt_in_share,
                         description=f"{what}; {recipe} recipe; {where}")
        if oracle_answers is not None:
            oracle_answers.bind(router)
        if true_harm is not None:
            true_harm.bind(router)
            router.description += (f" (harm plugins: the simulator's true harm, --true-harm {opts.true_harm}, "
                                   f"judged {opts.true_harm_probe} decode steps past the first token)")
        return router
    raise ValueError(f"unknown epp policy {policy!r}")


class _RemoteLearner:
    """Real servers on loopback: nothing to train here; flush and close at the end."""

    tick_interval_s = 0.0

    def __init__(self, predictor, reporter) -> None:
        self.predictor = predictor
        self.reporter = reporter

    def bind(self, clock) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def stats(self) -> dict:
        return {"reporter": dict(self.reporter.stats())}

    def close(self) -> None:
        self.reporter.close()
        self.predictor.close()
