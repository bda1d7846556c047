"""The ``epp_client`` scheduler as the gateway's router.

Each request becomes an :class:`epp_client.InferenceRequest`, each candidate an
:class:`epp_client.Endpoint` carrying the scraped metrics and the gateway's prefix match;
``Scheduler.aschedule`` runs producer (one bulk prediction call) → admitters → profile.
The lifecycle hooks (pre_request / on_first_chunk / on_complete) drive the producer,
which measures TTFT/TPOT and sends training samples with what was predicted, and the
scheduler's in-flight accounting.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from epp_client.predictor import PredictorClient
from epp_client.scheduler import Scheduler, SchedulingResult
from epp_client.training import TrainingReporter
from epp_client.types import Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch

from .router import Candidate, Decision, Outcome, RequestInfo
from .settings import GatewaySettings

log = logging.getLogger("gateway.epp_router")


class _Picks:
    """What ``Scheduler.pre_request`` reads from a result: profile -> endpoint."""

    def __init__(self, picks: dict[str, Endpoint]) -> None:
        self.picks = picks


def to_endpoint(c: Candidate) -> Endpoint:
    st = c.state
    m = st.metrics
    hostport = st.host_port
    host, _, port = hostport.rpartition(":")
    return Endpoint(
        name=st.name, address=host, port=int(port) if port.isdigit() else 0, labels=dict(st.labels),
        metrics=EndpointMetrics(kv_cache_usage=m.kv_cache_usage or 0.0, waiting_queue_size=m.waiting or 0,
                                running_requests_size=m.running or 0, active_lora_adapters=m.active_lora,
                                waiting_lora_adapters=m.waiting_lora, max_active_lora=m.max_lora),
        prefix_match=PrefixMatch(c.prefix.match_blocks, c.prefix.total_blocks, c.prefix.block_size_tokens),
    )


class EppRouter:
    name = "epp-scheduler"

    def __init__(self, scheduler: Scheduler, predictor: Any = None, reporter: Any = None) -> None:
        self.scheduler = scheduler
        self.predictor = predictor
        self.reporter = reporter

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> "EppRouter":
        text = Path(settings.config).read_text()
        predictor = (PredictorClient(settings.prediction_urls) if settings.prediction_urls
                     else PredictorClient.from_env())
        reporter = (TrainingReporter(settings.training_url) if settings.training_url
                    else TrainingReporter.from_env())
        sched = Scheduler.from_config(text, predictor=predictor, sink=reporter)
        return cls(sched, predictor, reporter)

    async def schedule(self, req: RequestInfo, candidates: list[Candidate]) -> Decision:
        ereq = InferenceRequest(request_id=req.request_id, headers=req.headers, priority=req.priority,
                                input_tokens=req.input_tokens, target_model=req.model,
                                streaming=req.streaming, max_tokens=req.max_tokens)
        by_name = {c.state.name: c for c in candidates}
        res: SchedulingResult = await self.scheduler.aschedule(ereq, [to_endpoint(c) for c in candidates])
        predicted = {e.name: (e.prediction.ttft_ms, e.prediction.tpot_ms)
                     for e in res.candidates if e.prediction is not None}
        version = next((e.prediction.model_version for e in res.candidates if e.prediction is not None), "")
        fallback = self.scheduler.producer is not None and not predicted
        if not res.ok:
            return Decision(order=[], admitted=False, status=res.status if res.status >= 400 else 429,
                            reason=res.reason or res.admission.reason or "rejected",
                            fallback=fallback, predicted=predicted, model_version=version)
        # P/D: x-prefiller-host-port / x-encoder-hosts-ports go upstream with the request
        # (set when the stage ran, removed otherwise, so a client cannot choose them)
        self.scheduler.apply_stage_headers(req.headers, res)
        return Decision(order=[by_name[e.name] for e in res.picked if e.name in by_name],
                        fallback=fallback, predicted=predicted, model_version=version,
                        handle={"request": ereq, "result": res, "dispatched": None})

    def on_dispatch(self, decision: Decision, cand: Candidate, req: RequestInfo, now: float) -> None:
        h = decision.handle
        if h is None:
            return
        res: SchedulingResult = h["result"]
        if h["dispatched"] is None and res.endpoint is not None and res.endpoint.name == cand.state.name:
            self.scheduler.pre_request(h["request"], res, now=now)
        else:  # a retry on another endpoint: account it there instead
            ep = next((e for e in res.candidates if e.name == cand.state.name), None) or to_endpoint(cand)
            self.scheduler.pre_request(h["request"], _Picks({self.scheduler.primary_profile: ep}), now=now)
        h["dispatched"] = cand.state.name

    def on_first_chunk(self, decision: Decision, cand: Candidate, req: RequestInfo, now: float) -> None:
        if decision.handle is not None:
            self.scheduler.on_first_chunk(req.request_id, now=now)

    def on_complete(self, decision: Decision, cand: Candidate, req: RequestInfo, outcome: Outcome,
                    now: float) -> None:
        if decision.handle is not None:
            self.scheduler.on_complete(req.request_id, now=now, status=outcome.status or 599,
                                       aborted=not outcome.ok,
                                       output_tokens=outcome.tokens if outcome.tokens > 0 else None)

    async def aclose(self) -> None:
        if self.predictor is not None:
            try:
                await self.predictor.aclose()
            except Exception:  # noqa: BLE001
                log.debug("predictor close failed", exc_info=True)
        if self.reporter is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.reporter.close)
