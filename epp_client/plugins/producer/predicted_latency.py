"""``predicted-latency-producer`` (B1.2-B1.8, B2.1).

Lifecycle hooks, callable by a router or a simulator without HTTP. Every hook takes an
optional ``now`` (seconds, on the producer's ``clock``; default ``time.monotonic``) so a
discrete-event simulator can drive it with simulated time::

    produce(request, endpoints)              # before scheduling: one bulk prediction,
    await aproduce(request, endpoints)       #   writes Endpoint.prediction on every candidate
    pre_request(request, picks, now=None)    # after the pick; picks: {profile: endpoint}
                                             #   (or one Endpoint / a list: primary profile)
    on_first_chunk(request_id, now=None, tokens=None)
    on_chunk(request_id, now=None, tokens=None)
    on_complete(request_id, now=None, *, status=200, aborted=False, output_tokens=None)

Training entries go to ``sink.add(list[dict])`` (see :mod:`epp_client.training`), with
``timestamp`` from ``wall_clock`` (default ``time.time``).

Differences from upstream (A.2): aborted / failed / non-2xx responses produce no
training sample (3); samples carry ``predicted_ttft_ms``, ``predicted_tpot_ms`` and
``model_version`` of the chosen endpoint (4); ``num_tokens_generated`` is 0 in prediction
rows as in TTFT training rows (5); TPOT divides by the token count when the response
reports it (``tokens`` / ``output_tokens``), by body chunks otherwise (6); a prefix score
with ``total_blocks = 0`` is 0 (7). ``pod_type`` is sent only for the label values the
wire contract knows (``prefill``, ``decode``); other role values are omitted.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY
from datetime import UTC, datetime
from functools import partial
from typing import Any

from epp_client.engine.twin import Running
from epp_client.framework.params import Plugin, gt, param
from epp_client.framework.protocols import Producer
from epp_client.framework.registry import plugin
from epp_client.plugins.producer.request_state import RequestContext, RunningQueue
from epp_client.predictor import BulkPrediction
from epp_client.types import PREFILL_PROFILE, Endpoint, InferenceRequest, LatencyPrediction, uncached_prompt_tokens

_KNOWN_POD_TYPES = ("prefill", "decode")


@plugin("predicted-latency-producer", Producer)
class PredictedLatencyProducer(Plugin):
    """Calls the predictor once per request for all candidates and writes
    :class:`~epp_client.types.LatencyPrediction` onto each; emits training samples."""

    predictor: Any = None
    sink: Any = None
    _: KW_ONLY
    slo_buffer_factor: float = param("sloBufferFactor", default=1.0, check=gt(0.0), doc="multiplies TPOT SLOs only")
    context_ttl: float = param("contextTTL", default=300.0, check=gt(0.0), kind="duration",
                               doc="how long a request's context is kept (Go duration or seconds)")
    streaming_mode: bool = param("streamingMode", default=False,
                                 doc="false: end-to-end mode (TTFT recorded at the end, TPOT neutral); "
                                     "true: TTFT at the first chunk plus a TPOT sample")
    endpoint_role_label: str = param("endpointRoleLabel", default="",
                                     doc="label whose value becomes `pod_type`; `prefill` neutralises TPOT")
    predict_in_produce: bool = param("predictInProduce", default=True, doc="false: training-only mode")
    prefix_match_info_producer_name: str = param("prefixMatchInfoProducerName", default="", ignored=True)
    in_flight_load_producer_name: str = param("inFlightLoadProducerName", default="", ignored=True)
    use_encoder_cache_features: bool = param("useEncoderCacheFeatures", default=False, doc="fill the encoder features")
    encoder_cache_match_info_producer_name: str = param("encoderCacheMatchInfoProducerName", default="", ignored=True)
    sampling_mean: float = param("samplingMean", default=1000.0, ignored=True)  # deprecated upstream
    max_decode_token_samples_for_prediction: int = param("maxDecodeTokenSamplesForPrediction", default=0, ignored=True)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    max_contexts: int = 100_000

    def setup(self) -> None:
        self.running = RunningQueue()
        self._contexts: OrderedDict[str, RequestContext] = OrderedDict()
        self._first_token_at: dict[str, float] = {}   # endpoint -> when a request there last had its first token
        self.counters = {"predictions": 0, "prediction_failures": 0, "ttft_samples": 0, "tpot_samples": 0,
                         "skipped_samples": 0, "expired_contexts": 0,
                         "ttft_slo_violations": 0, "tpot_slo_violations": 0}

    # -- context TTL cache (touch on read) -----------------------------------------
    def _expire(self, now: float) -> None:
        ctxs = self._contexts
        while ctxs:
            rid, ctx = next(iter(ctxs.items()))
            if now - ctx.touched < self.context_ttl and len(ctxs) <= self.max_contexts:
                break
            ctxs.popitem(last=False)
            self.running.remove(rid)  # expiry also removes the running-queue entry
            self.counters["expired_contexts"] += 1

    def _get(self, request_id: str, now: float) -> RequestContext | None:
        self._expire(now)
        ctx = self._contexts.get(request_id)
        if ctx is not None:
            ctx.touched = now
            self._contexts.move_to_end(request_id)
        return ctx

    def _store(self, ctx: RequestContext, now: float) -> None:
        ctx.touched = now
        self._contexts[ctx.request_id] = ctx
        self._contexts.move_to_end(ctx.request_id)
        self._expire(now)

    def discard(self, request_id: str) -> None:
        """Forget a request that was never dispatched (denied or dropped)."""
        if self._contexts.pop(request_id, None) is not None:
            self.running.remove(request_id)

    def tracked_requests(self) -> int:
        return len(self._contexts)

    # -- Produce ---------------------------------------------------------------------
    def _pod_type(self, e: Endpoint) -> str:
        if not self.endpoint_role_label:
            return ""
        return e.labels.get(self.endpoint_role_label, "") or ""

    def _prepare(self, request: InferenceRequest, endpoints: list[Endpoint],
                 now: float) -> tuple[RequestContext, list[dict]]:
        ctx = self._get(request.request_id, now)
        if ctx is None:
            ctx = RequestContext(request.request_id, max(0, int(request.input_tokens)))
        ctx.ttft_slo = request.ttft_slo_ms
        ctx.tpot_slo = request.tpot_slo_ms
        encoder_input = 0
        if self.use_encoder_cache_features:
            for e in endpoints:
                if e.encoder_match is not None:
                    encoder_input = e.encoder_match.input_size  # request-level: the last one sets it
        rows = []
        rows_by_name = {}
        for e in endpoints:
            m = e.metrics
            pm = e.prefix_match
            prefix = pm.score if pm is not None else 0.0
            if e.inflight is not None:
                tokens, running = e.inflight.tokens, e.inflight.requests
            else:
                tokens, running = 0, (m.running_requests_size if m is not None else 0)
            row: dict[str, Any] = {
                "kv_cache_percentage": m.kv_cache_usage if m is not None else 0.0,
                "input_token_length": ctx.input_tokens,
                "num_request_waiting": m.waiting_queue_size if m is not None else 0,
                "num_request_running": running,
                "num_tokens_generated": 0,  # A.2.5
                "prefix_cache_score": prefix,
                "prefill_tokens_in_flight": tokens,
                "decode_tokens_in_flight": 0,
                "encoder_input_size": encoder_input,
                "encoder_matched_size": min(e.encoder_match.matched_size, encoder_input)
                if self.use_encoder_cache_features and e.encoder_match is not None else 0,
            }
            pod = self._pod_type(e)
            if pod in _KNOWN_POD_TYPES:
                row["pod_type"] = pod
            if m is None:
                row["_no_metrics"] = True
            rows.append(row)
            rows_by_name[e.name] = row
        ctx.rows = rows_by_name
        return ctx, rows

    def decoding(self, endpoint: str, now: float) -> tuple[Running, ...]:
        """The requests dispatched to ``endpoint`` and not finished, in dispatch order, as the
        engine twin sees them (:class:`~epp_client.engine.twin.Running`): before the first chunk, the
        prompt tokens to prefill there (not cached on it at dispatch; none when another endpoint
        prefills it); after, the decode time and tokens so far, the tokens counted from the chunks
        when they carry counts, else at the TPOT predicted for it at dispatch."""
        out = []
        contexts = self._contexts
        head = True   # the first one waiting: its prefill runs since the later of its dispatch and the last first token
        for rid, slo in self.running.requests(endpoint).items():
            ctx = contexts.get(rid)
            if ctx is None or ctx.dispatch is None:
                continue
            slo = max(0.0, slo)
            if not ctx.ttft_ms:   # dispatched, no first chunk yet
                since = max(ctx.dispatch, self._first_token_at.get(endpoint, ctx.dispatch)) if head else now
                out.append(Running(0.0, 0, slo, ctx.input_tokens, ctx.uncached, max(0.0, now - since) * 1000.0))
                head = False
                continue
            elapsed = (now - ctx.dispatch) * 1000.0 - ctx.ttft_ms
            if ctx.tokens_known and ctx.tokens >= 1:
                tokens = ctx.tokens
            else:
                pace = ctx.predictions.get(endpoint, (0.0, 0.0))[1]
                tokens = 1 + int(max(0.0, elapsed) / pace) if pace > 0 else 1
            out.append(Running(max(0.0, elapsed), tokens, slo, ctx.input_tokens + tokens))
        return tuple(out)

    def _apply(self, ctx: RequestContext, endpoints: list[Endpoint], result: BulkPrediction | None,
               now: float = 0.0) -> None:
        if result is None or len(result.ttft_ms) != len(endpoints) or len(result.tpot_ms) != len(endpoints):
            self.counters["prediction_failures"] += 1
            return  # no attribute written; consumers fall back (B1.9)
        self.counters["predictions"] += 1
        ttft_slo, tpot_slo, f = ctx.ttft_slo, ctx.tpot_slo, self.slo_buffer_factor
        ctx.model_version = result.model_version
        running = self.running
        preds = ctx.predictions = {}
        for e, t, p in zip(endpoints, result.ttft_ms, result.tpot_ms):
            preds[e.name] = (t, p)
            ttft_headroom = ttft_slo - t
            ttft_valid = t < ttft_slo
            if not self.streaming_mode:
                tpot_headroom, tpot_valid = 0.0, True
            elif self.endpoint_role_label and e.labels.get(self.endpoint_role_label) == "prefill":
                tpot_headroom, tpot_valid = 0.0, True
            else:
                buffered = tpot_slo * f
                pod_min = running.min_tpot(e.name)
                if pod_min > 0:
                    buffered = min(buffered, pod_min * f)
                tpot_valid = p < buffered
                tpot_headroom = buffered - p
            e.prediction = LatencyPrediction(t, p, ttft_headroom, tpot_headroom, ttft_valid, tpot_valid,
                                             running.size(e.name), result.model_version, result.model_source,
                                             partial(self.decoding, e.name, now) if self.streaming_mode else ())

    def _rows_for_predictor(self, rows: list[dict]) -> list[dict]:
        if any("_no_metrics" in r for r in rows):
            return [{k: v for k, v in r.items() if k != "_no_metrics"} for r in rows]
        return rows

    def produce(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None) -> None:
        now = self.clock() if now is None else now
        ctx, rows = self._prepare(request, endpoints, now)
        if self.predict_in_produce and endpoints and self.predictor is not None:
            self._apply(ctx, endpoints, self.predictor.predict_bulk(self._rows_for_predictor(rows)), now)
        self._store(ctx, now)

    async def aproduce(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None) -> None:
        now = self.clock() if now is None else now
        ctx, rows = self._prepare(request, endpoints, now)
        if self.predict_in_produce and endpoints and self.predictor is not None:
            result = await self.predictor.apredict_bulk(self._rows_for_predictor(rows))
            self._apply(ctx, endpoints, result, now)
        self._store(ctx, now)

    # -- PreRequest ------------------------------------------------------------------
    def pre_request(self, request: InferenceRequest,
                    picks: Mapping[str, Endpoint] | Endpoint | list[Endpoint] | tuple[Endpoint, ...],
                    now: float | None = None) -> None:
        """``picks``: {profile name: endpoint} (the first entry, or ``decode``, is the
        primary profile; ``prefill`` is the prefill target), or one Endpoint / a list."""
        now = self.clock() if now is None else now
        by_profile: Mapping[str, Endpoint]
        if isinstance(picks, Endpoint):
            by_profile = {"default": picks}
        elif isinstance(picks, (list, tuple)):
            by_profile = {"default": picks[0]} if picks else {}
        else:
            by_profile = picks
        ctx = self._get(request.request_id, now)
        if ctx is None or not by_profile:
            return
        prefill = by_profile.get(PREFILL_PROFILE)
        primary = by_profile.get("decode") or next((e for p, e in by_profile.items() if p != PREFILL_PROFILE),
                                                   prefill)
        if primary is None:  # unreachable: a non-empty mapping has a non-prefill pick or the prefill pick
            return
        ctx.target = primary.name
        ctx.prefill_target = prefill.name if prefill is not None and prefill is not primary else None
        if ctx.dispatch is not None:  # re-dispatch (retry on another endpoint): move the entry
            self.running.remove(request.request_id)
        ctx.dispatch = now
        ctx.uncached = 0 if ctx.prefill_target is not None else uncached_prompt_tokens(primary, ctx.input_tokens)
        if request.request_id:
            self.running.add(primary.name, request.request_id, ctx.tpot_slo)

    # -- ResponseBody -----------------------------------------------------------------
    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        self.on_chunk(request_id, now, tokens)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        """A non-final body chunk (``tokens``: tokens it carries, when the response says)."""
        now = self.clock() if now is None else now
        ctx = self._get(request_id, now)
        if ctx is None or ctx.dispatch is None or not self.streaming_mode:
            return  # non-streaming mode ignores intermediate chunks
        self._count(ctx, tokens)
        if ctx.ttft_ms == 0:
            ctx.ttft_ms = float(int((now - ctx.dispatch) * 1000.0))
            if ctx.target is not None:
                self._first_token_at[ctx.target] = now
            ctx.chunks = 1
            ctx.tokens = tokens if tokens is not None else 0
            self._emit_ttft(ctx, now)
            if ctx.ttft_ms == 0:
                ctx.ttft_ms = 1e-9  # measured (sub-ms): later chunks are not first chunks
            return
        ctx.chunks += 1

    def _count(self, ctx: RequestContext, tokens: int | None) -> None:
        if tokens is None:
            ctx.tokens_known = False
        elif ctx.ttft_ms:
            ctx.tokens += tokens

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None) -> None:
        """End of stream (or abort). Aborted / non-2xx responses train nothing (A.2.3)."""
        now = self.clock() if now is None else now
        ctx = self._get(request_id, now)
        self.running.remove(request_id)
        if ctx is None:
            return
        del self._contexts[request_id]
        if ctx.dispatch is None:
            return
        failed = aborted or not 200 <= status < 300
        e2e_ms = float(int((now - ctx.dispatch) * 1000.0))
        if not self.streaming_mode:
            if failed:
                self.counters["skipped_samples"] += 1
                return
            ctx.ttft_ms = e2e_ms
            self._emit_ttft(ctx, now)
            return
        if ctx.ttft_ms == 0:
            return  # single-chunk streaming response: nothing recorded
        ctx.chunks += 1
        if failed:
            self.counters["skipped_samples"] += 1
            return
        if output_tokens is not None and output_tokens > 0:
            n = output_tokens
        elif ctx.tokens_known and ctx.tokens > 0:
            n = ctx.tokens
        else:
            n = ctx.chunks
        if n <= 1:
            return
        ttft = ctx.ttft_ms if ctx.ttft_ms >= 1 else 0.0
        avg_tpot = (e2e_ms - ttft) / (n - 1)
        if avg_tpot > 0:
            self._emit_tpot(ctx, avg_tpot, now)

    # -- samples -------------------------------------------------------------------------
    def _timestamp(self) -> str:
        return datetime.fromtimestamp(self.wall_clock(), UTC).isoformat().replace("+00:00", "Z")

    def _entry(self, ctx: RequestContext, endpoint: str, row: dict, ttft: float, tpot: float) -> dict:
        entry = {k: v for k, v in row.items() if k != "_no_metrics"}
        entry["actual_ttft_ms"] = ttft
        entry["actual_tpot_ms"] = tpot
        entry["timestamp"] = self._timestamp()
        pred = ctx.predictions.get(endpoint)
        if pred is not None and math.isfinite(pred[0]) and math.isfinite(pred[1]):  # A.2.4
            entry["predicted_ttft_ms"] = max(0.0, pred[0])
            entry["predicted_tpot_ms"] = max(0.0, pred[1])
            entry["model_version"] = ctx.model_version
        return entry

    def _emit_ttft(self, ctx: RequestContext, now: float) -> None:
        name = ctx.prefill_target or ctx.target
        row = ctx.rows.get(name) if name is not None else None
        if name is None or row is None or "_no_metrics" in row or self.sink is None or ctx.ttft_ms <= 0:
            self.counters["skipped_samples"] += 1
            return
        self.sink.add([self._entry(ctx, name, row, ctx.ttft_ms, 0.0)])
        self.counters["ttft_samples"] += 1
        if 0 < ctx.ttft_slo < ctx.ttft_ms:
            self.counters["ttft_slo_violations"] += 1

    def _emit_tpot(self, ctx: RequestContext, avg_tpot: float, now: float) -> None:
        target = ctx.target
        row = ctx.rows.get(target) if target is not None else None
        if target is None or row is None or "_no_metrics" in row or self.sink is None:
            self.counters["skipped_samples"] += 1
            return
        row = dict(row, prefix_cache_score=0.0, encoder_input_size=0, encoder_matched_size=0)
        self.sink.add([self._entry(ctx, target, row, 0.0, avg_tpot)])
        self.counters["tpot_samples"] += 1
        if 0 < ctx.tpot_slo < avg_tpot:
            self.counters["tpot_slo_violations"] += 1

    # -- debug state (B1.8) ----------------------------------------------------------------
    def dump_state(self, max_endpoints: int = 100) -> dict:
        eps: list[dict[str, Any]] = []
        for name in self.running.endpoints():
            mt = self.running.min_tpot(name)
            eps.append({"endpoint": name, "runningRequests": self.running.size(name),
                        "minTpotSlo": mt if math.isfinite(mt) else 0})
        eps.sort(key=lambda d: (-d["runningRequests"], d["endpoint"]))
        return {"endpoints": eps[:max_endpoints], "totalEndpoints": len(eps), "maxEndpoints": max_endpoints,
                "truncated": len(eps) > max_endpoints, "trackedRequests": len(self._contexts)}
