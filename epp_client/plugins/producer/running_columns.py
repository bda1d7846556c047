"""The ``predicted-latency-producer``'s running requests as columns (one slot per request),
kept in step with its request state as requests are dispatched, get their first chunk, stream
tokens and complete, so the engine twin reads a decision's view of every endpoint in a few array
operations (:class:`epp_client.engine.columns.DecodingView`) rather than one pass per candidate
(:func:`.twin_view.running_on`, which it equals)."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from epp_client.engine.columns import DecodingView
from epp_client.engine.twin import Running
from epp_client.plugins.producer.twin_view import waiting

if TYPE_CHECKING:
    from epp_client.plugins.producer.request_state import RequestContext

_NONE = (0, 0, 0, 0)   # a slot's part of its endpoint's sums: (no first token, paced, decodes, context)


class RunningColumns:
    """Slots of the running requests: the :class:`~.request_state.RunningQueue` adds and removes
    them (endpoint, TPOT SLO), :meth:`sync` copies a request's context into its slot whenever the
    producer changes it (dispatch, first chunk, tokens). Per endpoint it keeps the sums the twin's
    run reads (requests prefilling or paced, decodes, their context); per slot what the SLO count
    reads (dispatch, TTFT, tokens after the first, TPOT SLO: +inf where the count skips it), and per
    endpoint the requests without a first token, in dispatch order, which :meth:`queued_at` gives as
    :func:`.twin_view.running_on` does from ``contexts`` and ``first_token_at`` (the producer's)."""

    def __init__(self, capacity: int = 64, contexts: Mapping[str, RequestContext] | None = None,
                 first_token_at: Mapping[str, float] | None = None) -> None:
        self._contexts: Mapping[str, RequestContext] = {} if contexts is None else contexts
        self._first_token_at: Mapping[str, float] = {} if first_token_at is None else first_token_at
        self._slot: dict[str, int] = {}
        self._free: list[int] = []
        self._top = 0                        # slots ever used: [0, _top)
        self._index: dict[str, int] = {}     # endpoint name -> position, while requests run there
        self._names: list[str] = []          # per position: its endpoint
        self._slots: list[int] = []          # per position: the requests running there
        self._vacant: list[int] = []         # positions of endpoints where nothing runs any more
        self._general: list[int] = []        # per position: requests prefilling or decoding at a predicted pace
        self._paced: list[int] = []          # per position: of those, decoding at a predicted pace
        self._queued: list[dict[str, int]] = []   # per position: request id -> slot, no first token, dispatch order
        self._decodes: list[int] = []
        self._context: list[float] = []     # whole numbers: exact in a float
        self._part: list[tuple[int, int, int, int]] = []   # per slot: its part of the sums above
        self._slo: list[float] = []          # per slot: its TPOT SLO (0: none)
        self.dispatch = np.zeros(capacity)
        self.ttft = np.zeros(capacity)
        self.after_first = np.zeros(capacity)     # whole numbers: exact in a float
        self.slo = np.full(capacity, math.inf)
        self.endpoint = np.zeros(capacity, dtype=np.int64)

    def _grow(self) -> None:
        n = len(self.slo)
        for name, fill in (("dispatch", 0.0), ("ttft", 0.0), ("after_first", 0.0), ("slo", math.inf),
                           ("endpoint", 0)):
            old = getattr(self, name)
            col = np.full(2 * n, fill, dtype=old.dtype)
            col[:n] = old
            setattr(self, name, col)

    def add(self, endpoint: str, request_id: str, tpot_slo: float) -> None:
        """A request the queue runs on ``endpoint`` (counted once :meth:`sync` sees it dispatched)."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._top
            if slot >= len(self.slo):
                self._grow()
            self._top += 1
            self._part.append(_NONE)
            self._slo.append(0.0)
        pos = self._index.get(endpoint)
        if pos is None:     # a position of its own while requests run there (endpoints come and go)
            if self._vacant:
                pos = self._vacant.pop()
                self._names[pos] = endpoint
            else:
                pos = len(self._names)
                self._names.append(endpoint)
                self._slots.append(0)
                self._general.append(0)
                self._paced.append(0)
                self._queued.append({})
                self._decodes.append(0)
                self._context.append(0.0)
            self._index[endpoint] = pos
        self._slots[pos] += 1
        self._slot[request_id] = slot
        self.endpoint[slot] = pos
        self.slo[slot] = math.inf
        self._part[slot] = _NONE
        self._slo[slot] = tpot_slo if tpot_slo > 0.0 else 0.0

    def remove(self, request_id: str) -> None:
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._count(request_id, slot, _NONE)
            self.slo[slot] = math.inf
            self._free.append(slot)
            pos = int(self.endpoint[slot])
            self._slots[pos] -= 1
            if not self._slots[pos]:     # its sums are back at 0
                del self._index[self._names[pos]]
                self._vacant.append(pos)

    def _count(self, request_id: str, slot: int, part: tuple[int, int, int, int]) -> None:
        pos = int(self.endpoint[slot])
        queued, paced, decodes, context = self._part[slot]
        self._general[pos] += part[0] + part[1] - queued - paced
        self._paced[pos] += part[1] - paced
        self._decodes[pos] += part[2] - decodes
        self._context[pos] += part[3] - context
        if part[0] != queued:
            if part[0]:
                self._queued[pos][request_id] = slot
            else:
                del self._queued[pos][request_id]
        self._part[slot] = part

    def sync(self, ctx: RequestContext) -> None:
        """Copy what the twin reads of ``ctx`` (dispatch, first chunk, tokens) into its slot, if it runs."""
        slot = self._slot.get(ctx.request_id)
        if slot is None:
            return
        if ctx.dispatch is None:            # not dispatched: the per-request view skips it
            part = _NONE
        elif not ctx.ttft_ms:
            part = (1, 0, 0, 0)             # waiting for or in its prefill: in the endpoint's queue
        elif not (ctx.tokens_known and ctx.tokens >= 1):
            part = (0, 1, 0, 0)             # paced: the endpoint is judged per request
        else:
            part = (0, 0, 1, ctx.engine_prompt + ctx.tokens)
        self._count(ctx.request_id, slot, part)
        slo = self._slo[slot]
        if part[2] and slo > 0.0:
            self.dispatch[slot] = ctx.dispatch
            self.ttft[slot] = ctx.ttft_ms
            self.after_first[slot] = ctx.tokens - 1
            self.slo[slot] = slo
        else:
            self.slo[slot] = math.inf

    def view(self, now: float) -> DecodingView:
        """The decision's view at ``now`` (:func:`.twin_view.running_on`'s values, as columns)."""
        n = self._top
        elapsed = np.subtract(now, self.dispatch[:n])   # (now - dispatch) * 1000 - ttft, in place
        elapsed *= 1000.0
        elapsed -= self.ttft[:n]
        return DecodingView(dict(self._index), len(self._names), self._general[:], self._decodes[:], self._context[:],
                            np.where(elapsed > 0.0, elapsed, 0.0), self.after_first[:n].copy(), self.slo[:n].copy(),
                            self.endpoint[:n].copy(), self._paced[:], partial(self._queued_once, now, {}))

    def _queued_once(self, now: float, seen: dict[int, tuple[Running, ...]], pos: int) -> tuple[Running, ...]:
        """:meth:`queued_at`, read once per view and position: a later read (the dispatch's, after
        other requests' chunks may have arrived) gives what the decision judged."""
        queue = seen.get(pos)
        if queue is None:
            queue = seen[pos] = self.queued_at(now, pos)
        return queue

    def queued_at(self, now: float, pos: int) -> tuple[Running, ...]:
        """The requests without a first token on the endpoint at ``pos``, in dispatch order, as
        :func:`.twin_view.running_on` gives them at ``now``: the first prefills since the later of
        its dispatch and the endpoint's last first token."""
        out = []
        get, endpoint, slos, first = self._contexts.get, self._names[pos], self._slo, self._first_token_at
        for rid, slot in self._queued[pos].items():
            ctx = get(rid)
            if ctx is not None and ctx.dispatch is not None:
                out.append(waiting(ctx, ctx.dispatch, slos[slot], endpoint, now, not out, first))
        return tuple(out)


class LazyView:
    """One decision's view (``make(now)``), computed on first use and shared by its candidates."""

    __slots__ = ("_make", "_now", "_view")

    def __init__(self, make: Callable[[float], DecodingView], now: float) -> None:
        self._make, self._now = make, now
        self._view: DecodingView | None = None

    def __call__(self) -> DecodingView:
        view = self._view
        if view is None:
            view = self._view = self._make(self._now)
        return view
