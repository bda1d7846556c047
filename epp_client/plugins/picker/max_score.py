"""``max-score-picker`` (B2.7): highest score first, ties broken uniformly at random."""
from __future__ import annotations

from epp_client.framework.protocols import Picker
from epp_client.framework.registry import plugin
from epp_client.plugins.picker.base import PickerBase
from epp_client.types import Endpoint


@plugin("max-score-picker", Picker)
class MaxScorePicker(PickerBase):
    """``max-score-picker``: highest score first, ties broken uniformly at random."""

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float]) -> list[Endpoint]:
        out = list(endpoints)
        self.rng.shuffle(out)
        out.sort(key=lambda e: scores.get(e.name, 0.0), reverse=True)  # stable
        return out[: self.max_num_of_endpoints]
