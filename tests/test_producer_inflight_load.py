"""The one request lifecycle: heuristics and the scheduler on it, one in-flight count, the
approximate prefix producer configured from an EndpointPickerConfig and used by both the
gateway and the simulator.
"""
from __future__ import annotations

import random

import pytest

from epp_client import PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.heuristics import LeastLoadScheduler, LeastRequestsScheduler, RoundRobinScheduler
from support.lifecycle import PREFIX_CONFIG, eps, req


def test_a_retry_elsewhere_is_accounted_on_that_endpoint():
    s = build_scheduler(PREFIX_CONFIG, rng=random.Random(0))
    cands = eps(2)
    r = req(1)
    res = s.schedule(r, cands)
    other = next(e for e in cands if e.name != res.endpoint.name)
    s.pre_request(r, res)
    s.on_complete(r.request_id, status=503, aborted=True)
    s.pre_request(r, res, endpoint=other)
    assert s.inflight.snapshot(other.name).requests == 1
    assert s.inflight.snapshot(res.endpoint.name).requests == 0


def test_heuristics_count_in_flight_once_through_the_lifecycle():
    lc = LeastRequestsScheduler(random.Random(1))
    cands = eps(3)
    names = []
    for i in range(3):
        res = lc.schedule(req(i), cands)
        lc.pre_request(req(i), res)
        names.append(res.endpoint.name)
    assert sorted(names) == ["e0", "e1", "e2"]           # one each: fewest in flight first
    lc.on_complete("r1")
    assert lc.schedule(req(9), cands).endpoint.name == names[1]
    rr = RoundRobinScheduler(random.Random(0))
    assert [rr.schedule(req(i), cands).endpoint.name for i in range(4)] == ["e0", "e1", "e2", "e0"]
    assert not lc.schedule(req(10), []).ok


def test_least_load_prefers_prefix_then_idle_and_shares_the_tracker():
    base = build_scheduler(PREFIX_CONFIG)
    lc = LeastLoadScheduler(random.Random(0), inflight=base.inflight)
    cands = eps(3)
    cands[2].prefix_match = PrefixMatch(4, 4, 16)
    assert lc.schedule(req(1), cands).endpoint.name == "e2"
    cands[2].prefix_match = None
    res = lc.schedule(req(2), cands)
    lc.pre_request(req(2), res)
    assert base.inflight.snapshot(res.endpoint.name).requests == 1     # one count for both
    assert lc.rank(cands)[-1].name == res.endpoint.name


def test_gateway_uses_the_configs_prefix_producer_and_the_policys_inflight(tmp_path):
    from gateway.core import Gateway
    from gateway.settings import GatewaySettings

    s = build_scheduler(PREFIX_CONFIG)
    gw = Gateway(GatewaySettings(endpoints=["http://127.0.0.1:9", "http://127.0.0.1:10"]), s)
    assert gw.prefix is s.prefix_producer and gw.inflight is s.inflight
    assert gw.driver.fallback.inflight is s.inflight
    info, hashes = gw.request_info({}, {"prompt": "x" * 4 * 128 * 12}, False)
    assert len(hashes) == 10                     # 128-token blocks, at most maxPrefixBlocksToMatch
    plain = Gateway(GatewaySettings(endpoints=["http://127.0.0.1:9"], block_size_tokens=32))
    assert plain.prefix.block_size_tokens == 32 and isinstance(plain.router, LeastLoadScheduler)


def test_simulator_uses_the_configs_prefix_producer():
    from load.sim import workloads as W
    from load.sim.driver import LifecycleRouter
    from load.sim.engine import ClusterConfig, Simulation
    from load.sim.stepmodel import get_preset

    spec = get_preset("llama3-8b-a100")
    arrivals = W.scale_to_rate(W.synthetic_poisson(40, seed=2, input_median=1500, output_median=20), 2.0)
    reqs = W.make_requests(arrivals, [W.SloClass()], 0, spec)
    config = PREFIX_CONFIG.replace("maxPrefixBlocksToMatch: 10", "maxPrefixBlocksToMatch: 1000")
    router = LifecycleRouter("t", lambda rng, clock, wall: build_scheduler(config, rng=rng), prefix=True)
    Simulation(ClusterConfig([spec, spec]), reqs, router).run()
    assert router.prefix is router.lifecycle.prefix_producer and router.prefix.lookups == len(reqs)
    assert router.prefix.block_size_tokens == 128
    bad = LifecycleRouter("t", lambda rng, clock, wall: build_scheduler(
        config.replace("blockSizeTokens: 128", "blockSizeTokens: 100")), prefix=True)
    with pytest.raises(ValueError, match="blockSizeTokens"):
        Simulation(ClusterConfig([spec]), W.make_requests(arrivals[:2], [W.SloClass()], 0, spec), bad).run()


def test_epp_client_does_not_import_the_gateway_or_the_simulator():
    import ast
    from pathlib import Path

    import epp_client

    root = Path(epp_client.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("gateway", "load")]
    assert len(list(root.rglob("*.py"))) > 10 and offenders == []
