"""plugins/decider/always_disagg.py: always the prefill stage; without a decider, never (B4.7)."""
from __future__ import annotations

from support.pd import pd_config, pool, req, sched


def test_always_decider_and_no_decider():
    assert sched(pd_config("always-disagg-pd-decider")).schedule(req(1), pool()).decision == "prefill-decode"
    s = sched(pd_config(None))  # no decider: the prefill stage is disabled
    res = s.schedule(req(100_000), pool())
    assert res.decision == "decode-only" and "prefill" not in res.picks
