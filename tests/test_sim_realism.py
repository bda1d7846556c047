"""Realism of the simulated model server against load/data/step-time/README.md."""
from __future__ import annotations

import pytest

from load.sim.engine import ClusterConfig, Simulation
from load.sim.request import SimRequest
from load.sim.routers import RoundRobinRouter
from load.sim.server import ModelServer
from load.sim.stepmodel import ServerSpec, get_preset
from load.sim.workloads import SEG, isolated_prefill_ms


def _req(rid, n_in, n_out, keys=None, t=0.0, bs=16):
    keys = keys if keys is not None else [("u", rid, j) for j in range(-(-n_in // SEG))]
    segs = tuple((k, min(SEG, n_in - j * SEG)) for j, k in enumerate(keys))
    return SimRequest(rid, t, n_in, n_out, segs, block_size=bs)


def _run(spec, reqs, n_servers=1):
    sim = Simulation(ClusterConfig([spec] * n_servers), reqs, RoundRobinRouter(0))
    return sim.run()


def test_single_8k_request_ttft_matches_step_time_md():
    spec = get_preset("llama3-8b-a100")
    req = _req(0, 8192, 2)
    _run(spec, [req])
    steps = -(-8192 // spec.max_num_batched_tokens)
    expected = 630.0 + steps * spec.c_fix          # GPU time from the step-time README plus per-step overhead
    assert req.ttft_ms == pytest.approx(isolated_prefill_ms(spec, 8192))
    assert abs(req.ttft_ms - expected) / expected < 0.15, req.ttft_ms


def _decode_step_ms(spec: ServerSpec, batch: int, ctx: int) -> float:
    """Run `batch` requests through prefill on a real server object, then time a pure decode step."""
    srv = ModelServer(0, spec.with_overrides({"max_num_batched_tokens": 1 << 20}))
    reqs = [_req(i, ctx, 10) for i in range(batch)]
    for r in reqs:
        srv.add(r, 0.0)
    t = 0.0
    while any(r.computed < r.target for r in reqs):
        t += srv.plan_step(t)
        srv.finish_step(t, None, None)
    assert all(r.generated == 1 for r in reqs)
    return srv.plan_step(t) * 1000.0


@pytest.mark.parametrize("preset,batch,ctx,gpu_ms", [
    ("llama3-8b-a100", 32, 1024, 15.0),
    ("llama3-8b-a100", 32, 4096, 23.0),
    ("llama2-7b-h100", 32, 1024, 13.0),
    ("llama2-70b-h100-tp4", 1, 640, 29.7),
    ("llama2-70b-h100-tp4", 32, 640, 36.9),
])
def test_decode_step_times_match_published_figures(preset, batch, ctx, gpu_ms):
    spec = get_preset(preset)
    got = _decode_step_ms(spec, batch, ctx)
    # the step-time README quotes GPU time for the 8B/7B models (scheduler overhead c_fix comes on top);
    # the 70B figures are measured end to end, so c_fix is part of them.
    gpu = got - spec.c_fix if preset != "llama2-70b-h100-tp4" else got
    assert abs(gpu - gpu_ms) / gpu_ms < 0.15, (preset, got)


@pytest.mark.parametrize("preset,tokens,ms", [("llama2-7b-h100", 1024, 22.0), ("llama2-70b-h100-tp4", 1024, 106.0),
                                              ("llama2-70b-h100-tp4", 8192, 954.0), ("llama3-8b-a100", 1024, 77.0)])
def test_prefill_times_of_other_presets(preset, tokens, ms):
    spec = get_preset(preset)
    assert abs(isolated_prefill_ms(spec, tokens) - ms) / ms < 0.15


def test_decode_time_grows_with_batch_and_context():
    spec = get_preset("llama3-8b-a100")
    assert _decode_step_ms(spec, 8, 1024) < _decode_step_ms(spec, 32, 1024) < _decode_step_ms(spec, 32, 4096)


def test_kv_capacity_bounds_usage_and_preemption_recomputes():
    # 4,096-token cache (256 blocks); 6 requests of 1,000 prompt + 600 output tokens cannot all fit
    spec = get_preset("llama3-8b-a100", kv_capacity_tokens=4096)
    srv = ModelServer(0, spec)
    reqs = [_req(i, 1000, 600) for i in range(6)]
    for r in reqs:
        srv.add(r, 0.0)
    t = 0.0
    peak = 0.0
    finished = []
    while srv.has_work():
        d = srv.plan_step(t)
        assert d > 0
        t += d
        srv.finish_step(t, None, lambda r, _t: finished.append(r))
        peak = max(peak, srv.kv.usage())
        srv.kv.check()
        assert srv.kv.used <= srv.kv.num_blocks
    assert len(finished) == 6 and all(r.generated == 600 for r in reqs)
    assert srv.preemptions > 0                       # decode growth forced recompute preemption
    assert any(r.preemptions for r in reqs)
    # the newest running request is the victim: the oldest request is never preempted
    assert reqs[0].preemptions == 0
    assert peak > 0.9
    assert srv.kv.used == 0 and srv.kv.usage() == 0.0


def test_admission_waits_for_free_blocks():
    spec = get_preset("llama3-8b-a100", kv_capacity_tokens=2048)
    srv = ModelServer(0, spec)
    a, b = _req(0, 1500, 5), _req(1, 1500, 5)
    srv.add(a, 0.0)
    srv.add(b, 0.0)
    srv.plan_step(0.0)
    assert srv.running == [a] and list(srv.waiting) == [b]


def test_prefix_hits_for_shared_hash_ids_and_lru_eviction():
    spec = get_preset("llama3-8b-a100", kv_capacity_tokens=16 * 512)   # 16 segments of 512 tokens
    shared = [0, 1, 2, 3]
    a = _req(0, 4 * SEG + 100, 2, keys=shared + ["a"], t=0.0)
    b = _req(1, 4 * SEG + 300, 2, keys=shared + ["b"], t=10.0)
    c = _req(2, 3 * SEG, 2, keys=["x", "y", "z"], t=20.0)
    _run(spec, [a, b, c])
    assert a.hit_tokens == 0
    assert b.hit_tokens == 4 * SEG                 # the four shared blocks
    assert c.hit_tokens == 0
    assert b.ttft_ms < a.ttft_ms
    # fill the cache with unrelated prompts: the shared prefix is evicted (LRU), no more hits
    fill = [_req(10 + i, 4 * SEG, 2, keys=[f"f{i}-{j}" for j in range(4)], t=30.0 + i) for i in range(6)]
    d = _req(99, 4 * SEG + 50, 2, keys=shared + ["d"], t=100.0)
    a2 = _req(0, 4 * SEG + 100, 2, keys=shared + ["a"], t=0.0)
    _run(spec, [a2, *fill, d])
    assert d.hit_tokens == 0


def test_partial_prefix_match_and_full_hit_recomputes_last_token():
    spec = get_preset("llama3-8b-a100")
    a = _req(0, 2 * SEG, 2, keys=[7, 8], t=0.0)
    b = _req(1, 2 * SEG, 2, keys=[7, 8], t=5.0)       # identical prompt
    c = _req(2, 3 * SEG, 2, keys=[7, 9, 10], t=10.0)  # shares the first block only
    _run(spec, [a, b, c])
    assert b.hit_tokens == 2 * SEG - 1                 # at least one token is computed
    assert c.hit_tokens == SEG


def test_heterogeneous_speed_factor():
    fast = get_preset("llama3-8b-a100", speed=2.0)
    slow = get_preset("llama3-8b-a100")
    a, b = _req(0, 4000, 50), _req(1, 4000, 50)
    Simulation(ClusterConfig([fast, slow]), [a, b], RoundRobinRouter(0)).run()
    assert a.server == 0 and b.server == 1
    assert a.e2e_ms == pytest.approx(b.e2e_ms / 2.0, rel=1e-6)


def test_metrics_are_scraped_with_staleness():
    spec = get_preset("llama3-8b-a100")
    seen = []

    class Probe(RoundRobinRouter):
        def route(self, req, now):
            seen.append((now, [m.waiting + m.running for m in self.sim.metrics()],
                         [m.time for m in self.sim.metrics()]))
            return 0

    reqs = [_req(i, 2000, 20, t=0.001 * i) for i in range(3)]
    Simulation(ClusterConfig([spec], scrape_interval_s=1.0, scrape_delay_s=0.5), reqs, Probe(0)).run()
    # nothing scraped since t=0 is visible yet: the router sees an empty server every time
    assert [s[1] for s in seen] == [[0], [0], [0]]


def test_server_metrics_report_kv_queue_and_active_lora():
    spec = get_preset("llama3-8b-a100", max_num_seqs=1)
    srv = ModelServer(0, spec)
    a, b = _req(0, 1000, 3), _req(1, 1000, 3)
    a.lora, b.lora = "sql-adapter", "chat-adapter"
    srv.add(a, 0.0)
    srv.add(b, 0.0)
    t = srv.plan_step(0.0)
    m = srv.metrics(t)
    assert (m.waiting, m.running) == (1, 1)
    assert m.active_lora == frozenset({"sql-adapter"})
    assert m.kv_cache_usage == pytest.approx(-(-1000 // 16) / spec.num_blocks)
    while srv.has_work():
        t += srv.plan_step(t)
        srv.finish_step(t, None, None)
    m = srv.metrics(t)
    assert (m.waiting, m.running, m.active_lora, m.kv_cache_usage) == (0, 0, frozenset(), 0.0)
