"""``weighted-random-picker`` (B2.7): A-Res sampling weighted by score."""
from __future__ import annotations

from epp_client.framework.protocols import Picker
from epp_client.framework.registry import plugin
from epp_client.plugins.picker.base import PickerBase
from epp_client.plugins.picker.random import RandomPicker
from epp_client.types import Endpoint


@plugin("weighted-random-picker", Picker)
class WeightedRandomPicker(PickerBase):
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
