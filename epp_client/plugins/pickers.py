"""Pickers (B2.7): ``pick(endpoints, scores) -> list[Endpoint]`` of length
``max_num_of_endpoints`` (default 1; a value <= 0 becomes 1), fewer when there are fewer
candidates."""
from __future__ import annotations

import random

from ..params import Configurable, Param, max_endpoints
from ..types import Endpoint

_PARAMS = (Param("maxNumOfEndpoints", "max_num_of_endpoints", "int"),)


class _Picker(Configurable):
    PARAMS = _PARAMS
    EXTRA = ("rng",)

    def __init__(self, max_num_of_endpoints: int = 1, rng: random.Random | None = None) -> None:
        v = self._validated(max_num_of_endpoints=max_num_of_endpoints)
        self.max_num_of_endpoints = max_endpoints(v["max_num_of_endpoints"])
        self.rng = rng or random.Random()


class RandomPicker(_Picker):
    """``random-picker``: shuffle and take k."""

    TYPE = "random-picker"

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float] | None = None) -> list[Endpoint]:
        k = self.max_num_of_endpoints
        if k == 1:
            return [endpoints[int(self.rng.random() * len(endpoints))]] if endpoints else []
        out = list(endpoints)
        self.rng.shuffle(out)
        return out[:k]


class MaxScorePicker(_Picker):
    """``max-score-picker``: highest score first, ties broken uniformly at random."""

    TYPE = "max-score-picker"

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float]) -> list[Endpoint]:
        out = list(endpoints)
        self.rng.shuffle(out)
        out.sort(key=lambda e: scores.get(e.name, 0.0), reverse=True)  # stable
        return out[: self.max_num_of_endpoints]


class WeightedRandomPicker(_Picker):
    """``weighted-random-picker``: A-Res sampling, key = U^(1/score); P(i) = s_i / Σs for k=1.
    Delegates to the random picker when no score is > 0."""

    TYPE = "weighted-random-picker"

    def __init__(self, max_num_of_endpoints: int = 1, rng: random.Random | None = None) -> None:
        super().__init__(max_num_of_endpoints, rng)
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
