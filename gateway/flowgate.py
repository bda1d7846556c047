"""Flow control in the gateway: epp_client's FlowController in front of the router.

``FlowGate`` wraps the gateway's routing policy and is itself a request lifecycle
(:mod:`epp_client.framework.lifecycle`). ``aschedule`` first enqueues the request in its
band (priority) and flow (fairness id header) and waits until the dispatcher releases
it: while the pool is saturated (the configured detector: llm-d's utilization detector
over the scraped endpoint metrics, or its concurrency detector over the gateway's own
in-flight accounting) nothing is released; otherwise the band's fairness policy picks the
next flow. Saturation is re-read after every release; a released request counts as in
flight from its release until its dispatch (``pre_request``) or its failure, so the
concurrency detector never releases more than its limit in one burst.
A request rejected for capacity, or still queued after the TTL, gets a denied
scheduling result: the gateway answers 429 with ``x-llm-d-request-dropped-reason``
(``rejected-saturated`` / ``rejected-ttl-expired``) and ``Retry-After``. A client that disconnects while
queued is taken out of its queue. A released request that the inner policy holds
(``decode-harm-filter``) stays released while held: scheduled again without queueing again
(its TTL is not restarted, its flow not counted twice); the gateway bounds the hold and
``abandon`` s a request that leaves while held. Completions feed the policy's per-program state
(prompt tokens as estimated by the gateway, completion tokens as counted).

Deliberate difference: a metrics snapshot counts as fresh for at least twice the
gateway's scrape interval (upstream's 200 ms default would mark every endpoint stale
between two 200 ms scrapes and halt dispatch).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from epp_client.flowcontrol import (
    REJECTED_TTL,
    EndpointLoad,
    FlowControl,
    FlowItem,
    ProgramAwareFairness,
    UtilizationDetector,
    build_flow_control,
    fairness_id,
)
from epp_client.framework.lifecycle import SchedulingResult
from epp_client.types import ADMITTED, Endpoint, InferenceRequest

from .routing import aclose_policy
from .scrape import EndpointState, cancel_task

log = logging.getLogger("gateway.flowgate")


class FlowGate:
    def __init__(self, inner, flow: FlowControl, scrape_interval_s: float = 0.2, poll_s: float = 0.02) -> None:
        self.inner = inner
        self.flow = flow
        self.name = f"flow-control+{getattr(inner, 'name', type(inner).__name__)}"
        if isinstance(flow.detector, UtilizationDetector):
            flow.detector.metrics_staleness_s = max(flow.detector.metrics_staleness_s, 2 * scrape_interval_s)
        self.poll_s = poll_s
        self.states: list = []
        self.by_name: dict[str, EndpointState] = {}
        self._live: dict[str, tuple[str, int, int]] = {}   # dispatched: request id -> (flow, prompt tokens, band)
        self._released: set[str] = set()    # released by flow control, not yet dispatched or failed
        self._held: dict[str, FlowItem] = {}   # released, then held by the inner policy: not queued again
        self.dispatch_log: collections.deque = collections.deque(maxlen=1000)   # (request id, fairness id)
        self.saturation = 1.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @classmethod
    def wrap(cls, inner, config_text: str, scrape_interval_s: float):
        """``inner`` unchanged when the config has no ``flowControl`` section."""
        flow = build_flow_control(config_text)
        return inner if flow is None else cls(inner, flow, scrape_interval_s)

    # ---- what the inner policy has: in-flight accounting, producers --------------------------
    @property
    def inflight(self):
        return self.inner.inflight

    @property
    def producer(self):
        return getattr(self.inner, "producer", None)

    @property
    def prefix_producer(self):
        return getattr(self.inner, "prefix_producer", None)

    def bind_endpoints(self, states: list[EndpointState]) -> None:
        """The gateway's endpoint states: saturation reads the candidates' scrapes (every endpoint's
        until a request names its candidates, so it is measured before the first request)."""
        self.by_name = {s.name: s for s in states}
        self.states = list(states)

    # ---- the request path -----------------------------------------------------------------
    def schedule(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None):
        raise TypeError("flow control queues requests: use aschedule")

    async def aschedule(self, req: InferenceRequest, endpoints: list[Endpoint],
                        now: float | None = None) -> SchedulingResult:
        self.states = [self.by_name[e.name] for e in endpoints if e.name in self.by_name] or self.states
        held = self._held.pop(req.request_id, None)
        if held is not None:     # released before, then held by the policy: scheduled again, not queued again
            return await self._schedule_released(req, endpoints, now, held)
        ctl = self.flow.controller
        fut = asyncio.get_running_loop().create_future()
        item, reason = ctl.enqueue(req.request_id, fairness_id(req.headers), req.priority, payload=fut)
        if item is None:
            return _denied(req, reason)
        self._ensure_dispatcher().set()
        try:
            reason = await fut
        except asyncio.CancelledError:   # client gone or request timeout while queued: leave the queue
            ctl.remove(item)
            self._released.discard(req.request_id)
            raise
        if reason:
            return _denied(req, reason)
        return await self._schedule_released(req, endpoints, now, item)

    async def _schedule_released(self, req: InferenceRequest, endpoints: list[Endpoint], now: float | None,
                                 item: FlowItem) -> SchedulingResult:
        try:
            result = await self.inner.aschedule(req, endpoints, now)
        except BaseException:
            self.abandon(req.request_id, item)
            raise
        if result.retry_after_s > 0:     # held: still released (counted) until scheduled again or abandoned
            self._held[req.request_id] = item
        elif not result.ok:              # released but never sent: no completion will follow
            self.abandon(req.request_id, item)
        return result

    def abandon(self, request_id: str, item: FlowItem | None = None) -> None:
        """A released request that will not be dispatched (denied, or its client left while held)."""
        item = self._held.pop(request_id, None) or item
        self._released.discard(request_id)
        if item is not None:
            self.flow.controller.on_complete(item.fairness_id, 0, 0, item.priority)
        if self._wake is not None:
            self._wake.set()

    def _ensure_dispatcher(self) -> asyncio.Event:
        """The running dispatcher's wake-up event (a dispatcher is started when none runs)."""
        wake = self._wake
        if wake is None or self._task is None or self._task.done():
            wake = self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._dispatcher(wake))
        return wake

    def _loads(self) -> list[EndpointLoad]:
        """Per candidate: its scrape and the in-flight counts (the inner policy's accounting)."""
        tracker = self.inner.inflight
        out = []
        for s in self.states:
            ld = tracker.snapshot(s.name) if tracker is not None else None
            out.append(EndpointLoad(s.metrics.waiting or 0, s.metrics.kv_cache_usage or 0.0,
                                    s.scraped_at if s.scraped_at > 0 else None,
                                    ld.requests if ld else 0, ld.tokens if ld else 0))
        return out

    def _saturation(self) -> float:
        self.saturation = self.flow.detector.saturation(self._loads(), time.monotonic(),
                                                        pending=len(self._released))
        return self.saturation

    async def _dispatcher(self, wake: asyncio.Event) -> None:
        ctl = self.flow.controller
        while True:
            for item in ctl.expire():
                if not item.payload.done():
                    item.payload.set_result(REJECTED_TTL)
            while True:
                item = ctl.dispatch_next(self._saturation())
                if item is None:
                    break
                self.dispatch_log.append((item.request_id, item.fairness_id))
                if item.payload.done():     # its client left in the meantime: undo the dispatch
                    ctl.on_complete(item.fairness_id, 0, 0, item.priority)
                else:
                    self._released.add(item.request_id)
                    item.payload.set_result("")
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), self.poll_s if ctl.size else 1.0)
            except TimeoutError:
                pass

    # ---- lifecycle hooks: forwarded; completions feed the fairness policy -------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult, now: float | None = None, *,
                    endpoint: Endpoint | None = None) -> None:
        self._live[request.request_id] = (fairness_id(request.headers), request.input_tokens, request.priority)
        self._released.discard(request.request_id)     # from now on the in-flight tracker counts it
        self._held.pop(request.request_id, None)
        self.inner.pre_request(request, result, now, endpoint=endpoint)

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        self.inner.on_first_chunk(request_id, now, tokens)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        self.inner.on_chunk(request_id, now, tokens)

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        live = self._live.pop(request_id, None)
        self._released.discard(request_id)
        try:
            if live is not None:
                flow, estimated_prompt, priority = live
                self.flow.controller.on_complete(flow, estimated_prompt, max(0, output_tokens or 0), priority)
        finally:
            self.inner.on_complete(request_id, now, status=status, aborted=aborted, output_tokens=output_tokens,
                                   prompt_tokens=prompt_tokens)
        if self._wake is not None:
            self._wake.set()

    async def aclose(self) -> None:
        await cancel_task(self._task)
        await aclose_policy(self.inner)

    # ---- introspection and metrics ----------------------------------------------------------
    def snapshot(self) -> dict:
        ctl = self.flow.controller
        if self.states:
            self._saturation()
        return {"saturation": self.saturation, "queued": ctl.size,
                "queues": [{"priority": p, "fairness_id": f, "length": n} for (p, f), n in ctl.queue_sizes().items()],
                "dispatched": [{"request_id": r, "fairness_id": f} for r, f in self.dispatch_log],
                "rejected": dict(ctl.rejected)}

    def collect(self):
        """Prometheus collector: flow-control state and program-aware fairness metrics (B4.5)."""
        ctl = self.flow.controller
        sat = GaugeMetricFamily("llm_d_epp_flow_control_pool_saturation", "Pool saturation (dispatch stops at 1.0)")
        sat.add_metric([], self.saturation)
        yield sat
        q = GaugeMetricFamily("llm_d_epp_flow_control_queue_size", "Requests waiting per band and flow",
                              labels=["priority", "fairness_id"])
        for (p, f), n in ctl.queue_sizes().items():
            q.add_metric([str(p), f], n)
        yield q
        rej = CounterMetricFamily("llm_d_epp_flow_control_rejected", "Requests rejected by flow control",
                                  labels=["reason"])
        for reason, n in ctl.rejected.items():
            rej.add_metric([reason], n)
        yield rej
        jain = GaugeMetricFamily("llm_d_epp_program_aware_jains_fairness_index",
                                 "Jain's fairness index over the per-program mean queue waits")
        wait = GaugeMetricFamily("llm_d_epp_program_aware_avg_wait_time_milliseconds",
                                 "Running mean of the flow-control queue wait per program", labels=["program_id"])
        svc = GaugeMetricFamily("llm_d_epp_program_aware_attained_service_tokens",
                                "Time-decayed attained service per program (LAS)", labels=["program_id"])
        pols = [p for p in ctl.policies() if isinstance(p, ProgramAwareFairness)]
        for pol in pols:
            jain.add_metric([], pol.jains_index())
            for pid, v in pol.avg_wait_ms().items():
                wait.add_metric([pid], v)
            for pid, v in pol.attained_service().items():
                svc.add_metric([pid], v)
        if pols:
            yield from (jain, wait, svc)


def _denied(req: InferenceRequest, reason: str) -> SchedulingResult:
    return SchedulingResult(req.request_id, [], {}, ADMITTED, status=429, reason=reason)
