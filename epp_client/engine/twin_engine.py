"""The engine twin as the decode-harm plugins' engine model (:class:`TwinEngine`): each
candidate endpoint's outcome for a request, from the requests the router has running there
(:func:`epp_client.engine.twin.placement`), one endpoint at a time or all candidates of a
decision at once over the producer's columns (:mod:`epp_client.engine.columns`)."""
from __future__ import annotations

from epp_client.engine.model import Outcome
from epp_client.engine.queued import AheadCache, queued_runs
from epp_client.engine.twin import StepModel, decoding_runs, placement
from epp_client.types import Endpoint, InferenceRequest


class TwinEngine:
    """The plugins' own engine model: the engine twin (:func:`epp_client.engine.twin.placement`) over
    the endpoint's running requests, with the configured step model and token budget."""

    def __init__(self, step_model: StepModel, budget: int, probe: int, max_steps: int) -> None:
        self.step_model, self.budget, self.probe, self.max_steps = step_model, budget, probe, max_steps
        self.ahead_cache = AheadCache()

    def model_for(self, endpoint: Endpoint) -> StepModel:
        """The step model of ``endpoint`` (the same for all; one each: ``engine.learned.LearnedTwin``)."""
        return self.step_model

    def placement(self, request: InferenceRequest, endpoint: Endpoint, prompt: int, cached: int) -> Outcome:
        pred = endpoint.prediction
        if pred is None:
            raise ValueError(f"engine twin: endpoint {endpoint.name} has no prediction")
        return placement(self.model_for(endpoint), self.budget, pred.running_decodes(), prompt, cached, self.probe,
                         self.max_steps)

    def placements(self, request: InferenceRequest, endpoints: list[Endpoint], prompt: int,
                   cached: list[int]) -> list[Outcome]:
        """:meth:`placement` on each of ``endpoints`` (``cached[i]`` of the prompt cached on the
        i-th), the same outcomes: where every request running on an endpoint decodes (with its
        tokens counted), its run is :func:`~epp_client.engine.twin.decoding_runs` over the producer's columns
        (``LatencyPrediction.decoding_columns``); where some wait for or are in their prefill and
        the others decode so, :func:`~epp_client.engine.queued.queued_runs` over the columns and
        the queue; the SLO counts of the decodes of all such endpoints are a few array operations
        (:meth:`DecodingView.over_counts`); elsewhere (a request paced) :meth:`placement`."""
        out: list[Outcome | None] = [None] * len(endpoints)
        judged: list[tuple[int, tuple[float, float, float, int, float, int]]] = []  # (position in the view, runs)
        where: list[int] = []     # per judged: its position in endpoints
        extra: list[int] = []     # per judged: the queued requests' part of the count
        todo: list[tuple[StepModel, int, float, int]] = []   # all decoding: the request's run, all at once
        decoding: list[tuple[int, int]] = []    # per todo: (position in endpoints, position in the view)
        columns = view = None
        model_for, budget, probe, max_steps = self.model_for, self.budget, self.probe, self.max_steps
        for j, e in enumerate(endpoints):
            pred = e.prediction
            c = pred.decoding_columns if pred is not None else None
            if c is not None:
                if columns is None:     # one view per decision (every candidate's is the same)
                    columns = c
                    view = columns()
                    index, size, general, decodes, context = view.index, view.size, view.general, view.decodes, \
                        view.context
                    paced, queued = view.paced, view.queued
                    taken = [False] * size    # an endpoint named twice: the second by placement
                i = index.get(e.name, size) if c is columns else size
                if i < size and not taken[i]:
                    u = prompt - cached[j]
                    if not general[i]:
                        if decodes[i]:
                            taken[i] = True
                            todo.append((model_for(e), decodes[i], context[i], u if u > 1 else 1))
                            decoding.append((j, i))
                            continue
                    elif paced is not None and queued is not None and not paced[i]:
                        taken[i] = True
                        q = queued_runs(model_for(e), budget, decodes[i], context[i], queued(i), prompt,
                                        u if u > 1 else 1, probe, max_steps, self.ahead_cache)
                        if q is not None:
                            where.append(j)
                            judged.append((i, q[:6]))
                            extra.append(q[6])
                            continue
            out[j] = self.placement(request, e, prompt, cached[j])
        for (j, i), r in zip(decoding, decoding_runs(budget, prompt, probe, max_steps, todo)):
            if r is None:
                out[j] = self.placement(request, endpoints[j], prompt, cached[j])
            else:
                where.append(j)
                judged.append((i, r))
                extra.append(0)
        if judged:
            assert view is not None     # judged only from a view
            new = tuple.__new__    # Outcome(...) without its Python __new__
            for j, (_, r), harm in zip(where, judged, view.over_counts(judged, extra)):
                out[j] = new(Outcome, (harm, r[0], r[1]))
        return out    # type: ignore[return-value]   # every entry set above
