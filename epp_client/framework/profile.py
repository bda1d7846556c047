"""A scheduling profile (filters in order, weighted scorers, one picker) and llm-d's default
profile, built from the registered plugins by type name (this module imports no plugin)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from epp_client.framework.lifecycle import ProfileResult
from epp_client.framework.registry import discover
from epp_client.types import Endpoint, InferenceRequest

#: upstream's default profile without a config: (scorer type, weight), then the picker type
DEFAULT_SCORERS: tuple[tuple[str, float], ...] = (("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0),
                                                  ("prefix-cache-scorer", 3.0))
DEFAULT_PICKER = "max-score-picker"


def default_picker(rng: random.Random | None = None) -> Any:
    """The picker a profile without one gets (``max-score-picker``)."""
    return discover()[DEFAULT_PICKER](rng=rng if rng is not None else random.Random())


def default_profile() -> SchedulingProfile:
    """Upstream's default without a config: queue (2), kv (2), prefix (3), max-score picker."""
    types = discover()
    return SchedulingProfile("default", [], [(types[name](), weight) for name, weight in DEFAULT_SCORERS],
                             default_picker())


@dataclass
class SchedulingProfile:
    """Filters in order, weighted scorers (weight default 1.0), one picker (default
    ``max-score-picker``)."""

    name: str = "default"
    filters: list = field(default_factory=list)
    scorers: list = field(default_factory=list)  # [(scorer, weight)]
    picker: Any = None

    def __post_init__(self) -> None:
        if self.picker is None:
            self.picker = default_picker()

    def run(self, request: InferenceRequest, endpoints: list[Endpoint]) -> ProfileResult:
        candidates = endpoints
        for f in self.filters:
            candidates = f.filter(request, candidates)
            if not candidates:
                return ProfileResult(self.name, [], {}, filtered=[])
        totals = {e.name: 0.0 for e in candidates}
        for scorer, weight in self.scorers:
            raw = scorer.score(request, candidates)
            for name, s in raw.items():
                if name in totals:
                    # clamp to [0, 1] then weight (NaN counts as 0)
                    totals[name] += (1.0 if s > 1.0 else s if s > 0.0 else 0.0) * weight
        return ProfileResult(self.name, self.picker.pick(candidates, totals), totals, filtered=candidates)
