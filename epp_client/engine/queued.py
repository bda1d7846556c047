"""The engine twin's placement on an endpoint where requests wait for or are in their prefill
beside requests that decode with their tokens counted: the decodes enter the run as two sums
(how many, their context), as in :func:`epp_client.engine.twin._decoding_runs`, and only the
queue is stepped request by request. :meth:`epp_client.engine.twin_engine.TwinEngine.placements`
takes the sums and the queue from the producer's columns (``DecodingView.queued``) and counts
the decodes pushed over their SLO for all candidates at once (``DecodingView.over_counts``);
the outcome is :func:`epp_client.engine.twin.placement`'s to the last bit (tests/test_twin_exact.py,
tests/test_producer_running_columns.py).
"""
from __future__ import annotations

from epp_client.engine.stretch import DecodeCache
from epp_client.engine.twin import Running, StepModel, _first_flip, _run, _State, _under_way


def queued_runs(model: StepModel, budget: int, decodes: int, context: float, queued: tuple[Running, ...],
                prompt_tokens: int, uncached: int, probe: int, max_steps: int, decode_cache: DecodeCache | None
                ) -> tuple[float, float, float, int, float, int, int] | None:
    """The two runs of :func:`~epp_client.engine.twin.placement` where ``decodes`` requests with
    ``context`` tokens decode and ``queued`` (dispatch order, none with a first token) wait for or
    are in their prefill: (the request's first token time, its TPOT, the time and steps the run
    with it ends at, the time and steps the run without it ends at, how many of ``queued`` are
    over their TPOT SLO at the end of the run with it less those at the end of the run without
    it). None where the request gets no first token within ``max_steps``."""
    reqs = (*queued, Running(0.0, 0, 0.0, max(prompt_tokens, uncached), uncached))
    left: list[int] = []
    done: list[int] = []
    for r in reqs:     # every one is in the queue: none has a first token
        n = r.prefill if r.prefill > 0 else 0
        d = r.context - n
        left.append(n)
        done.append(d if d > 0 else 0)
    queue = list(range(len(reqs)))
    _under_way(model, budget, reqs, left, done, queue, decodes, context)
    st = _State(left, done, queue, decodes, context)
    i = len(queued)
    fork = _run(model, budget, st, i, probe, max_steps=max_steps)
    t, steps, firsts = st.t, st.steps, st.firsts
    if i not in firsts:
        return None
    tf, sf = firsts[i]
    tpot = (t - tf) / (steps - sf) if steps > sf else 0.0
    if fork is None:    # no run without it to compare: nothing harmed (the same run, counted twice)
        return tf, tpot, t, steps, t, steps, 0
    _run(model, budget, fork, until_ms=t, max_steps=max_steps, decode_cache=decode_cache)
    t0, steps0, firsts0 = fork.t, fork.steps, fork.firsts
    flips = 0
    for j, r in enumerate(queued):
        if r.tpot_slo_ms > 0:
            flips += _first_flip(r.tpot_slo_ms, firsts.get(j), t, steps, firsts0.get(j), t0, steps0)
    return tf, tpot, t, steps, t0, steps0, flips
