"""Per-request state of the ``predicted-latency-producer``: the running-request queue per
endpoint ordered by TPOT SLO (B1.8), one request's scheduling-to-completion context and the
contexts kept, with their expiry."""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp_client.plugins.producer.running_columns import RunningColumns


class RunningQueue:
    """Per-endpoint queue of running requests ordered by TPOT SLO (B1.8), lazy deletion; with
    ``columns`` (:class:`.running_columns.RunningColumns`), it adds and removes their slots."""

    def __init__(self, columns: RunningColumns | None = None) -> None:
        self.columns = columns
        self._heaps: dict[str, list] = {}
        self._live: dict[str, dict[str, float]] = {}
        self._where: dict[str, str] = {}
        self._seq = itertools.count()

    def add(self, endpoint: str, request_id: str, tpot_slo: float) -> bool:
        if not request_id or request_id in self._where or tpot_slo < 0 or tpot_slo != tpot_slo:
            return False
        heapq.heappush(self._heaps.setdefault(endpoint, []), (tpot_slo, next(self._seq), request_id))
        self._live.setdefault(endpoint, {})[request_id] = tpot_slo
        self._where[request_id] = endpoint
        if self.columns is not None:
            self.columns.add(endpoint, request_id, tpot_slo)
        return True

    def remove(self, request_id: str) -> bool:
        endpoint = self._where.pop(request_id, None)
        if endpoint is None:
            return False
        if self.columns is not None:
            self.columns.remove(request_id)
        live = self._live[endpoint]
        del live[request_id]
        if not live:  # an endpoint whose queue becomes empty is dropped
            del self._live[endpoint]
            del self._heaps[endpoint]
        elif len(self._heaps[endpoint]) > 2 * len(live) + 16:  # bound the lazily deleted entries
            heap = [item for item in self._heaps[endpoint] if item[2] in live]
            heapq.heapify(heap)
            self._heaps[endpoint] = heap
        return True

    def heap_size(self, endpoint: str) -> int:
        return len(self._heaps.get(endpoint, ()))

    def size(self, endpoint: str) -> int:
        live = self._live.get(endpoint)
        return len(live) if live else 0

    def min_tpot(self, endpoint: str) -> float:
        live = self._live.get(endpoint)
        if not live:
            return 0.0
        heap = self._heaps[endpoint]
        while heap[0][2] not in live:
            heapq.heappop(heap)
        return heap[0][0]

    def requests(self, endpoint: str) -> dict[str, float]:
        """The running requests on ``endpoint``: request id -> TPOT SLO (a live view; do not mutate)."""
        return self._live.get(endpoint) or {}

    def endpoints(self) -> list[str]:
        return list(self._live)

    def __len__(self) -> int:
        return len(self._where)


class RequestContext:
    __slots__ = ("request_id", "input_tokens", "ttft_slo", "tpot_slo", "rows", "predictions", "model_version",
                 "target", "prefill_target", "dispatch", "ttft_ms", "chunks", "tokens", "tokens_known",
                 "touched", "engine_prompt", "uncached", "engine")

    def __init__(self, request_id: str, input_tokens: int) -> None:
        self.request_id = request_id
        self.input_tokens = input_tokens
        self.ttft_slo = 0.0
        self.tpot_slo = 0.0
        self.rows: dict[str, dict] = {}  # endpoint name -> scheduling-time feature row
        self.predictions: dict[str, tuple[float, float]] = {}
        self.model_version = ""
        self.target: str | None = None
        self.prefill_target: str | None = None
        self.dispatch: float | None = None
        self.ttft_ms = 0.0
        self.chunks = 0
        self.tokens = 0
        self.tokens_known = True
        self.touched = 0.0
        # the prompt in the engine's tokens (PromptScale, set at dispatch), and those of it to prefill on the target
        self.engine_prompt = input_tokens
        self.uncached = input_tokens
        self.engine: Any = None        # the twin's view at dispatch (epp_client.engine.features.EngineView)


class ContextCache:
    """The producer's request contexts, oldest first: an entry lives ``ttl`` seconds after its
    last use (touch on read), at most ``max_contexts`` of them; dropping one also removes its
    entry of the running queue."""

    def __init__(self, running: RunningQueue, ttl: float, max_contexts: int) -> None:
        self.running, self.ttl, self.max_contexts = running, ttl, max_contexts
        self.contexts: OrderedDict[str, RequestContext] = OrderedDict()
        self.expired = 0

    def _expire(self, now: float) -> None:
        ctxs = self.contexts
        while ctxs:
            rid, ctx = next(iter(ctxs.items()))
            if now - ctx.touched < self.ttl and len(ctxs) <= self.max_contexts:
                break
            ctxs.popitem(last=False)
            self.running.remove(rid)  # expiry also removes the running-queue entry
            self.expired += 1

    def get(self, request_id: str, now: float) -> RequestContext | None:
        self._expire(now)
        ctx = self.contexts.get(request_id)
        if ctx is not None:
            ctx.touched = now
            self.contexts.move_to_end(request_id)
        return ctx

    def store(self, ctx: RequestContext, now: float) -> None:
        ctx.touched = now
        self.contexts[ctx.request_id] = ctx
        self.contexts.move_to_end(ctx.request_id)
        self._expire(now)

    def discard(self, request_id: str) -> bool:
        """Forget a request; False if it was not kept."""
        if self.contexts.pop(request_id, None) is None:
            return False
        self.running.remove(request_id)
        return True

    def __len__(self) -> int:
        return len(self.contexts)
