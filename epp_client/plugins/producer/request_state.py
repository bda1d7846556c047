"""Per-request state of the ``predicted-latency-producer``: the running-request queue per
endpoint ordered by TPOT SLO (B1.8) and one request's scheduling-to-completion context."""
from __future__ import annotations

import heapq
import itertools


class RunningQueue:
    """Per-endpoint queue of running requests ordered by TPOT SLO (B1.8), lazy deletion."""

    def __init__(self) -> None:
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
        return True

    def remove(self, request_id: str) -> bool:
        endpoint = self._where.pop(request_id, None)
        if endpoint is None:
            return False
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
                 "touched", "uncached")

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
        self.uncached = input_tokens   # prompt tokens to prefill on the target (set at dispatch)
