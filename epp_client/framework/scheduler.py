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

With a ``profile_handler`` only the profiles it picks run; ``result.profiles`` and
``result.picks`` carry the pick per profile, ``result.decision`` the handler's decision.
``disagg-profile-handler`` (B4.7) runs decode, then prefill / encode when its deciders say
so, and ``pre_request`` writes ``x-prefiller-host-port`` / ``x-encoder-hosts-ports`` into
the request headers (or removes them when the stage did not run).
A filter may raise :class:`~epp_client.types.HoldRequest` (``decode-harm-filter`` with
``holdSlackMs``): the result is then held (``res.held``, status 429, ``retry_after_s``) and
the caller schedules the request again that much later with ``request.waited_ms`` set (the
filter bounds the time held: ``maxHoldMs``). A filter may raise
:class:`~epp_client.types.ShedRequest` (``decode-harm-filter`` with ``shedWhenHopeless`` or
``overMaxTtft: shed``): the result is a 429 with the filter's reason (``shed-slo-unreachable``,
``shed-ttft-over-bound``), never scheduled again.
``prediction-opt-in-profile-handler`` runs the predicted profile for requests with
``x-prediction-based-scheduling: true`` once a learned model answers, else the heuristic
one, and lets the admitters judge only the predicted requests.

Build from Python objects (``Scheduler(producer=..., admitters=[...], profiles=[...])``)
or from an EndpointPickerConfig-style dict / YAML text with
:func:`epp_client.framework.loader.build_scheduler`.
Not thread-safe: one scheduler per event loop / simulator.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from epp_client.framework.lifecycle import ProfileResult, SchedulingResult, candidates_for, ensure_request_id
from epp_client.framework.profile import SchedulingProfile, default_profile
from epp_client.framework.protocols import InFlightLoadProducer, Producer, RequestHooks
from epp_client.types import ADMITTED, ConfigError, Endpoint, HoldRequest, InferenceRequest, ShedRequest

log = logging.getLogger(__name__)

#: The director's default per-producer timeout (B1.1 step 5).
PRODUCER_TIMEOUT_S = 0.4


class Scheduler:
    def __init__(self, producer: Producer | None = None, admitters: Sequence = (),
                 profiles: Sequence[SchedulingProfile] | SchedulingProfile = (),
                 inflight: InFlightLoadProducer | None = None,
                 primary_profile: str | None = None, producer_timeout_s: float = PRODUCER_TIMEOUT_S,
                 profile_handler: Any = None, prefix_producer: Any = None) -> None:
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
        #: the config's ``approx-prefix-cache-producer`` (None: the router's default); the
        #: router hashes the prompt and writes each candidate's prefix match with it
        self.prefix_producer = prefix_producer
        if primary_profile is None and profile_handler is not None:
            primary_profile = profile_handler.primary({})
        if primary_profile is None:
            primary_profile = "decode" if "decode" in names else names[0]
        self.primary_profile = primary_profile
        self.producer_timeout_s = producer_timeout_s
        self.producer_errors = 0
        self.held = 0           # scheduling attempts a filter answered with a hold (HoldRequest)
        self.shed = 0           # requests a filter refused (ShedRequest)
        # profile plugins with the request hooks (RequestHooks), e.g. lora-affinity-scorer with
        # request history; each once even if shared by profiles
        found: dict[int, Any] = {}
        for p in self.profiles:
            for plugin in (*p.filters, *(s for s, _ in p.scorers)):
                if isinstance(plugin, RequestHooks):
                    found.setdefault(id(plugin), plugin)
        self.lifecycle_plugins = list(found.values())
        #: profile plugins that look at every candidate before the profiles run (``observe``)
        self.observers = [p for p in self.lifecycle_plugins if callable(getattr(p, "observe", None))]
        #: every plugin following the request lifecycle, in call order
        self.hooks: list[RequestHooks] = [h for h in (inflight, *self.lifecycle_plugins, producer) if h is not None]

    # -- scheduling ----------------------------------------------------------------------
    def _prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        ensure_request_id(request)
        return candidates_for(endpoints, self.inflight)

    def _finish(self, request: InferenceRequest, candidates: list[Endpoint], now: float | None) -> SchedulingResult:
        if not candidates:
            return SchedulingResult(request.request_id, [], {}, ADMITTED, status=503, reason="rejected-no-endpoints")
        if self.observers:
            t = time.monotonic() if now is None else now
            for plugin in self.observers:
                plugin.observe(candidates, t)
        admission = ADMITTED
        handler = self.profile_handler
        if handler is None or handler.admits(request, candidates):
            for a in self.admitters:
                admission = a.admit(request, candidates)
                if not admission.admitted:
                    self._discard(request)
                    return SchedulingResult(request.request_id, [], {}, admission, candidates=candidates,
                                            status=admission.status, reason=admission.reason)
        decision = ""
        try:
            if handler is not None:
                results = handler.run(request, {p.name: p for p in self.profiles}, candidates)
                primary_name = handler.primary(results)
                if primary_name in results and results[primary_name].picked:
                    decision = handler.decision(request, results)
            else:
                results = {profile.name: profile.run(request, candidates) for profile in self.profiles}
                primary_name = self.primary_profile
        except HoldRequest as hold:
            self._discard(request)
            self.held += 1
            return SchedulingResult(request.request_id, [], {}, admission, candidates=candidates, status=429,
                                    reason=hold.reason, retry_after_s=hold.retry_after_s)
        except ShedRequest as shed:
            self._discard(request)
            self.shed += 1
            return SchedulingResult(request.request_id, [], {}, admission, candidates=candidates, status=429,
                                    reason=shed.reason)
        primary = results.get(primary_name) or ProfileResult(primary_name, [], {})
        if not primary.picked:
            self._discard(request)
            return SchedulingResult(request.request_id, [], primary.scores, admission, results, candidates,
                                    status=429, reason="rejected-saturated")
        return SchedulingResult(request.request_id, primary.picked, primary.scores, admission, results, candidates,
                                decision=decision)

    def _discard(self, request: InferenceRequest) -> None:
        for h in self.hooks:
            h.discard(request.request_id)

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
    def pre_request(self, request: InferenceRequest, result: SchedulingResult, now: float | None = None, *,
                    endpoint: Endpoint | None = None) -> None:
        """Dispatch to the pick; with ``endpoint`` (not the pick: a retry elsewhere) account the
        request there, as the primary profile's target, and leave the stage headers as they are."""
        picks = result.picks
        if endpoint is not None and (result.endpoint is None or endpoint.name != result.endpoint.name):
            picks = {self.primary_profile: endpoint}
            result = None
        if not picks:
            return
        if self.primary_profile in picks:  # primary first
            picks = {self.primary_profile: picks[self.primary_profile],
                     **{k: v for k, v in picks.items() if k != self.primary_profile}}
        for h in self.hooks:
            h.pre_request(request, picks, now)
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
        for h in self.hooks:
            h.on_first_chunk(request_id, now, tokens)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        for h in self.hooks:
            h.on_chunk(request_id, now, tokens)

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        for h in self.hooks:
            h.on_complete(request_id, now, status=status, aborted=aborted, output_tokens=output_tokens,
                          prompt_tokens=prompt_tokens)
