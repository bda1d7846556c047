"""What every P/D decider shares: it counts its answers in ``decisions`` ({"yes": n, "no": n})."""
from __future__ import annotations

from collections import Counter

from epp_client.framework.params import Plugin
from epp_client.types import Endpoint, InferenceRequest


class DeciderBase(Plugin):
    def setup(self) -> None:
        self.decisions: Counter = Counter()

    def disaggregate(self, request: InferenceRequest, endpoint: Endpoint | None,
                     candidates: list[Endpoint] | None = None) -> bool:
        yes = bool(self._decide(request, endpoint, candidates or []))
        self.decisions["yes" if yes else "no"] += 1
        return yes

    def _decide(self, request: InferenceRequest, endpoint: Endpoint | None, candidates: list[Endpoint]) -> bool:
        raise NotImplementedError
