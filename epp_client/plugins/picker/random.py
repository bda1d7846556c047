"""``random-picker`` (B2.7): shuffle and take k."""
from __future__ import annotations

from epp_client.framework.protocols import Picker
from epp_client.framework.registry import plugin
from epp_client.plugins.picker.base import PickerBase
from epp_client.types import Endpoint


@plugin("random-picker", Picker)
class RandomPicker(PickerBase):
    """``random-picker``: shuffle and take k."""

    def pick(self, endpoints: list[Endpoint], scores: dict[str, float] | None = None) -> list[Endpoint]:
        k = self.max_num_of_endpoints
        if k == 1:
            return [endpoints[int(self.rng.random() * len(endpoints))]] if endpoints else []
        out = list(endpoints)
        self.rng.shuffle(out)
        return out[:k]
