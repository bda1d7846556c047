"""A decision's view of the requests running on every endpoint, as arrays: what the engine twin
reads to judge a request on all its candidates at once (:meth:`epp_client.engine.twin_engine.TwinEngine.placements`).

The producer keeps the running requests in columns as they are dispatched, get their first
chunk, stream tokens and complete (:class:`epp_client.plugins.producer.running_columns.RunningColumns`);
one :class:`DecodingView` per decision holds, per endpoint, what the twin's run needs (the
decodes and their context), and per decoding request with a TPOT SLO what its SLO count needs
(decode time, tokens, SLO, endpoint); per endpoint where requests wait for or are in their
prefill, those requests (``queued``, as the twin's :class:`~epp_client.engine.twin.Running`).
Endpoints where a request decodes at a predicted pace (tokens not counted) are judged from the
per-request view (``LatencyPrediction.running_decodes``) instead. Every value is the one the
per-request view gives at the same moment (tests/test_twin_exact.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from epp_client.engine.twin import Running


@dataclass(frozen=True)
class DecodingView:
    """Every endpoint's running requests at one moment.

    Per endpoint where requests run (``index``: name -> position, below ``size``): ``general`` (how many
    requests there prefill or decode at a predicted pace), the ``decodes`` running there and their
    ``context`` tokens (prompt + generated), ``paced`` (how many of ``general`` decode at a predicted
    pace: if any, judge the endpoint from the per-request view) and ``queued(position)``: the
    requests there without a first token, in dispatch order. Per request slot:
    its endpoint's position (``endpoint``), its decode time ``decode_ms`` (0 before its first
    token's time), the tokens after its first (``after_first``) and its TPOT SLO (``slo``: +inf
    where the SLO count skips it: no SLO, not decoding, or no request in the slot)."""

    index: dict[str, int]
    size: int
    general: list[int]
    decodes: list[int]
    context: list[float]
    decode_ms: np.ndarray
    after_first: np.ndarray
    slo: np.ndarray
    endpoint: np.ndarray
    paced: list[int] | None = None
    queued: Callable[[int], tuple[Running, ...]] | None = None

    def over_counts(self, judged: list[tuple[int, tuple[float, float, float, int, float, int]]],
                    extra: list[int] | None = None) -> list[int]:
        """Per ``(position, runs)`` (``runs``: :func:`epp_client.engine.twin._decoding_runs`, its
        last four: ``t``, ``steps``, ``t0``, ``steps0``): how many of the endpoint's requests are
        over their TPOT SLO at ``t`` after ``steps`` steps (the run with the request) less those
        at ``t0`` after ``steps0`` (the run without it), plus ``extra`` (per entry: the same for
        the requests not in the slots, :func:`epp_client.engine.queued.queued_runs`), at least 0
        (the count of :func:`epp_client.engine.twin._harm`, the same operations per request: the
        step counts are whole numbers, exact in a float)."""
        if not judged:
            return []
        size = self.size
        t, t0, steps, steps0 = [0.0] * size, [0.0] * size, [1] * size, [1] * size   # not judged: any divisor but 0
        for i, runs in judged:
            _, _, t[i], steps[i], t0[i], steps0[i] = runs
        endpoint, decode_ms, after_first, slo = self.endpoint, self.decode_ms, self.after_first, self.slo
        # per slot, one run at a time (one-dimensional operations: cheaper than both runs as two rows)
        ms = np.array(t, dtype=np.float64).take(endpoint)
        ms += decode_ms
        k = np.array(steps, dtype=np.float64).take(endpoint)
        k += after_first
        ms /= k
        over = ms > slo
        ms = np.array(t0, dtype=np.float64).take(endpoint)
        ms += decode_ms
        k = np.array(steps0, dtype=np.float64).take(endpoint)
        k += after_first
        ms /= k
        harm = (np.bincount(endpoint, weights=over, minlength=size)
                - np.bincount(endpoint, weights=ms > slo, minlength=size)).tolist()
        if extra is None:
            return [int(h) if h > 0 else 0 for h in (harm[j[0]] for j in judged)]
        return [h if h > 0 else 0 for h in (int(harm[j[0]]) + x for j, x in zip(judged, extra))]
