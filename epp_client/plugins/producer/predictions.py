"""The ``predicted-latency-producer``'s predictions written onto the candidates, with their SLO
headroom (B1.3, B1.5)."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

from epp_client.engine.columns import DecodingView
from epp_client.engine.twin import Running
from epp_client.plugins.producer.request_state import RequestContext, RunningQueue
from epp_client.predictor import BulkPrediction
from epp_client.types import Endpoint, LatencyPrediction


def apply_predictions(ctx: RequestContext, endpoints: list[Endpoint], result: BulkPrediction, now: float, *,
                      running: RunningQueue, streaming_mode: bool, endpoint_role_label: str,
                      slo_buffer_factor: float,
                      decoding: Callable[[str, float], tuple[Running, ...]],
                      decoding_columns: Callable[[], DecodingView] | None = None, prompt_scale: float = 1.0) -> None:
    """Write ``Endpoint.prediction`` on each candidate and keep the predictions in ``ctx``.

    TTFT headroom is ``ttft_slo - ttft``. TPOT is judged in streaming mode only, and not on a
    prefill endpoint (else headroom 0, valid): against ``tpot_slo × sloBufferFactor``, or the
    endpoint's lowest running TPOT SLO × ``sloBufferFactor`` when that is lower. In streaming
    mode ``decoding(endpoint, now)`` gives the twin's view of the endpoint, computed on first use
    (``LatencyPrediction.running_decodes``), and ``decoding_columns`` (one per decision) every
    endpoint's at once; ``prompt_scale``: the engine's prompt tokens per estimated token
    (:class:`~epp_client.engine.prompt_scale.PromptScale`)."""
    ttft_slo, tpot_slo, f = ctx.ttft_slo, ctx.tpot_slo, slo_buffer_factor
    ctx.model_version = result.model_version
    preds = ctx.predictions = {}
    for e, t, p in zip(endpoints, result.ttft_ms, result.tpot_ms):
        preds[e.name] = (t, p)
        ttft_headroom = ttft_slo - t
        ttft_valid = t < ttft_slo
        if not streaming_mode:
            tpot_headroom, tpot_valid = 0.0, True
        elif endpoint_role_label and e.labels.get(endpoint_role_label) == "prefill":
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
                                         partial(decoding, e.name, now) if streaming_mode else None,
                                         decoding_columns if streaming_mode else None, prompt_scale)
