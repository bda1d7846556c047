"""Scheduling profiles and the scheduler: producer → admitters → filters → weighted
scorers → picker (B1.1 steps 4-8).

Synchronous (``Scheduler.schedule``, for a discrete-event simulator without an event
loop) and asynchronous (``await Scheduler.aschedule``, for the gateway). Both return a
:class:`SchedulingResult` with the picked endpoints, the per-endpoint weighted scores of
the primary profile and the admission decision. Candidates are cloned per request
(the director snapshots them), so the producer's predictions never leak into the
caller's ``Endpoint`` objects.

After the pick, the router drives the request lifecycle through the scheduler (it
forwards to the producer and to the in-flight accounting)::

    res = sched.schedule(req, endpoints)            # or await sched.aschedule(...)
    if res.ok: sched.pre_request(req, res)          # dispatch
    sched.on_first_chunk(req.request_id, now=...)   # streaming: first body chunk
    sched.on_chunk(req.request_id, now=...)         # later chunks
    sched.on_complete(req.request_id, now=..., status=200, aborted=False, output_tokens=None)

Profile plugins that define ``observe(candidates, now)``, ``pre_request(request, target)``
and ``on_complete(request_id)`` (``lora-affinity-scorer`` with ``requestHistory``) get
them too: ``observe`` with every candidate before the profiles run (``now`` defaults to
``time.monotonic()``), ``pre_request`` with the primary target, ``on_complete`` at the
end of the request, aborts included.

With a ``profile_handler`` (``disagg-profile-handler``, B4.7) only the profiles it picks
run (decode, then prefill / encode when its deciders say so); ``result.profiles`` and
``result.picks`` carry the pick per profile, ``result.decision`` the P/D decision, and
``pre_request`` writes ``x-prefiller-host-port`` / ``x-encoder-hosts-ports`` into the
request headers (or removes them when the stage did not run).

Build from Python objects (``Scheduler(producer=..., admitters=[...], profiles=[...])``)
or from an EndpointPickerConfig-style dict / YAML text with :meth:`Scheduler.from_config`.
Not thread-safe: one scheduler per event loop / simulator.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .inflight import InFlightTracker
from .plugins.pickers import MaxScorePicker
from .plugins.producer import PredictedLatencyProducer
from .plugins.protocols import RequestLifecycle
from .types import ADMITTED, Admission, ConfigError, Endpoint, InferenceRequest

log = logging.getLogger(__name__)

#: The director's default per-producer timeout (B1.1 step 5).
PRODUCER_TIMEOUT_S = 0.4


@dataclass
class SchedulingProfile:
    """Filters in order, weighted scorers (weight default 1.0), one picker."""

    name: str = "default"
    filters: list = field(default_factory=list)
    scorers: list = field(default_factory=list)  # [(scorer, weight)]
    picker: Any = None

    def run(self, request: InferenceRequest, endpoints: list[Endpoint]) -> "ProfileResult":
        candidates = endpoints
        for f in self.filters:
            candidates = f.filter(request, candidates)
            if not candidates:
                return ProfileResult(self.name, [], {}, filtered=[])
        totals = {e.name: 0.0 for e in candidates}
        for scorer, weight in self.scorers:
            raw = scorer.score(request, candidates)
            for name, s in raw.items():
                if name in totals:
                    # clamp to [0, 1] then weight (NaN counts as 0)
                    totals[name] += (1.0 if s > 1.0 else s if s > 0.0 else 0.0) * weight
        picker = self.picker if self.picker is not None else _DEFAULT_PICKER
        return ProfileResult(self.name, picker.pick(candidates, totals), totals, filtered=candidates)


_DEFAULT_PICKER = MaxScorePicker()


@dataclass
class ProfileResult:
    name: str
    picked: list
    scores: dict
    filtered: list = field(default_factory=list)


@dataclass
class SchedulingResult:
    request_id: str
    picked: list  # primary profile's picked endpoints (empty when not admitted / dropped)
    scores: dict  # primary profile's weighted scores of the filtered candidates
    admission: Admission
    profiles: dict = field(default_factory=dict)  # name -> ProfileResult
    candidates: list = field(default_factory=list)  # per-request clones, with predictions
    status: int = 200  # 200, or the HTTP status a gateway should answer
    reason: str = ""  # e.g. the admission reason or "rejected-saturated"
    decision: str = ""  # P/D decision with a disagg profile handler, e.g. "prefill-decode"

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.picked)

    @property
    def endpoint(self) -> Endpoint | None:
        return self.picked[0] if self.picked else None

    @property
    def picks(self) -> dict[str, Endpoint]:
        """Profile name -> that profile's first picked endpoint (for PreRequest)."""
        return {name: pr.picked[0] for name, pr in self.profiles.items() if pr.picked}


class Scheduler:
    def __init__(self, producer: PredictedLatencyProducer | None = None, admitters: Sequence = (),
                 profiles: Sequence[SchedulingProfile] | SchedulingProfile = (), inflight: InFlightTracker | None = None,
                 primary_profile: str | None = None, producer_timeout_s: float = PRODUCER_TIMEOUT_S,
                 profile_handler: Any = None) -> None:
        if isinstance(profiles, SchedulingProfile):
            profiles = [profiles]
        self.producer = producer
        self.admitters = list(admitters)
        self.profiles = list(profiles) or [default_profile()]
        self.inflight = inflight
        names = [p.name for p in self.profiles]
        if len(set(names)) != len(names):
            raise ConfigError("schedulingProfiles", f"duplicate profile names: {names}")
        self.profile_handler = profile_handler
        if primary_profile is None and profile_handler is not None:
            primary_profile = profile_handler.decode_profile
        if primary_profile is None:
            primary_profile = "decode" if "decode" in names else names[0]
        self.primary_profile = primary_profile
        self.producer_timeout_s = producer_timeout_s
        self.producer_errors = 0
        # profile plugins with request-lifecycle hooks (observe / pre_request / on_complete),
        # e.g. lora-affinity-scorer with request history; each once even if shared by profiles
        hooks: dict[int, Any] = {}
        for p in self.profiles:
            for plugin in (*p.filters, *(s for s, _ in p.scorers)):
                if isinstance(plugin, RequestLifecycle):
                    hooks.setdefault(id(plugin), plugin)
        self.lifecycle_plugins = list(hooks.values())

    # -- building ------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping | str, predictor: Any = None, sink: Any = None,
                    rng: random.Random | None = None, **kwargs: Any) -> "Scheduler":
        from .config import build_scheduler

        return build_scheduler(config, predictor=predictor, sink=sink, rng=rng, **kwargs)

    # -- scheduling ----------------------------------------------------------------------
    def _prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        if not request.request_id:
            # x-request-id, generated by the director when missing
            request.request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
            request.headers["x-request-id"] = request.request_id
        clones = [e.clone() for e in endpoints]
        tracker = self.inflight
        for c in clones:
            c.prediction = None
            if tracker is not None and c.inflight is None:
                c.inflight = tracker.snapshot(c.name)
        return clones

    def _finish(self, request: InferenceRequest, candidates: list[Endpoint], now: float | None) -> SchedulingResult:
        if not candidates:
            return SchedulingResult(request.request_id, [], {}, ADMITTED, status=503, reason="rejected-no-endpoints")
        if self.lifecycle_plugins:
            t = time.monotonic() if now is None else now
            for plugin in self.lifecycle_plugins:
                plugin.observe(candidates, t)
        admission = ADMITTED
        for a in self.admitters:
            admission = a.admit(request, candidates)
            if not admission.admitted:
                self._discard(request)
                return SchedulingResult(request.request_id, [], {}, admission, candidates=candidates,
                                        status=admission.status, reason=admission.reason)
        decision = ""
        if self.profile_handler is not None:
            results = self.profile_handler.run(request, {p.name: p for p in self.profiles}, candidates)
            decode = results.get(self.profile_handler.decode_profile)
            if decode is not None and decode.picked:
                decision = _decision(self.profile_handler, results)
        else:
            results = {profile.name: profile.run(request, candidates) for profile in self.profiles}
        primary = results.get(self.primary_profile) or ProfileResult(self.primary_profile, [], {})
        if not primary.picked:
            self._discard(request)
            return SchedulingResult(request.request_id, [], primary.scores, admission, results, candidates,
                                    status=429, reason="rejected-saturated")
        return SchedulingResult(request.request_id, primary.picked, primary.scores, admission, results, candidates,
                                decision=decision)

    def _discard(self, request: InferenceRequest) -> None:
        if self.producer is not None:
            self.producer.discard(request.request_id)

    def _producer_failed(self, candidates: list[Endpoint]) -> None:
        # the director logs a producer error (or timeout) and goes on; nothing is published
        self.producer_errors += 1
        for c in candidates:
            c.prediction = None
        log.warning("predicted-latency producer failed or timed out", exc_info=True)

    def schedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                 now: float | None = None) -> SchedulingResult:
        candidates = self._prepare(request, endpoints)
        if candidates and self.producer is not None:
            try:
                self.producer.produce(request, candidates, now)
            except Exception:
                self._producer_failed(candidates)
        return self._finish(request, candidates, now)

    async def aschedule(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                        now: float | None = None) -> SchedulingResult:
        candidates = self._prepare(request, endpoints)
        if candidates and self.producer is not None:
            try:
                async with asyncio.timeout(self.producer_timeout_s):
                    await self.producer.aproduce(request, candidates, now)
            except Exception:
                self._producer_failed(candidates)
        return self._finish(request, candidates, now)

    # -- lifecycle -----------------------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult, now: float | None = None) -> None:
        picks = result.picks
        if not picks:
            return
        if self.primary_profile in picks:  # primary first
            picks = {self.primary_profile: picks[self.primary_profile],
                     **{k: v for k, v in picks.items() if k != self.primary_profile}}
        if self.inflight is not None:
            self.inflight.pre_request(request, picks)
        if self.lifecycle_plugins:
            target = next(iter(picks.values()))
            for plugin in self.lifecycle_plugins:
                plugin.pre_request(request, target)
        if self.producer is not None:
            self.producer.pre_request(request, picks, now)
        self.apply_stage_headers(request.headers, result)

    def apply_stage_headers(self, headers: dict, result: Any) -> None:
        """The profile handler's PreRequest: write (or remove) the P/D stage headers."""
        if self.profile_handler is None or getattr(result, "profiles", None) is None:
            return
        for name, value in self.profile_handler.headers(result.profiles).items():
            if value is None:
                headers.pop(name, None)
            else:
                headers[name] = value

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        if self.inflight is not None:
            self.inflight.on_first_chunk(request_id)
        if self.producer is not None:
            self.producer.on_first_chunk(request_id, now, tokens)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        if self.producer is not None:
            self.producer.on_chunk(request_id, now, tokens)

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None) -> None:
        if self.inflight is not None:
            self.inflight.on_complete(request_id)
        for plugin in self.lifecycle_plugins:
            plugin.on_complete(request_id)
        if self.producer is not None:
            self.producer.on_complete(request_id, now, status=status, aborted=aborted, output_tokens=output_tokens)


def _decision(handler: Any, results: dict) -> str:
    from .plugins.disagg import decision_type

    return decision_type(handler.encode_profile in results, handler.prefill_profile in results)


def default_profile() -> SchedulingProfile:
    """Upstream's default without a config: queue (2), kv (2), prefix (3), max-score picker."""
    from .plugins.scorers import KVCacheUtilizationScorer, PrefixCacheScorer, QueueScorer

    return SchedulingProfile("default", [], [(QueueScorer(), 2.0), (KVCacheUtilizationScorer(), 2.0),
                                             (PrefixCacheScorer(), 3.0)], MaxScorePicker())
