"""epp_client.plugins.picker.base: what every picker shares (maxNumOfEndpoints, its rng)."""
from __future__ import annotations

import random

from epp_client.plugins.picker.base import PickerBase


def test_max_num_of_endpoints_below_one_becomes_one_and_an_rng_is_given():
    assert PickerBase(max_num_of_endpoints=0).max_num_of_endpoints == 1
    assert PickerBase(max_num_of_endpoints=-3).max_num_of_endpoints == 1
    assert PickerBase(max_num_of_endpoints=4).max_num_of_endpoints == 4
    r = random.Random(1)
    assert PickerBase(rng=r).rng is r and isinstance(PickerBase(rng=None).rng, random.Random)
