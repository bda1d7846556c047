"""The llm-d policies in the loop, running epp_client's real decision code.

Each router builds an ``epp_client.scheduler.Scheduler`` and drives its lifecycle with
simulated time: ``schedule`` at arrival (candidates carry the *scraped* metrics, the
approximate prefix index's match and the scheduler's own in-flight counters),
``pre_request`` at dispatch, ``on_first_chunk`` at the first token, ``on_complete`` at
the end. Predicted-latency policies learn online (``online.OnlineLearner``: the training
server's store, retrain worker and registry in process, retraining on simulated time) or
use real servers on loopback (``RunOptions.predictor_url`` / ``training_url``).
"""
from __future__ import annotations

import json
import random

from epp_client import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.config import PREDICTED_LATENCY_SLO_CONFIG
from gateway.prefix import PrefixIndex
from epp_client.inflight import InFlightTracker
from epp_client.plugins import LoraAffinityScorer, MaxScorePicker, PrefixCacheAffinityFilter
from epp_client.scheduler import Scheduler, SchedulingProfile, default_profile

from .request import SimRequest
from .routers import BaseRouter
from .workloads import SEG

#: The approximate prefix producer hashes blocks of at least 64 tokens (B4.1).
PREFIX_BLOCK = 64
#: Weight of lora-affinity-scorer next to the default profile's queue 2 / KV 2 / prefix 3.
LORA_WEIGHT = 2.0
#: The well-known predicted-latency-slo config plus lora-affinity-scorer with request history.
PREDICTED_LORA_HISTORY_CONFIG = (
    PREDICTED_LATENCY_SLO_CONFIG
    .replace("- type: latency-scorer\n", "- type: latency-scorer\n- type: lora-affinity-scorer\n"
             "  parameters:\n    requestHistory: true\n", 1)
    .replace("  - pluginRef: latency-scorer\n    weight: 1\n",
             "  - pluginRef: latency-scorer\n    weight: 1\n  - pluginRef: lora-affinity-scorer\n    weight: 1\n", 1)
)
#: Simulated wall clock origin for training-entry timestamps (deterministic).
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class InFlightTokenScorer:
    """Least in-flight uncached prompt tokens first: ``(max - t) / (max - min)`` over the
    candidates' ``InFlightLoad.tokens`` (1.0 for all when equal). The in-flight-token load
    half of llm-d's token-load routing; epp_client has no such scorer, so it lives here
    and follows the plugin protocol (the profile clamps and weights it)."""

    TYPE = "inflight-token-scorer"

    def score(self, request, endpoints):
        toks = [e.inflight.tokens if e.inflight is not None else 0 for e in endpoints]
        hi, lo = max(toks), min(toks)
        if hi == lo:
            return {e.name: 1.0 for e in endpoints}
        return {e.name: (hi - t) / (hi - lo) for e, t in zip(endpoints, toks)}


class _Sink:
    """Training-entry sink: forwards to the learner / reporter and optionally to a JSONL file."""

    def __init__(self, downstream=None, record=None, quantile: float = 0.9) -> None:
        self.downstream = downstream
        self.record = record
        self.entries = 0
        self.quantile = quantile
        # in-loop accuracy of what was predicted for the chosen endpoint: n, covered, |err|/actual, pinball
        self.acc = {"ttft": [0, 0, 0.0, 0.0], "tpot": [0, 0, 0.0, 0.0]}

    def _score(self, e: dict) -> None:
        q = self.quantile
        for t in ("ttft", "tpot"):
            y, p = e.get(f"actual_{t}_ms", 0) or 0, e.get(f"predicted_{t}_ms", 0) or 0
            if y > 0 and p > 0:
                a = self.acc[t]
                a[0] += 1
                a[1] += y <= p
                a[2] += abs(p - y) / y
                a[3] += q * (y - p) if y >= p else (1 - q) * (p - y)

    def accuracy(self) -> dict:
        out = {}
        for t, (n, cov, ape, pin) in self.acc.items():
            if n:
                out[f"{t}_pred_n"] = n
                out[f"{t}_pred_coverage"] = cov / n
                out[f"{t}_pred_mape"] = ape / n
                out[f"{t}_pred_pinball_ms"] = pin / n
        return out

    def add(self, entries: list[dict]) -> None:
        self.entries += len(entries)
        for e in entries:
            self._score(e)
        if self.record is not None:
            for e in entries:
                self.record.write(json.dumps(e, separators=(",", ":")) + "\n")
        if self.downstream is not None:
            self.downstream.add(entries)


class EppRouter(BaseRouter):
    """Routes with an epp_client Scheduler."""

    def __init__(self, name: str, scheduler_factory, seed: int = 0, learner=None, sink: _Sink | None = None,
                 description: str = "") -> None:
        super().__init__(seed)
        self.name = name
        self.description = description
        self._factory = scheduler_factory
        self.learner = learner
        self.sink = sink
        self.sched: Scheduler | None = None
        self.index = PrefixIndex(PREFIX_BLOCK)
        self.endpoints: list[Endpoint] = []
        self.by_name: dict[str, int] = {}
        self.tick_interval_s = learner.tick_interval_s if learner is not None else 0.0
        self.fallbacks = 0

    def bind(self, sim) -> None:
        super().bind(sim)
        clock = lambda: sim.now  # noqa: E731
        wall = lambda: EPOCH + sim.now  # noqa: E731
        self.sched = self._factory(random.Random(self.rng.random()), clock, wall)
        self.endpoints = [Endpoint(name=f"sim-{i}", address="127.0.0.1", port=8000 + i)
                          for i in range(len(sim.servers))]
        self.by_name = {e.name: i for i, e in enumerate(self.endpoints)}
        if self.learner is not None:
            self.learner.bind(clock)

    @staticmethod
    def _hashes(req: SimRequest) -> list:
        """64-token block identities of the prompt (the approximate producer's hashes)."""
        out = []
        per = SEG // PREFIX_BLOCK
        for key, n in req.segments:
            full = n // PREFIX_BLOCK if n < SEG else per
            out.extend((key, j) for j in range(full))
            if n < SEG:
                break   # a partial segment ends the chain
        return out

    def route(self, req: SimRequest, now: float):
        hashes = self._hashes(req)
        total = -(-req.input_len // PREFIX_BLOCK)
        scraped = self.sim.scraped
        eps = self.endpoints
        for i, e in enumerate(eps):
            m = scraped[i]
            e.metrics = EndpointMetrics(m.kv_cache_usage, m.waiting, m.running, m.active_lora, m.waiting_lora,
                                        m.max_lora)
            e.prefix_match = PrefixMatch(self.index.match(e.name, hashes).match_blocks, total, PREFIX_BLOCK)
            e.inflight = None
        headers = {"x-request-id": str(req.rid)}
        if req.ttft_slo_ms > 0:
            headers["x-llm-d-slo-ttft-ms"] = f"{req.ttft_slo_ms:.3f}"
        if req.tpot_slo_ms > 0:
            headers["x-llm-d-slo-tpot-ms"] = f"{req.tpot_slo_ms:.3f}"
        ireq = InferenceRequest(request_id=str(req.rid), headers=headers, priority=req.priority,
                                input_tokens=req.input_len, target_model=req.lora, streaming=True)
        res = self.sched.schedule(ireq, eps, now=now)
        if not res.ok:
            return None
        picked = res.endpoint
        req.ctx = (ireq, res, hashes)
        return self.by_name[picked.name]

    def on_dispatch(self, req: SimRequest, idx: int, now: float) -> None:
        super().on_dispatch(req, idx, now)
        ireq, res, hashes = req.ctx
        self.sched.pre_request(ireq, res, now=now)
        self.index.record(self.endpoints[idx].name, hashes)

    def on_first_token(self, req: SimRequest, now: float) -> None:
        if req.ctx is not None:
            self.sched.on_first_chunk(str(req.rid), now=now, tokens=1)

    def on_finish(self, req: SimRequest, now: float) -> None:
        super().on_finish(req, now)
        if req.ctx is None:
            return
        if req.shed:
            self.sched.on_complete(str(req.rid), now=now, status=503, aborted=True)
        else:
            self.sched.on_complete(str(req.rid), now=now, output_tokens=req.output_len)
        req.ctx = None

    def on_tick(self, now: float) -> None:
        if self.learner is not None:
            self.learner.tick(now)

    def stats(self) -> dict:
        out = {}
        if self.sched is not None and self.sched.producer is not None:
            c = self.sched.producer.counters
            out.update({"predictions": c.get("predictions", 0), "prediction_failures": c.get("prediction_failures", 0),
                        "training_entries": self.sink.entries if self.sink is not None else 0})
            if self.sink is not None:
                out.update(self.sink.accuracy())
        if self.learner is not None:
            out.update(self.learner.stats())
        return out

    def close(self) -> None:
        if self.learner is not None:
            self.learner.close()


def _recording_producer(sink, clock, wall):
    """Training-only producer (predictInProduce=false, streaming) so any policy can record entries."""
    from epp_client.plugins import PredictedLatencyProducer

    return PredictedLatencyProducer(None, sink, streaming_mode=True, predict_in_produce=False, clock=clock,
                                    wall_clock=wall)


def make(policy: str, opts, n_servers: int) -> EppRouter:
    record = opts.record_trace
    if policy == "llmd-default":
        sink = _Sink(None, record) if record is not None else None

        def factory(rng, clock, wall):
            prof = default_profile()
            prof.picker = MaxScorePicker(rng=rng)   # seeded: deterministic tie breaks
            producer = _recording_producer(sink, clock, wall) if sink is not None else None
            return Scheduler(producer, [], [prof], InFlightTracker())

        return EppRouter(policy, factory, opts.seed, sink=sink, description=(
            "llm-d default profile (epp_client): queue scorer 2, KV-cache scorer 2, prefix-cache scorer 3, "
            "max-score picker; prefix match from the approximate prefix index (64-token blocks)"))
    if policy == "llmd-token-load":
        sink = _Sink(None, record) if record is not None else None

        def factory(rng, clock, wall):
            prof = SchedulingProfile("default", [PrefixCacheAffinityFilter(affinity_threshold=0.8, rng=rng)],
                                     [(InFlightTokenScorer(), 1.0)], MaxScorePicker(rng=rng))
            producer = _recording_producer(sink, clock, wall) if sink is not None else None
            return Scheduler(producer, [], [prof], InFlightTracker())

        return EppRouter(policy, factory, opts.seed, sink=sink, description=(
            "llm-d token-load routing: prefix-cache-affinity filter (epp_client, threshold 0.8, "
            "prefillThroughput load gate) then least in-flight uncached tokens, max-score picker"))
    if policy in ("llmd-lora", "llmd-lora-history"):
        history = policy == "llmd-lora-history"

        def factory(rng, clock, wall):
            prof = default_profile()
            prof.scorers.append((LoraAffinityScorer(request_history=history), LORA_WEIGHT))
            prof.picker = MaxScorePicker(rng=rng)
            return Scheduler(None, [], [prof], InFlightTracker())

        return EppRouter(policy, factory, opts.seed, description=(
            f"llm-d default profile (queue 2, KV 2, prefix 3) plus lora-affinity-scorer (weight {LORA_WEIGHT:g}, "
            + ("requestHistory: true" if history else "metric-only") + "), max-score picker"))
    if policy in ("predicted", "predicted-upstream", "predicted-lora-history"):
        recipe = "upstream" if policy == "predicted-upstream" else "default"
        if opts.predictor_url:
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

        config = opts.epp_config or (PREDICTED_LORA_HISTORY_CONFIG if policy == "predicted-lora-history"
                                     else PREDICTED_LATENCY_SLO_CONFIG)

        def factory(rng, clock, wall):
            return Scheduler.from_config(config, predictor=predictor, sink=sink, rng=rng,
                                         clock=clock, wall_clock=wall)

        where = "real prediction/training servers" if opts.predictor_url else \
            f"training code in process, retrained every {opts.retrain_interval_s:g} simulated s"
        return EppRouter(policy, factory, opts.seed, learner=learner, sink=sink, description=(
            ("predicted latency, well-known config predicted-latency-slo (streaming producer, affinity filters, "
             "SLO tier filter, latency scorer, weighted-random picker)"
             + (" plus lora-affinity-scorer (requestHistory: true, weight 1)"
                if policy == "predicted-lora-history" else "") if not opts.epp_config else
             "predicted latency with a user EndpointPickerConfig (--epp-config)")
            + f"; {recipe} recipe; {where}"))
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
