"""plugins/decider/prefix_based.py: the prompt and uncached-token gates (B4.7)."""
from __future__ import annotations

import pytest

from support.pd import pd_config, pool, req, sched


@pytest.mark.parametrize("params, prompt, cached_blocks, want", [
    ({}, 100_000, 0, False),                                     # nonCachedTokens 0 = never
    ({"nonCachedTokens": 512}, 511, 0, False),                   # prompt shorter than the threshold
    ({"nonCachedTokens": 512}, 512, 0, True),                    # uncached == threshold: yes
    ({"nonCachedTokens": 512}, 1000, 31, False),                 # 1000 - 31*16 = 504 < 512
    ({"nonCachedTokens": 512}, 1000, 30, True),                  # 1000 - 480 = 520
    ({"nonCachedTokens": 100, "promptTokens": 2000}, 1999, 0, False),  # prompt gate
    ({"nonCachedTokens": 100, "promptTokens": 2000}, 2000, 0, True),
])
def test_prefix_based_decider_gates(params, prompt, cached_blocks, want):
    s = sched(pd_config(decider_params=params))
    res = s.schedule(req(prompt), pool(decode_cached_blocks=cached_blocks))
    assert res.decision == ("prefill-decode" if want else "decode-only")
    assert ("prefill" in res.picks) is want
    assert s.profile_handler.prefill_decider.decisions == {("yes" if want else "no"): 1}


def test_prefix_based_decider_says_no_without_prefix_information():
    s = sched(pd_config(decider_params={"nonCachedTokens": 1}))
    eps = pool()
    for e in eps:
        e.prefix_match = None
    assert s.schedule(req(5000), eps).decision == "decode-only"
