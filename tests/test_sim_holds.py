"""Bounded holds in the simulator: the recommended profile's decode-harm-filter holds requests,
through the real simulator, and places each at its bound (``maxHoldMs``, ``maxHoldSloShare``) at
the latest: the rule the gateway follows too, as it lives in the filter."""
from __future__ import annotations

import dataclasses

import yaml

from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.profiles import config_text
from load.sim import bench
from load.sim.scenarios import get_scenario


def _with_filter_params(**params) -> str:
    cfg = yaml.safe_load(config_text("predicted-latency-recommended"))
    plugin = next(p for p in cfg["plugins"] if p["type"] == "decode-harm-filter")
    plugin.setdefault("parameters", {}).update(params)
    return yaml.safe_dump(cfg)


def test_no_request_is_held_longer_than_its_bound_in_the_simulator():
    sc = get_scenario("standard-small")
    opts = bench.RunOptions(seed=0, limit=200, ideal=True,
                            epp_config=_with_filter_params(holdSlackMs=300, maxHoldMs=400, maxTtftMs=0))
    arr, cap = bench.prepare(sc, opts)
    m, _, router = bench.run_one(sc, arr, cap, 0.9, "predicted", opts)
    f = next(x for p in router.lifecycle.profiles for x in p.filters if isinstance(x, DecodeHarmFilter))
    assert f.max_hold_ms == 400.0
    held = {}
    for r in router.sim.requests:
        assert r.dispatch_t >= 0            # every request was placed in the end, none lost
        held[r.rid] = (r.dispatch_t - r.arrival) * 1000.0, min(400.0, 0.5 * r.ttft_slo_ms)
    # the witness: requests were held, and the bound is what released some of them
    assert router.held_requests > 0 and m["held_max_ms"] > 0
    at_bound = [rid for rid, (t, bound) in held.items() if abs(t - bound) < 1e-6]
    assert at_bound
    # no request held longer than its bound
    assert all(t <= bound + 1e-6 for t, bound in held.values()), max(t - b for t, b in held.values())
    assert m["held_max_ms"] <= 400.0 + 1e-6 and m["completed"] == m["requests"] and m["shed"] == 0


def test_sheddable_requests_late_everywhere_are_shed_and_counted_in_the_simulator():
    base = get_scenario("standard-small")
    c = base.slo_classes[0]
    # half the requests sheddable (priority -1) with a tight TTFT SLO: some are late everywhere at capacity
    sc = dataclasses.replace(base, slo_classes=(
        dataclasses.replace(c, share=0.5),
        dataclasses.replace(c, share=0.5, name="batch", priority=-1, ttft_ms=100.0, ttft_slowdown=1.2)))
    opts = bench.RunOptions(seed=0, limit=200, ideal=True,
                            epp_config=_with_filter_params(shedWhenHopeless=True, maxTtftMs=0))
    arr, cap = bench.prepare(sc, opts)
    m, _, router = bench.run_one(sc, arr, cap, 1.0, "predicted", opts)
    f = next(x for p in router.lifecycle.profiles for x in p.filters if isinstance(x, DecodeHarmFilter))
    admitter = router.lifecycle.admitters[0]            # latency-slo-admitter: sheds sheddable requests too
    shed = [r for r in router.sim.requests if r.shed]
    # the filter's refusals are counted in the run's shed requests, with the admitter's: every one
    # sheddable and never dispatched; the hopeless requests that were not sheddable were placed
    assert 0 < f.shed < f.hopeless and m["shed"] == len(shed) == f.shed + admitter.rejected
    assert all(r.priority < 0 and r.dispatch_t < 0 for r in shed)
    assert m["completed"] + m["shed"] == m["requests"]
