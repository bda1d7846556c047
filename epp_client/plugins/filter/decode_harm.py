"""``decode-harm-filter`` and ``decode-harm-scorer`` (this project's; none exists upstream):
prefer the endpoints where the request does the least harm: the fewest running requests pushed
over their TPOT SLO by its prefill, and not a miss of its own. The filter is first in the
recommended profile, holding requests (docs/plugins.md B2.9).

A prompt's prefill slows every engine step of the server it lands on, and with it the decode of
every request running there (docs/evaluation.md §4: on ``standard`` at 80% load every policy
that judges only the request being placed misses TPOT for 5% or more). Per candidate ``e`` with
a prediction, the engine twin (:mod:`epp_client.engine.twin`) steps ``e``'s continuous batching forward
from the requests this router has running there (``LatencyPrediction.decoding``, streaming mode),
with the request queued last (its prompt tokens not cached on ``e`` to prefill) until its first
token plus ``probeSteps`` decode steps, and without it to the same moment. The count:

- the running requests over their TPOT SLO with the request and not without (the harm);
- plus 1 when the request itself misses there: its twin TTFT over its TTFT SLO, or its TPOT over
  the probe steps over its TPOT SLO (``countOwnMiss``); with ``maxLateness`` set, 1,000 times its
  lateness where it would be more than that many times over its SLO (bounds the wait of prompts
  too large for any endpoint's SLO, which the count otherwise isolates on one endpoint under
  overload); with ``maxTtftMs`` set, 1,000 times its TTFT over that bound where the twin's TTFT is
  over it (a prompt queued where its client gives up before its first token); with the filter's
  ``overMaxTtft: shed`` that term is left out and a request whose twin TTFT is over the bound on
  every endpoint kept is refused instead (429 ``shed-ttft-over-bound``, whatever its priority);
- plus ``adapterLoadCount`` (2) when ``e`` serves LoRA adapters and the request's is not active
  there (the twin knows nothing of adapter slots: without it the filter thrashes adapters,
  ``multi-lora`` at 80% 45% against 64%), plus 1 when ``e``'s scraped KV cache use is over
  ``kvUsageThreshold`` (0.95): a prompt's blocks there risk preempting a running request, a
  cliff the twin does not model (``heterogeneous`` at 100%, seed 2: 37% with 1,293 preemptions
  without it, 60% with 315).

With ``holdSlackMs`` the filter also holds requests: where the request would harm running requests
on every endpoint it keeps, and would still have more than that much of its TTFT SLO left after
``holdRetryMs``, it raises :class:`~epp_client.types.HoldRequest`; the scheduler answers a held
result and the caller (the gateway, the simulator) schedules the request again ``holdRetryMs``
later with the time held in ``InferenceRequest.waited_ms``, which the TTFT SLO is reduced by. The
prefill goes where and when the decodes it would slow are gone, at the cost of TTFT slack the
request did not need. No request is held longer than its bound: ``maxHoldMs``, and with a TTFT SLO
``maxHoldSloShare`` of it; the last retry comes at the bound, and the request is placed then.

A request late on every endpoint (the twin's TTFT or TPOT over its SLO wherever it goes) is placed
where it is least late (``hopelessPlacement: least-late``), not where it harms fewest: that is the
endpoint whose running requests are late already, and it would wait behind them. With
``shedWhenHopeless`` a sheddable one (priority < 0) is refused instead: the filter raises
:class:`~epp_client.types.ShedRequest`, a 429 ``shed-slo-unreachable``.

The step time is linear in the batch (:class:`~epp_client.engine.twin.StepModel`; the ``step*``
parameters are the router's prior, ``engineSpeed`` divides them all). With ``learnEngine`` each
endpoint is stepped with the step model the training server learned, once served (its class's
coefficients, its own speed: :mod:`epp_client.engine.learned`), from the twin's view of each
dispatched request that :meth:`DecodeHarmCount.pre_request` hands the producer's TPOT entry.
The twin is the plugins' :class:`EngineModel`, their one view of an engine: a reference that
knows the engine (the simulator's ``--true-harm``) replaces it with
:meth:`DecodeHarmCount.use_engine_model`.

The filter keeps the endpoints with the lowest count (order preserved; endpoints without a
prediction only when none has one); the scorer gives ``1 / (1 + count)``, 0 without a prediction.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from epp_client.engine.features import EngineView, decoding_features, queued_features, step_features, twin_ttft
from epp_client.engine.learned import LearnedTwin, StepModels, engine_class
from epp_client.engine.model import EngineModel, Outcome
from epp_client.engine.prompt_scale import engine_tokens
from epp_client.engine.twin import StepModel
from epp_client.engine.twin_engine import TwinEngine
from epp_client.framework.params import Plugin, ge, gt, one_of, param, within
from epp_client.framework.protocols import Filter, RequestHooksBase
from epp_client.framework.registry import plugin
from epp_client.plugins.scorer.lora_affinity import lora_affinity
from epp_client.types import (
    TTFT_SLO_HEADERS,
    Endpoint,
    HoldRequest,
    InferenceRequest,
    ShedRequest,
    parse_slo,
    uncached_prompt_tokens,
)

_STEP = StepModel()
_FAR = 1000.0   # the own miss's weight per unit of lateness past maxLateness
_MIN_HOLD_MS = 1.0   # a hold shorter than this is no hold: the request is placed
#: the reason of a request refused with shedWhenHopeless
SHED_SLO_UNREACHABLE = "shed-slo-unreachable"
#: the reason of a request refused with overMaxTtft: shed
SHED_TTFT_OVER_BOUND = "shed-ttft-over-bound"


def engine_prompt(request: InferenceRequest, endpoints: list[Endpoint], scale: float) -> tuple[int, list[int]]:
    """The request's prompt tokens and, per endpoint, those of them cached there, in the engine's
    tokens: the gateway's estimate and the prefix match at ``scale`` engine tokens per estimated
    token (the producer's :class:`~epp_client.engine.prompt_scale.PromptScale`)."""
    est = max(0, int(request.input_tokens))
    prompt = engine_tokens(est, scale)
    return prompt, [prompt - engine_tokens(uncached_prompt_tokens(e, est), scale) for e in endpoints]


def lateness(request: InferenceRequest, o: Outcome) -> float:
    """How many times over its SLO the request is in the twin's outcome ``o``: the larger of its
    TTFT over what is left of its TTFT SLO and its TPOT over its TPOT SLO (0 without SLOs)."""
    return _lateness(request.ttft_slo_ms, request.tpot_slo_ms, o)


def _lateness(ttft_slo_ms: float, tpot_slo_ms: float, o: Outcome) -> float:
    """:func:`lateness` with the request's SLOs read once (they are parsed from its headers)."""
    return max(o.ttft_ms / ttft_slo_ms if ttft_slo_ms > 0 else 0.0,
               o.tpot_ms / tpot_slo_ms if tpot_slo_ms > 0 else 0.0)


def _loads_an_adapter(target: str, e: Endpoint) -> bool:
    """The endpoint serves LoRA adapters and ``target`` is not active there: serving the request
    there waits for the adapter to load, and may swap out one that others use."""
    m = e.metrics
    return bool(target) and m is not None and m.max_active_lora > 0 and lora_affinity(target, m) < 1.0


class DecodeHarmCount(RequestHooksBase, Plugin):
    """What both plugins share: their parameters, the count per endpoint (:meth:`scores`) and the
    twin's view of each dispatched request (:meth:`pre_request`)."""

    prefill_chunk_tokens: int = param("prefillChunkTokens", default=2048, check=gt(0),
                                      doc="tokens the engine batches per step (vLLM's max_num_batched_tokens)")

    probe_steps: int = param("probeSteps", default=4, check=gt(0),
                             doc="decode steps of the request after its first token that the harm is judged at")

    own_miss: bool = param("countOwnMiss", default=True,
                           doc="add 1 where the request itself misses its SLO in the twin")

    max_lateness: float = param("maxLateness", default=0.0, check=ge(0.0),
                                doc="where the request would be over this many times its SLO, its own miss "
                                    "counts 1,000 times its lateness: such an endpoint only when all are, the "
                                    "least late of them (0: never; bounds the wait of requests too large for "
                                    "any endpoint's SLO, at a cost under overload)")

    max_ttft_ms: float = param("maxTtftMs", default=0.0, check=ge(0.0),
                               doc="where the twin's TTFT is over this many ms, the request's own miss counts "
                                   "1,000 times its TTFT over the bound: such an endpoint only when all are, the "
                                   "soonest of them (0: never; set it below the client's or gateway's first-byte "
                                   "timeout, so a prompt is not queued where its client leaves before its first "
                                   "token)")

    adapter_load_count: float = param("adapterLoadCount", default=2.0, check=ge(0.0),
                                      doc="added where the request's LoRA adapter is not active on an endpoint "
                                          "that serves adapters (0: never)")

    kv_usage_threshold: float = param("kvUsageThreshold", default=0.95, check=within(0.0, 1.0),
                                      doc="add 1 where the endpoint's scraped KV cache use is above it (1: never)")

    step_fixed_ms: float = param("stepFixedMs", default=_STEP.fixed_ms, check=ge(0.0),
                                 doc="engine step time: ms per step")

    step_per_token_ms: float = param("stepPerTokenMs", default=_STEP.per_token_ms, check=ge(0.0),
                                     doc="engine step time: ms per token in the batch")

    step_per_context_token_ms: float = param("stepPerContextTokenMs", default=_STEP.per_context_token_ms,
                                             check=ge(0.0), doc="engine step time: ms per context token of the "
                                                                "decoding requests")

    step_decode_ms: float = param("stepDecodeMs", default=_STEP.decode_ms, check=ge(0.0),
                                  doc="engine step time: ms added when the batch has decodes")

    step_per_prefill_pair_ms: float = param("stepPerPrefillPairMs", default=_STEP.per_prefill_pair_ms,
                                            check=ge(0.0), doc="engine step time: ms per causal token pair "
                                                               "of the prefill chunks")

    engine_speed: float = param("engineSpeed", default=1.0, check=gt(0.0),
                                doc="divides every step time (2: servers twice as fast as the step model)")

    max_steps: int = param("maxSteps", default=4000, check=gt(0),
                           doc="engine steps the twin runs per candidate at most (bounds the work per decision)")

    learn_engine: bool = param("learnEngine", default=True,
                               doc="step each endpoint with the step model the training server learned (its "
                                   "class's coefficients, its own speed) once one is served; the step* parameters "
                                   "and engineSpeed are the prior until then, and for a class not learned (false: "
                                   "always the prior)")

    engine_model_label: str = param("engineModelLabel", default="llm-d.ai/model",
                                    doc="endpoint label naming the model it serves: with engineShapeLabel, the "
                                        "endpoint's class, which the step coefficients are learned per")

    engine_shape_label: str = param("engineShapeLabel", default="llm-d.ai/accelerator",
                                    doc="endpoint label naming its pod shape (accelerator): with engineModelLabel, "
                                        "the endpoint's class (`default` without either label)")

    #: the predictor (context): its ``engine_section()`` gives the learned engine step model
    predictor: Any = None

    #: the count makes an endpoint past maxTtftMs a last resort (the filter's ``overMaxTtft: shed`` does not)
    avoids_past_max_ttft = True

    def setup(self) -> None:
        self.step_model = StepModel(self.step_fixed_ms, self.step_per_token_ms, self.step_per_context_token_ms,
                                    self.step_decode_ms, self.step_per_prefill_pair_ms, self.engine_speed)
        source = getattr(self.predictor, "engine_section", None) if self.learn_engine else None
        #: per endpoint, the learned step model or the prior (epp_client.engine.learned)
        self.step_models = StepModels(self.step_model, source if callable(source) else None)
        self.engine_model: EngineModel = (
            LearnedTwin(self.step_models, self.class_of, self.prefill_chunk_tokens, self.probe_steps, self.max_steps)
            if self.step_models.source is not None else
            TwinEngine(self.step_model, self.prefill_chunk_tokens, self.probe_steps, self.max_steps))

    def class_of(self, endpoint: Endpoint) -> str:
        """The endpoint's engine class (its model and pod shape labels)."""
        return engine_class(endpoint, self.engine_model_label, self.engine_shape_label)

    def pre_request(self, request: InferenceRequest, picks: Mapping[str, Endpoint], now: float | None = None) -> None:
        """At dispatch: the twin's view of the request on its endpoint (the first pick), for its
        TPOT training entry (``request.engine_view``: endpoint, class, the step sums of
        :func:`~epp_client.engine.features.step_features` and the twin's TTFT), unless another
        decode-harm plugin gave it already. Only with the router's view of the endpoint
        (streaming mode)."""
        e = next(iter(picks.values()), None)
        if request.engine_view is not None or e is None or e.prediction is None or e.prediction.decoding is None:
            return
        prompt, (cached,) = engine_prompt(request, [e], e.prediction.prompt_scale)
        cls = self.class_of(e)
        model = self.step_models.for_endpoint(cls, e.name)
        columns = e.prediction.decoding_columns
        view = columns() if columns is not None else None
        i = view.index.get(e.name, view.size) if view is not None else 0
        if view is not None and i < view.size and not view.general[i] and view.decodes[i]:   # all decoding
            redo = partial(decoding_features, self.prefill_chunk_tokens, int(view.decodes[i]), float(view.context[i]),
                           max_steps=self.max_steps)
        elif view is not None and i < view.size and view.paced is not None and view.queued is not None and \
                not view.paced[i]:     # requests waiting for their first token beside counted decodes
            redo = partial(queued_features, model, self.prefill_chunk_tokens, int(view.decodes[i]),
                           float(view.context[i]), view.queued(i), max_steps=self.max_steps)
        else:
            redo = partial(step_features, model, self.prefill_chunk_tokens, e.prediction.running_decodes(),
                           max_steps=self.max_steps)
        f = redo(prompt, cached)
        if f is not None:
            request.engine_view = EngineView(e.name, cls, f, twin_ttft(model, f), prompt, cached, redo)

    def use_engine_model(self, model: EngineModel) -> None:
        """Judge placements with ``model`` instead of the engine twin (a reference that knows the
        engine, e.g. the simulator's truth); the count's rule is unchanged."""
        self.engine_model = model

    def parts(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, tuple[float, float, float]]:
        """Per endpoint with a prediction, the count's three terms: (running requests harmed, 1 if
        the request itself misses its SLO there, adapter load + near-full KV cache)."""
        return {name: terms for name, (terms, _) in self.assess(request, endpoints).items()}

    def assess(self, request: InferenceRequest, endpoints: list[Endpoint]
               ) -> dict[str, tuple[tuple[float, float, float], Outcome]]:
        """Per endpoint with a prediction: the count's terms (:meth:`parts`) and the twin's outcome."""
        ttft_slo, tpot_slo = request.ttft_slo_ms, request.tpot_slo_ms
        self.step_models.refresh()
        judged = [e for e in endpoints if e.prediction is not None]
        scale = judged[0].prediction.prompt_scale if judged and judged[0].prediction is not None else 1.0
        prompt, cached = engine_prompt(request, judged, scale)
        placements = getattr(self.engine_model, "placements", None)   # all at once, where the model can
        if placements is not None:
            outcomes = placements(request, judged, prompt, cached)
        else:
            placement = self.engine_model.placement
            outcomes = [placement(request, e, prompt, c) for e, c in zip(judged, cached)]
        own_miss, max_lateness, max_ttft = self.own_miss, self.max_lateness, self.max_ttft_ms
        past_max_ttft = max_ttft > 0 and self.avoids_past_max_ttft
        target, adapter_load, kv_threshold = request.target_model, self.adapter_load_count, self.kv_usage_threshold
        out: dict[str, tuple[tuple[float, float, float], Outcome]] = {}
        for e, o in zip(judged, outcomes):
            late = _lateness(ttft_slo, tpot_slo, o)
            own = 0.0
            if own_miss and late > 1.0:
                own = _FAR * late if 0 < max_lateness < late else 1.0
            if past_max_ttft and o.ttft_ms > max_ttft:
                own = max(own, _FAR * o.ttft_ms / max_ttft)
            load = adapter_load if target and _loads_an_adapter(target, e) else 0.0
            m = e.metrics
            full = m is not None and m.kv_cache_usage > kv_threshold
            out[e.name] = ((float(o.harm), own, load + int(full)), o)
        return out

    def scores(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        """The count per endpoint with a prediction: harm, own miss, adapter load, near-full KV cache."""
        return {name: sum(terms) for name, terms in self.parts(request, endpoints).items()}


@plugin("decode-harm-filter", Filter)
class DecodeHarmFilter(DecodeHarmCount):
    """``decode-harm-filter``: keep the endpoints where the request's prefill harms the fewest decodes."""

    hold_slack_ms: float = param("holdSlackMs", default=0.0, check=ge(0.0),
                                 doc="hold the request at the router while on every endpoint kept its prefill "
                                     "pushes running requests over their TPOT SLO, as long as it would still have "
                                     "more than this much of its TTFT SLO left after holdRetryMs (0: never hold)")

    hold_retry_ms: float = param("holdRetryMs", default=150.0, check=gt(0.0),
                                 doc="how long a held request waits before it is scheduled again")

    max_hold_ms: float = param("maxHoldMs", default=10_000.0, check=gt(0.0),
                               doc="the longest a request is held in all, ms; then it is placed")

    max_hold_slo_share: float = param("maxHoldSloShare", default=0.5, check=within(0.0, 1.0),
                                      doc="a request with a TTFT SLO is held at most this share of it (and at most "
                                          "maxHoldMs)")

    hopeless_placement: str = param("hopelessPlacement", default="least-late", check=one_of("least-late", "count"),
                                    doc="where a request late on every endpoint (the twin's TTFT or TPOT over its "
                                        "SLO) goes: least-late keeps the endpoints where it is least late; count "
                                        "the lowest count, as any other request")

    shed_when_hopeless: bool = param("shedWhenHopeless", default=False,
                                     doc="refuse a sheddable request (priority < 0) late on every endpoint: 429 "
                                         "shed-slo-unreachable")

    over_max_ttft: str = param("overMaxTtft", default="avoid", check=one_of("avoid", "shed"),
                               doc="with maxTtftMs: avoid counts an endpoint past it as a last resort; shed places "
                                   "by the count alone and refuses the request (429 shed-ttft-over-bound, any "
                                   "priority) when every endpoint kept is past it")

    def setup(self) -> None:
        super().setup()
        self.avoids_past_max_ttft = self.over_max_ttft == "avoid"
        self.filtered = 0   # requests for which some candidate was dropped
        self.holds = 0      # scheduling attempts answered with a hold
        self.hopeless = 0   # scheduling attempts of a request late on every endpoint (shed ones included)
        self.shed = 0       # requests refused: sheddable and late everywhere, or past maxTtftMs (overMaxTtft: shed)

    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1 and self.hold_slack_ms <= 0 and not self.shed_when_hopeless and \
                (self.avoids_past_max_ttft or self.max_ttft_ms <= 0):
            return endpoints
        assessed = self.assess(request, endpoints)
        if not assessed:
            return endpoints
        hopeless = self._hopeless(request, endpoints, assessed)
        if hopeless is not None:
            kept = hopeless
        else:
            counts = {name: harm + own + load for name, ((harm, own, load), _) in assessed.items()}
            low = min(counts.values())
            kept = [e for e in endpoints if counts.get(e.name, float("inf")) <= low]
            if self.hold_slack_ms > 0:
                self._hold(request, [assessed[e.name] for e in kept])
        if not self.avoids_past_max_ttft and self.max_ttft_ms > 0 and \
                min(assessed[e.name][1].ttft_ms for e in kept if e.name in assessed) > self.max_ttft_ms:
            self.shed += 1
            raise ShedRequest(SHED_TTFT_OVER_BOUND)
        if len(kept) < len(endpoints):
            self.filtered += 1
        return kept

    def _hopeless(self, request: InferenceRequest, endpoints: list[Endpoint],
                  assessed: dict[str, tuple[tuple[float, float, float], Outcome]]) -> list[Endpoint] | None:
        """None when some endpoint serves the request within its SLOs (in the twin). Otherwise
        raise :class:`ShedRequest` for a sheddable request with ``shedWhenHopeless``, or, with
        ``hopelessPlacement: least-late``, the endpoints where it is least late."""
        ttft_slo, tpot_slo = request.ttft_slo_ms, request.tpot_slo_ms
        late: dict[str, float] = {}
        least = None    # min(late.values()) as it goes: once at most 1, it stays so
        for name, (_, o) in assessed.items():
            x = late[name] = _lateness(ttft_slo, tpot_slo, o)
            if least is None or x < least:
                least = x
                if least <= 1.0:
                    return None
        if least is None or least <= 1.0:
            return None
        self.hopeless += 1
        if self.shed_when_hopeless and request.sheddable:
            self.shed += 1
            raise ShedRequest(SHED_SLO_UNREACHABLE)
        if self.hopeless_placement != "least-late":
            return None
        least = min(late.values())
        return [e for e in endpoints if late.get(e.name, float("inf")) <= least]

    def hold_bound_ms(self, request: InferenceRequest) -> float:
        """The longest ``request`` may be held in all: ``maxHoldMs``, and with a TTFT SLO at most
        ``maxHoldSloShare`` of it (the header's, not what is left of it)."""
        slo = parse_slo(request.headers, TTFT_SLO_HEADERS)
        return min(self.max_hold_ms, self.max_hold_slo_share * slo) if slo > 0 else self.max_hold_ms

    def _hold(self, request: InferenceRequest, kept: list[tuple[tuple[float, float, float], Outcome]]) -> None:
        """Raise :class:`HoldRequest` when the request harms running requests wherever it may go,
        has been held less than its bound (:meth:`hold_bound_ms`), and, held for ``holdRetryMs``,
        would still have more than ``holdSlackMs`` of its TTFT SLO left on the kept endpoint where
        its first token comes soonest. The retry comes at the bound at the latest, where the
        request is placed."""
        slo = request.ttft_slo_ms          # what is left of it: the scheduler's caller sets waited_ms
        if slo <= 0 or any(terms[0] <= 0 for terms, _ in kept):
            return
        left = self.hold_bound_ms(request) - request.waited_ms
        if left < _MIN_HOLD_MS:
            return
        if slo - min(o.ttft_ms for _, o in kept) > self.hold_slack_ms + self.hold_retry_ms:
            self.holds += 1
            raise HoldRequest(min(self.hold_retry_ms, left) / 1000.0)
