"""Flow views, the fairness id, and the two simple fairness policies.

A fairness policy chooses which flow (one FIFO queue per fairness id within a priority
band) dispatches next. It sees only :class:`QueueView` s and returns one of them, or None
when no flow has a waiting request.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from epp_client.framework.params import Plugin

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
FAIRNESS_HEADER_ALIAS = "x-gateway-inference-fairness-id"
DEFAULT_FLOW = "default-flow"


def fairness_id(headers: Mapping[str, str]) -> str:
    """The request's flow: the new header wins over the alias; empty or absent -> ``default-flow``."""
    return headers.get(FAIRNESS_HEADER) or headers.get(FAIRNESS_HEADER_ALIAS) or DEFAULT_FLOW


@dataclass(frozen=True)
class QueueView:
    """What a fairness policy sees of one flow's queue (times on the policy's clock)."""

    fairness_id: str
    length: int
    head_enqueued_at: float


def waiting(queues: Sequence[QueueView]) -> list[QueueView]:
    return [q for q in queues if q.length > 0]


class GlobalStrictFairness(Plugin):
    """``global-strict-fairness-policy``: FCFS across flows. The flow whose head request
    was enqueued first dispatches next (ties: the first one given)."""

    TYPE = "global-strict-fairness-policy"

    def pick(self, queues: Sequence[QueueView]) -> QueueView | None:
        best = None
        for q in waiting(queues):
            if best is None or q.head_enqueued_at < best.head_enqueued_at:
                best = q
        return best


class RoundRobinFairness(Plugin):
    """``round-robin-fairness-policy``: flows take turns in the order of their ids; the
    flow after the last one served (wrapping around) that has a waiting request goes next."""

    TYPE = "round-robin-fairness-policy"

    def setup(self) -> None:
        self.last: str | None = None

    def pick(self, queues: Sequence[QueueView]) -> QueueView | None:
        ready = sorted(waiting(queues), key=lambda q: q.fairness_id)
        if not ready:
            return None
        chosen = ready[0]
        if self.last is not None:
            chosen = next((q for q in ready if q.fairness_id > self.last), ready[0])
        self.last = chosen.fairness_id
        return chosen
