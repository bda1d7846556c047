"""The router's queue fields of a feature row (``features.schema.QUEUE_FIELDS``), from the
producer's own view of an endpoint (:func:`.twin_view.running_on`: the requests it dispatched
there and has not seen finish, in dispatch order):

- ``prefill_requests_in_flight``: those without their first token yet;
- ``queue_head_wait_ms``: how long the first of them has been at the head of the queue (since
  the later of its dispatch and the endpoint's last first token): how far its prefill has got;
- ``decode_context_tokens``: the KV-cache tokens (prompt plus generated) of the others, which
  every engine step reads while this request waits and prefills.

The producer sends them in streaming mode only (in end-to-end mode it never sees a first token),
and not for a ``prefill`` endpoint (the view holds a disaggregated request on its decode endpoint,
so a prefill endpoint's queue is not in it).
"""
from __future__ import annotations

from collections.abc import Iterable

from epp_client.engine.twin import Running


def queue_fields(running: Iterable[Running]) -> dict[str, int | float]:
    """The three fields of an endpoint running ``running`` (its requests in dispatch order)."""
    waiting = 0
    head_ms = 0.0
    context = 0
    for r in running:
        if r.tokens == 0:   # dispatched, no first token yet
            if waiting == 0:
                head_ms = r.queued_ms
            waiting += 1
        else:
            context += r.context
    return {"prefill_requests_in_flight": waiting, "queue_head_wait_ms": round(head_ms, 3),
            "decode_context_tokens": context}
