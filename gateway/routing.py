"""How the gateway drives a routing policy: the epp_client request lifecycle.

The policy is any :class:`epp_client.framework.lifecycle.RequestLifecycle`: the scheduler built
from ``--config`` (maybe behind flow control), or the built-in
:class:`~epp_client.heuristics.LeastLoadScheduler`. Each candidate becomes an
:class:`epp_client.Endpoint` (scraped metrics and labels; the prefix producer writes its
prefix match); ``aschedule`` decides (again after each hold a filter asks for,
``Driver.decide_held``); the gateway then calls ``pre_request`` at each
attempt's dispatch, ``on_first_chunk`` at the first token and ``on_complete`` at the end.
If the policy raises, the least-load fallback decides and the gateway drives *its*
lifecycle for that request. Both share the policy's in-flight tracker: in-flight load is
counted once, in ``epp_client.plugins.producer.inflight_load``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epp_client.framework import loader
from epp_client.framework.lifecycle import RequestLifecycle, SchedulingResult
from epp_client.framework.scheduler import Scheduler
from epp_client.heuristics import LeastLoadScheduler
from epp_client.plugins.handler.opt_in import WARM_UP
from epp_client.profiles import config_text
from epp_client.types import Endpoint, EndpointMetrics, InferenceRequest

from .scrape import EndpointState
from .settings import GatewaySettings

log = logging.getLogger("gateway.routing")

HOLD_EXPIRED = "rejected-hold-expired"


@dataclass
class Outcome:
    ok: bool                               # natural completion with a 2xx status
    status: int
    ttft_ms: float | None                  # from dispatch to the first token
    e2e_ms: float | None
    tokens: int                            # generated tokens (usage when reported)
    chunks: int                            # content events (streaming) or 1
    prompt_tokens: int | None = None       # usage.prompt_tokens when reported (the engine sums' true length)


@dataclass
class Routing:
    """One request's routing: the lifecycle that decided, its result, and the try order
    (the picks first, then the other candidates by least load, for retries before the
    first byte); empty when denied."""

    lifecycle: Any
    result: SchedulingResult
    order: list[Endpoint]
    fallback: bool = False                 # decided without predictions (or opted in during warm-up)
    predicted: dict | None = None          # endpoint name -> (ttft ms, tpot ms)
    model_version: str = ""

    @property
    def admitted(self) -> bool:
        return self.result.ok

    @property
    def status(self) -> int:
        return self.result.status if self.result.status >= 400 else 429

    @property
    def reason(self) -> str:
        return self.result.reason or self.result.admission.reason or "rejected"


def to_endpoint(st: EndpointState) -> Endpoint:
    m = st.metrics
    host, _, port = st.host_port.rpartition(":")
    return Endpoint(
        name=st.name, address=host, port=int(port) if port.isdigit() else 0, labels=dict(st.labels),
        metrics=EndpointMetrics(kv_cache_usage=m.kv_cache_usage or 0.0, waiting_queue_size=m.waiting or 0,
                                running_requests_size=m.running or 0, active_lora_adapters=m.active_lora,
                                waiting_lora_adapters=m.waiting_lora, max_active_lora=m.max_lora,
                                cache_num_blocks=m.cache_num_blocks, cache_block_size=m.cache_block_size))


def build_scheduler(settings: GatewaySettings) -> Scheduler:
    """The scheduler of ``settings.config`` with its prediction and training clients."""
    from epp_client.predictor import PredictorClient
    from epp_client.training import TrainingReporter

    if settings.config is None:
        raise ValueError("build_scheduler needs settings.config (the EndpointPickerConfig YAML)")
    text = config_text(settings.config)
    predictor = (PredictorClient(settings.prediction_urls) if settings.prediction_urls
                 else PredictorClient.from_env())
    reporter = (TrainingReporter(settings.training_url) if settings.training_url
                else TrainingReporter.from_env())
    sched = loader.build_scheduler(text, predictor=predictor, sink=reporter)
    if sched.producer is None:   # the config predicts nothing: the clients are not needed
        predictor.close()
        reporter.close()
    return sched


def predicting(lifecycle: Any) -> bool:
    return getattr(lifecycle, "producer", None) is not None


class Driver:
    """Drives the policy's lifecycle for the gateway; a failing hook never fails a request
    (logged and counted as a ``hook-error`` fallback)."""

    def __init__(self, policy: RequestLifecycle, metrics: Any) -> None:
        self.policy = policy
        if getattr(policy, "inflight", None) is None:
            raise ValueError("the gateway's routing policy needs an in-flight tracker")
        self.fallback = LeastLoadScheduler(inflight=policy.inflight)
        self.metrics = metrics

    async def decide(self, request: InferenceRequest, endpoints: list[Endpoint]) -> Routing:
        lc: Any = self.policy
        try:
            res = await lc.aschedule(request, endpoints)
        except Exception as e:  # noqa: BLE001 - routing must never block or fail a request
            log.warning("router %s failed, falling back: %s", getattr(lc, "name", type(lc).__name__), e)
            self.metrics.fallbacks.labels(reason="router-error").inc()
            lc = self.fallback
            res = await lc.aschedule(request, endpoints)
            return Routing(lc, res, self._order(res, endpoints), fallback=True, predicted={})
        predicted = res.predictions
        # without predictions: the heuristic, or a predicting scheduler whose producer gave none
        # (a request that flow control turned away never reached the producer)
        fallback = isinstance(lc, LeastLoadScheduler) or (predicting(lc) and bool(res.candidates) and not predicted)
        if fallback:
            self.metrics.fallbacks.labels(reason="no-predictions").inc()
        elif res.decision == WARM_UP:   # opted in to prediction, routed by the heuristic while the predictor warms up
            fallback = True
            self.metrics.fallbacks.labels(reason="warm-up").inc()
        return Routing(lc, res, self._order(res, endpoints), fallback, predicted, res.model_version)

    async def decide_held(self, request: InferenceRequest, candidates: Callable[[], list[Endpoint]],
                          max_hold_s: float) -> Routing:
        """The policy's decision. A held request (a filter's hold: ``decode-harm-filter`` with
        ``holdSlackMs``) waits ``retry_after_s`` and is scheduled again on fresh ``candidates()``, with
        the time held so far in ``request.waited_ms``; the filter bounds the hold (``maxHoldMs``) and
        places the request at its bound. ``max_hold_s`` is a ceiling over any filter: past it the
        request is denied (``rejected-hold-expired``). A request that leaves while held is
        abandoned: flow control stops counting it."""
        held_at: float | None = None
        try:
            while True:
                decision = await self.decide(request, candidates())
                wait = decision.result.retry_after_s
                if wait <= 0:
                    return decision
                now = time.monotonic()
                if held_at is None:
                    held_at = now
                    self.metrics.held.inc()
                left = held_at + max_hold_s - now
                if left <= 0:
                    self._abandon(request)
                    return dataclasses.replace(decision, order=[], result=dataclasses.replace(
                        decision.result, status=429, reason=HOLD_EXPIRED, retry_after_s=0.0))
                await asyncio.sleep(min(wait, left))
                request.waited_ms = (time.monotonic() - held_at) * 1000.0
        except BaseException:
            if held_at is not None:
                self._abandon(request)
            raise

    def _abandon(self, request: InferenceRequest) -> None:
        abandon = getattr(self.policy, "abandon", None)
        if callable(abandon):
            abandon(request.request_id)

    def _order(self, res: SchedulingResult, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not res.ok:
            return []
        names = {e.name for e in res.picked}
        return list(res.picked) + self.fallback.rank([e for e in endpoints if e.name not in names])

    def hook(self, routing: Routing, name: str, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(routing.lifecycle, name)(*args, **kwargs)
        except Exception:  # noqa: BLE001
            log.warning("router hook %s failed", name, exc_info=True)
            self.metrics.fallbacks.labels(reason="hook-error").inc()

    def dispatch(self, routing: Routing, request: InferenceRequest, ep: Endpoint, now: float) -> None:
        res = routing.result
        if res.endpoint is not None and ep.name != res.endpoint.name:
            # a retry elsewhere: account it there (the clone carries the candidate's prediction)
            ep = next((c for c in res.candidates if c.name == ep.name), ep)
            self.hook(routing, "pre_request", request, res, now, endpoint=ep)
        else:
            self.hook(routing, "pre_request", request, res, now)

    def first_chunk(self, routing: Routing, request: InferenceRequest, now: float, tokens: int | None = None) -> None:
        self.hook(routing, "on_first_chunk", request.request_id, now, tokens)

    def chunk(self, routing: Routing, request: InferenceRequest, now: float, tokens: int) -> None:
        """Tokens streamed after the first chunk (the producer measures each request's TPOT so far)."""
        self.hook(routing, "on_chunk", request.request_id, now, tokens)

    def complete(self, routing: Routing, request: InferenceRequest, outcome: Outcome, now: float) -> None:
        self.hook(routing, "on_complete", request.request_id, now, status=outcome.status or 599,
                  aborted=not outcome.ok, output_tokens=outcome.tokens if outcome.tokens > 0 else None,
                  prompt_tokens=outcome.prompt_tokens or None)

    async def aclose(self) -> None:
        await aclose_policy(self.policy)


async def aclose_policy(policy: Any) -> None:
    """Stop the policy: its own ``aclose`` (flow control), else the producer's clients."""
    closer = getattr(policy, "aclose", None)
    if closer is not None:
        await closer()
        return
    producer = getattr(policy, "producer", None)
    if producer is None:
        return
    if producer.predictor is not None:
        try:
            await producer.predictor.aclose()
        except Exception:  # noqa: BLE001
            log.debug("predictor close failed", exc_info=True)
    if producer.sink is not None and callable(getattr(producer.sink, "close", None)):
        await asyncio.get_running_loop().run_in_executor(None, producer.sink.close)
