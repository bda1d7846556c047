"""Pickers (B2.7): ``pick(endpoints, scores) -> list[Endpoint]`` of length
``max_num_of_endpoints`` (default 1; a value <= 0 becomes 1), fewer when there are fewer
candidates."""
from __future__ import annotations

import random
from dataclasses import field

from epp_client.framework.params import Plugin, param
from epp_client.framework.protocols import Picker
from epp_client.framework.registry import plugin
from epp_client.types import Endpoint


class _Picker(Plugin):
    max_num_of_endpoints: int = param("maxNumOfEndpoints", default=1, doc="endpoints to pick (<= 0 becomes 1)")
    rng: random.Random = field(default_factory=random.Random)

    def setup(self) -> None:
        if self.max_num_of_endpoints <= 0:
            self.max_num_of_endpoints = 1
        self.rng = self.rng or random.Random()


@plugin("random-picker", Picker)
class RandomPicker(_Picker):
    """``random-picker``: shuffle and take k."""

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float] | None = None) -> list[Endpoint]:
        k = self.max_num_of_endpoints
        if k == 1:
            return [endpoints[int(self.rng.random() * len(endpoints))]] if endpoints else []
        out = list(endpoints)
        self.rng.shuffle(out)
        return out[:k]


@plugin("max-score-picker", Picker)
class MaxScorePicker(_Picker):
    """``max-score-picker``: highest score first, ties broken uniformly at random."""

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float]) -> list[Endpoint]:
        out = list(endpoints)
        self.rng.shuffle(out)
        out.sort(key=lambda e: scores.get(e.name, 0.0), reverse=True)  # stable
        return out[: self.max_num_of_endpoints]


@plugin("weighted-random-picker", Picker)
class WeightedRandomPicker(_Picker):
    """``weighted-random-picker``: A-Res sampling, key = U^(1/score); P(i) = s_i / Σs for k=1.
    Delegates to the random picker when no score is > 0."""

    def setup(self) -> None:
        super().setup()
        self._random = RandomPicker(self.max_num_of_endpoints, self.rng)

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float]) -> list[Endpoint]:
        rnd = self.rng.random
        keyed = []
        positive = False
        for e in endpoints:
            s = scores.get(e.name, 0.0)
            if s > 0:
                positive = True
                u = rnd()
                keyed.append((u ** (1.0 / s) if u > 0 else 1e-10 ** (1.0 / s), e))
            else:
                keyed.append((0.0, e))
        if not positive:
            return self._random.pick(endpoints, scores)
        if self.max_num_of_endpoints == 1:
            return [max(keyed, key=_first)[1]]
        keyed.sort(key=_first, reverse=True)
        return [e for _, e in keyed[: self.max_num_of_endpoints]]


def _first(item: tuple) -> float:
    return item[0]
