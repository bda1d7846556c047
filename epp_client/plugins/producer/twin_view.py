"""The ``predicted-latency-producer``'s view of an endpoint for the engine twin
(``LatencyPrediction.decoding``, streaming mode): the requests this router dispatched there
and that have not finished, in dispatch order, as :class:`~epp_client.engine.twin.Running`."""
from __future__ import annotations

from collections.abc import Mapping

from epp_client.engine.twin import Running
from epp_client.plugins.producer.request_state import RequestContext, RunningQueue


def running_on(endpoint: str, now: float, running: RunningQueue, contexts: Mapping[str, RequestContext],
               first_token_at: Mapping[str, float]) -> tuple[Running, ...]:
    """Before its first chunk, a request counts the prompt tokens to prefill on ``endpoint``
    (not cached on it at dispatch; none when another endpoint prefills it); after, its decode
    time and tokens so far: the tokens counted from the chunks when they carry counts, else at
    the TPOT predicted for it at dispatch. The first request waiting prefills since the later
    of its dispatch and the last first token on ``endpoint`` (``first_token_at``)."""
    out = []
    append, new, get = out.append, tuple.__new__, contexts.get   # Running(...) without its Python __new__
    head = True
    for rid, slo in running.requests(endpoint).items():
        ctx = get(rid)
        if ctx is None:
            continue
        dispatch = ctx.dispatch
        if dispatch is None:
            continue
        slo = slo if slo > 0.0 else 0.0
        ttft_ms = ctx.ttft_ms
        if not ttft_ms:   # dispatched, no first chunk yet
            append(waiting(ctx, dispatch, slo, endpoint, now, head, first_token_at))
            head = False
            continue
        elapsed = (now - dispatch) * 1000.0 - ttft_ms
        tokens = ctx.tokens
        if not (ctx.tokens_known and tokens >= 1):
            pace = ctx.predictions.get(endpoint, (0.0, 0.0))[1]
            tokens = 1 + int(max(0.0, elapsed) / pace) if pace > 0 else 1
        append(new(Running, (elapsed if elapsed > 0.0 else 0.0, tokens, slo, ctx.engine_prompt + tokens, 0, 0.0)))
    return tuple(out)


def waiting(ctx: RequestContext, dispatch: float, slo: float, endpoint: str, now: float, head: bool,
            first_token_at: Mapping[str, float]) -> Running:
    """A request dispatched to ``endpoint`` at ``dispatch`` (TPOT SLO ``slo``) without its first chunk: the prompt
    tokens it prefills there; the first one waiting (``head``) prefills since the later of its
    dispatch and the endpoint's last first token."""
    since = max(dispatch, first_token_at.get(endpoint, dispatch)) if head else now
    queued = (now - since) * 1000.0
    return tuple.__new__(Running, (0.0, 0, slo, ctx.engine_prompt, ctx.uncached, queued if queued > 0.0 else 0.0))
