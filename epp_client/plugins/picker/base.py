"""What every picker shares: ``maxNumOfEndpoints`` and the random numbers it draws."""
from __future__ import annotations

import random
from dataclasses import field

from epp_client.framework.params import Plugin, param


class PickerBase(Plugin):
    max_num_of_endpoints: int = param("maxNumOfEndpoints", default=1, doc="endpoints to pick (<= 0 becomes 1)")
    rng: random.Random = field(default_factory=random.Random)

    def setup(self) -> None:
        if self.max_num_of_endpoints <= 0:
            self.max_num_of_endpoints = 1
        self.rng = self.rng or random.Random()
