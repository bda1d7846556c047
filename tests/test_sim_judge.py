"""The simulator's realism defaults (docs/evaluation.md §4): client deadlines that free the
engine's slot and KV blocks, no free drain, per-server late scrapes, step noise, the
gateway's prompt estimate, determinism per seed, and ``--ideal`` reproducing the idealised world."""
from __future__ import annotations

import dataclasses
import json

import pytest

from epp_client.heuristics import RandomScheduler
from epp_client.profiles import config_text
from load.sim import bench
from load.sim.driver import LifecycleRouter, prompt_hashes
from load.sim.engine import ClusterConfig, Simulation
from load.sim.realism import Realism
from load.sim.report import summarize
from load.sim.request import SimRequest
from load.sim.routers import RoundRobinRouter
from load.sim.scenarios import get_scenario
from load.sim.server import ModelServer
from load.sim.stepmodel import get_preset
from load.sim.workloads import SEG

#: Realism with only the client deadline on (exact steps, exact prompt lengths), for engine tests.
EXACT = dict(step_sigma=0.0, speed_jitter=0.0, bytes_per_token_sigma=0.0)


def _req(rid, n_in, n_out, t=0.0):
    segs = tuple((("u", rid, j), min(SEG, n_in - j * SEG)) for j in range(-(-n_in // SEG)))
    return SimRequest(rid, t, n_in, n_out, segs)


def _sim(spec, reqs, realism, n_servers=1, router=None):
    sim = Simulation(ClusterConfig([spec] * n_servers, realism=realism), reqs, router or RoundRobinRouter(0))
    return sim, sim.run()


def test_abandoned_mid_prefill_frees_its_slot_for_a_later_request():
    spec = get_preset("llama3-8b-a100", max_num_seqs=1)      # one running request at a time
    big, small = _req(0, 36_000, 5, t=0.0), _req(1, 2_000, 5, t=0.5)
    sim, res = _sim(spec, [big, small], Realism(deadline_s=1.0, **EXACT))
    assert big.abandoned and big.first_token_t < 0 and 0 < big.computed < big.input_len   # mid-prefill
    assert small.done and not small.abandoned
    assert small.admitted_t >= big.deadline        # admitted once the abandoned prompt left its slot
    assert sim.servers[0].kv.usage() == 0.0 and not sim.servers[0].running    # no page leaked
    m, _ = summarize(res, 1)
    assert (m["abandoned"], m["completed"], m["unfinished"]) == (1, 1, 0)
    # the witness: without the deadline the small request waits for the whole big one
    idle_big, idle_small = _req(0, 36_000, 5, t=0.0), _req(1, 2_000, 5, t=0.5)
    Simulation(ClusterConfig([spec]), [idle_big, idle_small], RoundRobinRouter(0)).run()
    assert idle_small.admitted_t >= idle_big.finish_t > small.finish_t


def test_abandoned_mid_decode_frees_its_blocks_for_a_later_request():
    # 30k-token KV cache: the 9k prompt cannot be prefilled while the 22k one holds its pages
    spec = get_preset("llama3-8b-a100", kv_capacity_tokens=30_000)
    long, short = _req(0, 22_000, 5_000, t=0.0), _req(1, 9_000, 5, t=2.5)
    sim, res = _sim(spec, [long, short], Realism(deadline_s=3.0, **EXACT))
    assert long.abandoned and long.first_token_t >= 0 and 1 < long.generated < long.output_len   # mid-decode
    assert short.done and long.deadline <= short.first_token_t and short.finish_t < short.deadline
    assert not sim.servers[0].running and sim.servers[0].kv.usage() == 0.0
    m, _ = summarize(res, 1)
    assert m["abandoned"] == 1 and m["completed"] == 1
    # the witness: without the deadline the short request's first token waits for the long one's end
    idle_long, idle_short = _req(0, 22_000, 5_000, t=0.0), _req(1, 9_000, 5, t=2.5)
    Simulation(ClusterConfig([spec]), [idle_long, idle_short], RoundRobinRouter(0)).run()
    assert idle_short.first_token_t >= idle_long.finish_t > short.finish_t


def test_a_clone_taken_during_a_step_whose_request_was_abandoned_continues_without_it():
    """The oracles clone a server at any moment; a request abandoned while its step runs is out of
    the running set but still in the step in progress, which completes without it."""
    srv = ModelServer(0, get_preset("llama3-8b-a100"))
    gone, stays = _req(0, 1_000, 5), _req(1, 800, 5)          # both fit one 2,048-token step
    srv.add(gone, 0.0)
    srv.add(stays, 0.0)
    t = srv.plan_step(0.0)
    assert {r.rid for r, _ in srv._batch} == {0, 1}          # both prompts in the step in progress
    gone.abandoned = True
    assert srv.abandon(gone)
    twin = srv.clone()
    assert [r.rid for r, _ in twin._batch] == [1] and [r.rid for r in twin.running] == [1]
    twin.finish_step(t, None, None)
    srv.finish_step(t, None, None)
    assert twin.running[0].computed == stays.computed > 0     # the clone's step did what the server's did


def _decoding_server():
    """A server whose running requests all decode (first tokens out), with step noise's mean factor."""
    from load.sim.realism import StepNoise

    srv = ModelServer(0, get_preset("llama3-8b-a100"))
    srv.noise = StepNoise(1.1, 0.1, None).expected()
    for i, (n_in, n_out) in enumerate(((300, 40), (1_000, 90), (17, 200), (500, 33))):
        srv.add(_req(i, n_in, n_out), 0.0)
    t = 0.0
    while srv.waiting or any(r.computed < r.target for r in srv.running):
        t += srv.plan_step(t)
        srv.finish_step(t, None, None)
    return srv, t


def _state(srv):
    return ([(r.rid, r.computed, r.generated, r.npages) for r in srv.running], srv.kv.free, srv.kv.lru_pages,
            srv.kv.evicted_pages, srv.busy_time, srv.steps)


@pytest.mark.parametrize("until", [None, 0.2])
def test_a_decode_stretch_in_one_go_is_the_same_steps_one_at_a_time(until):
    """The oracles run cloned servers forward: where all decode, :meth:`ModelServer.decode_stretch`
    takes the steps before the first one that finishes a request at once, to the same clock, pages
    and counters as stepping them (a request's next page every 16 tokens)."""
    srv, t0 = _decoding_server()
    one, stepped = srv.clone(), srv.clone()
    t, k = one.decode_stretch(t0, 1_000, t0 + until if until else None)
    assert 2 <= k <= 31 and (until or k == 31)    # the 33-token request's last token is a step of its own
    t_stepped = last = t0
    for _ in range(k):
        last = t_stepped
        t_stepped += stepped.plan_step(t_stepped)
        stepped.finish_step(t_stepped, None, None)
    assert t == t_stepped and _state(one) == _state(stepped)
    if until:
        assert k < 31 and t >= t0 + until > last      # its last step is the first to end past the clock
    # then it goes on by plan_step: the next step finishes the 33-token request on both
    one.plan_step(t)
    one.finish_step(t, None, None)
    assert k < 31 or [r.rid for r in one.running] == [0, 1, 2]


def test_no_decode_stretch_where_a_request_waits_prefills_or_pages_would_not_fit():
    srv, t0 = _decoding_server()
    assert srv.clone().decode_stretch(t0, 1)[1] == 0          # under two steps
    waiting = srv.clone()
    waiting.add(_req(9, 100, 5), t0)
    assert waiting.decode_stretch(t0, 1_000) == (t0, 0)
    full, _ = _decoding_server()
    full.kv.free = 0        # every page taken: a stretch would need preemptions, plan_step decides those
    full.kv.lru_pages = 0
    assert full.decode_stretch(t0, 1_000) == (t0, 0)


def test_a_request_abandoned_while_queued_is_a_miss_and_nothing_drains_after_the_last_deadline():
    spec = get_preset("llama3-8b-a100", max_num_seqs=1)
    reqs = [_req(i, 1_000, 400, t=0.01 * i) for i in range(12)]
    realism = Realism(deadline_s=3.0, **EXACT)
    sim, res = _sim(spec, reqs, realism)
    queued = [r for r in reqs if r.abandoned and r.admitted_t < 0]
    assert queued, "some requests never left the queue before their deadline"
    assert all(r.abandoned or r.done for r in reqs)
    assert max(r.finish_t for r in reqs) <= reqs[-1].arrival + realism.deadline_s
    m, _ = summarize(res, 1)
    assert m["abandoned"] == sum(r.abandoned for r in reqs) and m["unfinished"] == 0
    assert m["slo_attainment"] <= m["completed"] / len(reqs)
    assert m["ttft_p99_ms"] == pytest.approx(realism.deadline_s * 1000.0)   # censored at the deadline
    # the idealised world serves every one of them, long after the last arrival's deadline
    ideal = [_req(i, 1_000, 400, t=0.01 * i) for i in range(12)]
    Simulation(ClusterConfig([spec]), ideal, RoundRobinRouter(0)).run()
    assert all(r.done for r in ideal) and max(r.finish_t for r in ideal) > reqs[-1].arrival + realism.deadline_s


def test_a_request_held_by_the_router_is_dropped_at_its_deadline():
    class Holder(RoundRobinRouter):
        def route(self, req, now):
            self._hold(req, now, 10.0)      # a filter's HoldRequest for 10 s
            return -1

    spec = get_preset("llama3-8b-a100")
    req = _req(0, 1_000, 5)
    router = Holder(0)
    sim, res = _sim(spec, [req], Realism(deadline_s=2.0, **EXACT), router=router)
    assert req.abandoned and req.dispatch_t < 0 and req.server == -1
    assert summarize(res, 1)[0]["held_p99_ms"] == pytest.approx(2_000.0)


def test_scrapes_are_per_server_at_their_own_phase_and_late():
    spec = get_preset("llama3-8b-a100")
    seen = []

    class Probe(RoundRobinRouter):
        def route(self, req, now):
            seen.append((now, [m.time for m in self.sim.metrics()]))
            return super().route(req, now)

    realism = Realism(seed=4)
    reqs = [_req(i, 500, 20, t=0.37 * i + 1.0) for i in range(40)]
    _sim(spec, reqs, realism, n_servers=4, router=Probe(0))
    lo, hi = realism.scrape_delay_s
    ages = [now - t for now, times in seen for t in times]
    assert min(ages) >= lo and max(ages) <= realism.scrape_interval_s + hi + 1e-9
    assert all(len(set(times)) == 4 for _, times in seen)      # never one consistent snapshot
    phases = [realism.scrape_phase(i) for i in range(4)]
    for _, times in seen:   # each server's view comes from its own schedule
        for i, t in enumerate(times):
            k = (t - phases[i]) / realism.scrape_interval_s
            assert k == pytest.approx(round(k), abs=1e-6)


def test_the_router_sees_the_gateway_estimate_and_the_engine_runs_the_true_prompt():
    told = []

    def factory(rng, clock, wall):
        sched = RandomScheduler(rng)
        inner = sched.schedule

        def schedule(request, endpoints, now=None):
            told.append(request.input_tokens)
            return inner(request, endpoints, now)

        sched.schedule = schedule   # type: ignore[method-assign]
        return sched

    spec = get_preset("llama3-8b-a100")
    reqs = [_req(i, 1_000 + 37 * i, 5, t=0.2 * i) for i in range(60)]
    _, res = _sim(spec, reqs, Realism(seed=2), n_servers=2, router=LifecycleRouter("probe", factory, 0))
    true = [r.input_len for r in reqs]
    assert told == [r.est_input_len for r in reqs] and told != true
    ratios = sorted(t / n for t, n in zip(told, true))
    assert 0.7 < ratios[len(ratios) // 2] < 1.3 and ratios[0] < 0.95 and ratios[-1] > 1.05
    assert res.prompt_tokens == sum(true)       # the engine prefilled the true prompts


def test_a_shared_prefix_has_the_same_bytes_and_blocks_in_every_prompt_that_holds_it():
    """The gateway hashes a prompt's bytes: a turn that extends the previous turn's prompt
    matches all of its blocks, and what the router estimates it must prefill is the new text's
    estimate, not the whole prompt's error (bytes per token is the text's, not the request's)."""
    realism = Realism(seed=4)
    block = 64
    head = ((("s", 0), SEG), (("c", 1), SEG), (("c", 2), SEG))
    turn1 = SimRequest(0, 0.0, 3 * SEG + 300, 5, head + ((("t", 1), 300),))
    turn2 = SimRequest(1, 1.0, 4 * SEG + 120, 5, head + ((("c", 3), SEG), (("t", 2), 120)))
    for r in (turn1, turn2):
        r.seg_bytes = realism.segment_bytes(r.segments)
        r.est_input_len = realism.estimated_tokens(r.input_len, r.seg_bytes)
    assert turn1.seg_bytes[:3] == turn2.seg_bytes[:3]       # the same text, the same bytes
    ratios = [b / (4 * n) for b, (_, n) in zip(turn2.seg_bytes, turn2.segments)]
    assert len({round(x, 6) for x in ratios}) == len(ratios)   # each text its own bytes per token
    h1, h2 = prompt_hashes(turn1, block), prompt_hashes(turn2, block)
    shared = sum(turn1.seg_bytes[:3]) // (4 * block)         # the blocks inside the shared segments
    assert shared > 0 and h1[:shared] == h2[:shared] and h1[shared:] != h2[shared:len(h1)]
    assert len(h2) == sum(turn2.seg_bytes) // (4 * block)
    # the router's uncached estimate for turn 2 where turn 1 ran: the new text's bytes / 4
    new_bytes = sum(turn2.seg_bytes) - sum(turn2.seg_bytes[:3])
    uncached = (len(h2) - shared) * block + turn2.est_input_len - len(h2) * block
    assert abs(uncached - new_bytes / 4) <= block + 1
    # exact counts (--ideal): the token blocks of old
    turn2.seg_bytes = None
    assert prompt_hashes(turn2, block)[:8] == [(("s", 0), j) for j in range(8)]


def test_same_seed_same_noise_different_seed_different_noise():
    spec = get_preset("llama3-8b-a100")

    def busy(seed):
        reqs = [_req(i, 2_000, 50, t=0.3 * i) for i in range(30)]
        _, res = _sim(spec, reqs, Realism(seed=seed, deadline_s=0.0), n_servers=2)
        return res.busy_time, [r.finish_t for r in reqs]

    assert busy(0) == busy(0)
    assert busy(0) != busy(1)
    r0, r1 = Realism(seed=0), Realism(seed=1)
    speeds = [r0.step_noise(i).speed for i in range(8)]
    assert len(set(speeds)) == 8 and all(0.9 <= s <= 1.1 for s in speeds)
    assert speeds != [r1.step_noise(i).speed for i in range(8)]


def test_run_one_is_deterministic_per_seed_under_the_realism_defaults():
    sc = get_scenario("standard-small")
    opts = bench.RunOptions(seed=0, limit=150)
    arrivals, cap = bench.prepare(sc, opts)
    a = bench.run_one(sc, arrivals, cap, 1.0, "least-queue", opts)[0]
    b = bench.run_one(sc, arrivals, cap, 1.0, "least-queue", opts)[0]
    c = bench.run_one(sc, arrivals, cap, 1.0, "least-queue", dataclasses.replace(opts, seed=1))[0]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["steps"] != c["steps"] or a["ttft_p50_ms"] != c["ttft_p50_ms"]


def test_ideal_turns_every_realism_knob_off():
    sc = get_scenario("standard")
    assert bench.realism_for(sc, bench.RunOptions(ideal=True)) is None
    cluster = bench.cluster_for(sc, sc.servers, bench.RunOptions(ideal=True))
    assert (cluster.realism, cluster.scrape_interval_s, cluster.scrape_delay_s) == (None, 0.05, 0.0)
    real = bench.realism_for(sc, bench.RunOptions(seed=7))
    assert real is not None and real.seed == 7 and real.deadline_s == 120.0 and real.step_sigma == 0.1
    assert bench.realism_for(sc, bench.RunOptions(deadline_s=30.0)).deadline_s == 30.0
    assert bench.realism_for(dataclasses.replace(sc, deadline_s=45.0), bench.RunOptions()).deadline_s == 45.0


#: ``simulate --scenario standard-small --limit N --seed 3 --load 1.0`` figures of the code
#: before realism existed (commit 6d1b465; 79898dd after it changed only tests): --ideal must
#: reproduce them exactly. policy: (N, (attainment, TTFT p99 ms, engine steps))
IDEAL_FIGURES = {
    "least-queue": (300, (0.47333333333333333, 36654.908244086284, 15373)),
    "llmd-token-load": (300, (0.46, 21369.246677679, 14685)),
    "predicted": (60, (1.0, 16620.008453697068, 6259)),
    "oracle": (150, (0.6933333333333334, 19606.513901028084, 7909)),
}


@pytest.mark.parametrize("policy", sorted(IDEAL_FIGURES))
def test_ideal_reproduces_the_idealised_figures_exactly(policy):
    sc = get_scenario("standard-small")
    limit, figures = IDEAL_FIGURES[policy]
    # the world is pinned, and so is the router: the recommended profile retried held requests every 50 ms then
    config = config_text("predicted-latency-recommended").replace("    holdSlackMs: 300\n",
                                                                  "    holdSlackMs: 300\n    holdRetryMs: 50\n")
    opts = bench.RunOptions(seed=3, limit=limit, ideal=True, epp_config=config if policy == "predicted" else None)
    arrivals, cap = bench.prepare(sc, opts)
    m = bench.run_one(sc, arrivals, cap, 1.0, policy, opts)[0]
    assert (m["slo_attainment"], m["ttft_p99_ms"], m["steps"]) == figures
    assert m["abandoned"] == 0
    real = bench.run_one(sc, arrivals, cap, 1.0, policy, dataclasses.replace(opts, ideal=False))[0]
    assert real["steps"] != m["steps"]      # the defaults are not the idealised world


def test_cli_rejects_a_bad_deadline(capsys):
    from load.simulate_cli import main

    assert main(["--scenario", "standard-small", "--deadline", "-5", "--limit", "10"]) == 2
    assert "--deadline: must be >= 0" in capsys.readouterr().err
    assert main(["--scenario", "standard-small", "--deadline", "30", "--ideal", "--limit", "10"]) == 2
    assert "--deadline goes with the realism defaults" in capsys.readouterr().err
