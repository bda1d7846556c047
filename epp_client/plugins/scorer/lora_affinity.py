"""``lora-affinity-scorer``: prefer endpoints with the request's LoRA adapter active (or room to load it)."""
from __future__ import annotations

from collections.abc import Mapping

from epp_client.framework.params import Plugin, gt, param
from epp_client.framework.protocols import RequestHooksBase, Scorer
from epp_client.framework.registry import plugin
from epp_client.plugins.scorer.lora_history import LoraRequestHistory
from epp_client.types import Endpoint, EndpointMetrics, InferenceRequest


def lora_affinity(target: str, m: EndpointMetrics | None) -> float:
    """The metric-only LoRA affinity of ``target`` on an endpoint: 1.0 active, 0.8 spare adapter
    capacity, 0.6 waiting, else 0 (also without metrics)."""
    if m is None:
        return 0.0
    if target in m.active_lora_adapters:
        return 1.0
    if len(m.active_lora_adapters) + len(m.waiting_lora_adapters) < m.max_active_lora:
        return 0.8
    return 0.6 if target in m.waiting_lora_adapters else 0.0


@plugin("lora-affinity-scorer", Scorer)
class LoraAffinityScorer(RequestHooksBase, Plugin):
    """``lora-affinity-scorer``: 1.0 active, 0.8 spare adapter capacity, 0.6 waiting, else 0.

    With ``requestHistory: true`` it also remembers what this router sent where
    (:class:`~epp_client.plugins.scorer.lora_history.LoraRequestHistory`, driven by the
    scheduler's lifecycle) and scores the same rules over the running adapters completed
    by the history (scraped running ∪ adapters with a history count > 0), with one more
    tier: 1.0 if the adapter is running or in flight there; else 0.9 if |running ∪
    history| + |waiting| < ``max_lora`` and the adapter is among the last ``max_lora``
    this router sent there (probably still loaded); else 0.8 if that sum is < ``max_lora``;
    else 0.6 if the adapter is waiting there; else 0. Requests without an adapter score
    1.0 everywhere. The history is reconciled with the scraped metrics every
    ``reconcileIntervalSeconds``.
    """

    request_history: bool = param("requestHistory", default=False, doc="also count what this router sent where")
    reconcile_interval_seconds: float = param("reconcileIntervalSeconds", default=1.0, check=gt(0.0),
                                              doc="how often the history is reconciled with the metrics")

    def setup(self) -> None:
        self.history = LoraRequestHistory(self.reconcile_interval_seconds) if self.request_history else None

    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        if self.history is not None:
            return self._score_with_history(self.history, request, endpoints)
        return {e.name: lora_affinity(request.target_model, e.metrics) for e in endpoints}

    def _score_with_history(self, history: LoraRequestHistory, request: InferenceRequest,
                            endpoints: list[Endpoint]) -> dict[str, float]:
        target = request.target_model
        if not target:
            return {e.name: 1.0 for e in endpoints}
        out = {}
        for e in endpoints:
            m = e.metrics
            running = m.active_lora_adapters if m is not None else frozenset()
            waiting = m.waiting_lora_adapters if m is not None else frozenset()
            max_lora = m.max_active_lora if m is not None else 0
            active = running | history.adapters(e.name)
            if target in active:
                out[e.name] = 1.0
            elif len(active) + len(waiting) < max_lora:
                out[e.name] = 0.9 if target in history.recent(e.name, max_lora) else 0.8
            elif target in waiting:
                out[e.name] = 0.6
            else:
                out[e.name] = 0.0
        return out

    # -- request lifecycle (called by the scheduler; no-ops without history) --------------
    def observe(self, endpoints: list[Endpoint], now: float) -> None:
        """Before each scheduling decision, with every candidate: the periodic reconcile."""
        if self.history is not None:
            self.history.maybe_reconcile(endpoints, now)

    def pre_request(self, request: InferenceRequest, picks: Mapping[str, Endpoint], now: float | None = None) -> None:
        """The primary profile's pick (the first of ``picks``) serves the request's adapter."""
        if self.history is not None and picks:
            target = next(iter(picks.values()))
            self.history.dispatched(request.request_id, target.name, request.target_model)

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200, aborted: bool = False,
                    output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """Completion and abort alike: -1, floored at 0."""
        if self.history is not None:
            self.history.released(request_id)
