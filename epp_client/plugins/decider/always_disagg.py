"""``always-disagg-pd-decider`` (B4.7): always run the prefill stage."""
from __future__ import annotations

from epp_client.framework.protocols import PDDecider
from epp_client.framework.registry import plugin
from epp_client.plugins.decider.base import DeciderBase
from epp_client.types import Endpoint, InferenceRequest


@plugin("always-disagg-pd-decider", PDDecider)
class AlwaysDisaggPDDecider(DeciderBase):
    """``always-disagg-pd-decider``: always yes."""

    def _decide(self, request: InferenceRequest, endpoint: Endpoint | None, candidates: list[Endpoint]) -> bool:
        return True
