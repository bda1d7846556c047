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
    on_complete(request_id, now=None, *, status=200, aborted=False, output_tokens=None,
                prompt_tokens=None)          # the response's usage, when it reports them

Its jobs, one module each beside this one: the feature rows and training entries it sends
(:mod:`.samples`), the predictions with their SLO headroom (:mod:`.predictions`), the request
contexts and running queue (:mod:`.request_state`), the twin's view of an endpoint
(:mod:`.twin_view`) and the debug state (:mod:`.debug_state`).

Differences from upstream (A.2): aborted / failed / non-2xx responses produce no
training sample (3); samples carry ``predicted_ttft_ms``, ``predicted_tpot_ms`` and
``model_version`` of the chosen endpoint (4); ``num_tokens_generated`` is 0 in prediction
rows as in TTFT training rows (5); TPOT divides by the token count when the response
reports it (``tokens`` / ``output_tokens``), by body chunks otherwise (6); a prefix score
with ``total_blocks = 0`` is 0 (7).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY
from typing import Any

from epp_client.engine.columns import DecodingView
from epp_client.engine.prompt_scale import PromptScale
from epp_client.engine.twin import Running
from epp_client.framework.params import Plugin, gt, param
from epp_client.framework.protocols import Producer
from epp_client.framework.registry import plugin
from epp_client.plugins.producer.debug_state import dump_state
from epp_client.plugins.producer.predictions import apply_predictions
from epp_client.plugins.producer.request_state import ContextCache, RequestContext, RunningQueue
from epp_client.plugins.producer.running_columns import LazyView, RunningColumns
from epp_client.plugins.producer.samples import SampleEmitter, feature_rows, rows_for_predictor
from epp_client.plugins.producer.twin_view import running_on
from epp_client.predictor import BulkPrediction
from epp_client.types import PREFILL_PROFILE, Endpoint, InferenceRequest, uncached_prompt_tokens


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
        self._columns: RunningColumns | None = None     # kept from the first decision that reads them
        self.running = RunningQueue()
        self._cache = ContextCache(self.running, self.context_ttl, self.max_contexts)
        self._first_token_at: dict[str, float] = {}   # endpoint -> when a request there last had its first token
        self._counters = {"predictions": 0, "prediction_failures": 0, "ttft_samples": 0, "tpot_samples": 0,
                          "skipped_samples": 0, "ttft_slo_violations": 0, "tpot_slo_violations": 0}
        self._samples = SampleEmitter(self.sink, self.wall_clock, self._counters)
        #: the engine's prompt tokens per estimated token, learned from the responses' usage (the twin's unit)
        self.prompt_scale = PromptScale()

    @property
    def counters(self) -> dict[str, int]:
        """Predictions made and failed, samples emitted and skipped, SLO violations seen, contexts expired."""
        return {**self._counters, "expired_contexts": self._cache.expired}

    def discard(self, request_id: str) -> None:
        """Forget a request that was never dispatched (denied or dropped)."""
        self._cache.discard(request_id)

    def tracked_requests(self) -> int:
        return len(self._cache)

    # -- Produce ---------------------------------------------------------------------
    def _prepare(self, request: InferenceRequest, endpoints: list[Endpoint],
                 now: float) -> tuple[RequestContext, list[dict]]:
        ctx = self._cache.get(request.request_id, now)
        if ctx is None:
            ctx = RequestContext(request.request_id, max(0, int(request.input_tokens)))
        ctx.ttft_slo = request.ttft_slo_ms
        ctx.tpot_slo = request.tpot_slo_ms
        rows = feature_rows(ctx, endpoints, use_encoder_cache_features=self.use_encoder_cache_features,
                            endpoint_role_label=self.endpoint_role_label)
        ctx.rows = {e.name: row for e, row in zip(endpoints, rows)}
        return ctx, rows

    def decoding(self, endpoint: str, now: float) -> tuple[Running, ...]:
        """The twin's view of ``endpoint`` at ``now`` (:func:`.twin_view.running_on`)."""
        return running_on(endpoint, now, self.running, self._cache.contexts, self._first_token_at)

    def decoding_columns(self, now: float) -> DecodingView:
        """Every endpoint's view at ``now`` as columns (:class:`.running_columns.RunningColumns`),
        kept from the first call on (a configuration without a plugin reading them pays nothing)."""
        cols = self._columns
        if cols is None:
            contexts = self._cache.contexts
            cols = self._columns = RunningColumns(contexts=contexts, first_token_at=self._first_token_at)
            for endpoint in self.running.endpoints():
                for rid, slo in self.running.requests(endpoint).items():
                    cols.add(endpoint, rid, slo)
                    ctx = contexts.get(rid)
                    if ctx is not None:
                        cols.sync(ctx)
            self.running.columns = cols
        return cols.view(now)

    def _apply(self, ctx: RequestContext, endpoints: list[Endpoint], result: BulkPrediction | None,
               now: float) -> None:
        if result is None or len(result.ttft_ms) != len(endpoints) or len(result.tpot_ms) != len(endpoints):
            self._counters["prediction_failures"] += 1
            return  # no attribute written; consumers fall back (B1.9)
        self._counters["predictions"] += 1
        apply_predictions(ctx, endpoints, result, now, running=self.running, streaming_mode=self.streaming_mode,
                          endpoint_role_label=self.endpoint_role_label, slo_buffer_factor=self.slo_buffer_factor,
                          decoding=self.decoding, prompt_scale=self.prompt_scale.factor,
                          decoding_columns=LazyView(self.decoding_columns, now) if self.streaming_mode else None)

    def produce(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None) -> None:
        now = self.clock() if now is None else now
        ctx, rows = self._prepare(request, endpoints, now)
        if self.predict_in_produce and endpoints and self.predictor is not None:
            self._apply(ctx, endpoints, self.predictor.predict_bulk(rows_for_predictor(rows)), now)
        self._cache.store(ctx, now)

    async def aproduce(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None) -> None:
        now = self.clock() if now is None else now
        ctx, rows = self._prepare(request, endpoints, now)
        if self.predict_in_produce and endpoints and self.predictor is not None:
            result = await self.predictor.apredict_bulk(rows_for_predictor(rows))
            self._apply(ctx, endpoints, result, now)
        self._cache.store(ctx, now)

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
        ctx = self._cache.get(request.request_id, now)
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
        scale = self.prompt_scale
        ctx.engine_prompt = scale.tokens(ctx.input_tokens)
        ctx.uncached = 0 if ctx.prefill_target is not None else \
            scale.tokens(uncached_prompt_tokens(primary, ctx.input_tokens))
        # the twin's view (a decode-harm plugin's, just before): sent with the TTFT entry
        ctx.engine = request.engine_view if self.streaming_mode and ctx.prefill_target is None else None
        request.engine_view = None
        if request.request_id:
            self.running.add(primary.name, request.request_id, ctx.tpot_slo)
            if self._columns is not None:
                self._columns.sync(ctx)

    # -- ResponseBody -----------------------------------------------------------------
    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        self.on_chunk(request_id, now, tokens)

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        """A non-final body chunk (``tokens``: tokens it carries, when the response says)."""
        now = self.clock() if now is None else now
        ctx = self._cache.get(request_id, now)
        if ctx is None or ctx.dispatch is None or not self.streaming_mode:
            return  # non-streaming mode ignores intermediate chunks
        self._count(ctx, tokens)
        if ctx.ttft_ms == 0:
            ctx.ttft_ms = float(int((now - ctx.dispatch) * 1000.0))
            if ctx.target is not None:
                self._first_token_at[ctx.target] = now
            ctx.chunks = 1
            ctx.tokens = tokens if tokens is not None else 0
            self._samples.ttft(ctx)
            if ctx.ttft_ms == 0:
                ctx.ttft_ms = 1e-9  # measured (sub-ms): later chunks are not first chunks
        else:
            ctx.chunks += 1
        if self._columns is not None:
            self._columns.sync(ctx)

    def _count(self, ctx: RequestContext, tokens: int | None) -> None:
        if tokens is None:
            ctx.tokens_known = False
        elif ctx.ttft_ms:
            ctx.tokens += tokens

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """End of stream (or abort). Aborted / non-2xx responses train nothing (A.2.3).
        ``prompt_tokens``: the prompt's true length when the response reported it
        (``usage.prompt_tokens``): the TPOT entry's engine sums are computed with it, and the
        ratio to the estimate teaches :attr:`prompt_scale`."""
        now = self.clock() if now is None else now
        ctx = self._cache.get(request_id, now)
        self.running.remove(request_id)
        if ctx is None:
            return
        del self._cache.contexts[request_id]
        if ctx.dispatch is None:
            return
        failed = aborted or not 200 <= status < 300
        if not failed:
            self.prompt_scale.observe(ctx.input_tokens, prompt_tokens)
        e2e_ms = float(int((now - ctx.dispatch) * 1000.0))
        if not self.streaming_mode:
            if failed:
                self._counters["skipped_samples"] += 1
                return
            ctx.ttft_ms = e2e_ms
            self._samples.ttft(ctx)
            return
        if ctx.ttft_ms == 0:
            return  # single-chunk streaming response: nothing recorded
        ctx.chunks += 1
        if failed:
            self._counters["skipped_samples"] += 1
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
            self._samples.tpot(ctx, avg_tpot, prompt_tokens)

    def dump_state(self, max_endpoints: int = 100) -> dict:
        """The debug state (B1.8, :func:`.debug_state.dump_state`), with the engine's prompt tokens
        per estimated token learned so far and the responses it was learned from."""
        return {**dump_state(self.running, len(self._cache), max_endpoints),
                "promptScale": {"enginePerEstimatedToken": self.prompt_scale.factor,
                                "samples": self.prompt_scale.samples}}
