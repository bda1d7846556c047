"""P/D in the simulator: the KV transfer time of one request equals the formula, and a
disaggregated request's TTFT = prefill + transfer + first decode step (within 5%)."""
from __future__ import annotations

import pytest

from load.sim.driver import BaseRouter
from load.sim.engine import ClusterConfig
from load.sim.pd import KV_SHAPES, KVLink, PDSimulation
from load.sim.request import SimRequest
from load.sim.stepmodel import get_preset


class Alternate(BaseRouter):
    """Decode on the last server, prefill alternating over the others."""

    def route(self, req, now):
        n = len(self.sim.servers)
        return (n - 1, req.rid % (n - 1))


class Fixed(BaseRouter):
    """Every request: decode on server ``d``, prefill on ``p`` (None: aggregated on d)."""

    def __init__(self, d, p):
        super().__init__(0)
        self.d, self.p = d, p

    def route(self, req, now):
        return (self.d, self.p)


def run(reqs, d=1, p=0, roles=("prefill", "decode"), link=None):
    spec = get_preset("llama3-8b-a100")
    link = link or KVLink.for_preset("llama3-8b-a100", "rdma-200g")
    sim = PDSimulation(ClusterConfig([spec] * len(roles)), reqs, Fixed(d, p), roles, link)
    sim.run()
    return sim, spec


def one(rid=0, n=8000, out=20, key="sys", arrival=0.0):
    return SimRequest(rid, arrival, n, out, ((key, n),))


def test_kv_bytes_per_token_from_the_model_config():
    assert KV_SHAPES["llama3-8b-a100"].bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert KV_SHAPES["llama2-7b-h100"].bytes_per_token == 524288


def test_transfer_time_of_one_request_equals_the_formula():
    sim, _ = run([one()])
    prefill_end, seconds, tokens = sim.transfers[0]
    assert tokens == 8000
    assert seconds == pytest.approx(8000 * 131072 / 25e9)           # 41.9 ms over 200 Gb/s RDMA
    # the decode server admitted it exactly when the transfer ended
    req = sim.requests[0]
    assert req.admitted_t == pytest.approx(0.0)                      # (prefill admission, first)
    assert req.first_token_t > prefill_end + seconds


def test_disaggregated_ttft_is_prefill_plus_transfer_plus_first_decode_step():
    sim, spec = run([one()])
    req = sim.requests[0]
    # prefill on an idle server: chunks of the token budget, causal attention over what is computed
    prefill_ms, done = 0.0, 0
    while done < 8000:
        n = min(spec.max_num_batched_tokens, 8000 - done)
        prefill_ms += spec.step_ms(n, 0.0, 0, n * (done + n - n / 2.0))
        done += n
    transfer_ms = 8000 * 131072 / 25e9 * 1000
    first_decode_ms = spec.step_ms(1, 8000.0, 1, 0.0)               # one token reading 8000 tokens of KV
    expected = prefill_ms + transfer_ms + first_decode_ms
    assert req.ttft_ms == pytest.approx(expected, rel=0.05)
    assert req.done and req.generated == 20 and req.server == 1
    # the prefill server's run ended with the prompt; the decode server did the rest
    assert sim.servers[0].prompt_tokens == 8000 and not sim.servers[1].running


def test_only_uncached_tokens_travel_and_the_decode_server_caches_what_it_received():
    # two requests with the same 8000-token prompt, the second after the first finished:
    # its prompt is cached on the decode server, so (almost) nothing travels
    sim, _ = run([one(0), one(1, arrival=30.0)])
    assert sim.transfers[0][2] == 8000 and sim.transfers[1][2] == 0


def test_aggregated_route_is_untouched_and_roles_are_checked():
    sim, _ = run([one()], d=0, p=None, roles=("prefill-decode",))
    assert not sim.transfers and sim.requests[0].done
    with pytest.raises(ValueError):
        run([one()], roles=("prefill", "bogus"))


def test_metrics_per_role():
    reqs = [one(i, n=4000, key=f"k{i}", arrival=0.0) for i in range(6)]
    spec = get_preset("llama3-8b-a100")
    sim = PDSimulation(ClusterConfig([spec] * 3), reqs, Alternate(0), ("prefill", "prefill", "decode"),
                       KVLink.for_preset("llama3-8b-a100"))
    seen = {}
    sim.call_at(0.6, lambda t: seen.update(sim.metrics_by_role(t)))
    sim.run()
    assert set(seen) == {"prefill", "decode"}
    # at 0.6 s both prefill servers are still working through their three prompts each,
    # and the first prompts' KV has reached the decode server, which is decoding them
    assert seen["prefill"].running >= 2
    assert seen["decode"].running >= 1 and seen["decode"].kv_cache_usage > 0
    assert all(r.done for r in reqs)


# -- the pd scenario and its policies -------------------------------------------------------
def _pd_run(policy, limit=80, **extra):
    from load.sim import bench
    from load.sim.scenarios import get_scenario

    sc = get_scenario("pd")
    opts = bench.RunOptions(limit=limit, extra=extra)
    arrivals, cap = bench.prepare(sc, opts)
    m, _, _ = bench.run_one(sc, arrivals, cap, 0.5, policy, opts)
    return m


def test_pd_policies_run_epp_client_decisions_on_role_pools():
    agg, always, never = _pd_run("pd-aggregated"), _pd_run("pd-always"), _pd_run("pd-prefix-100000")
    assert agg["completed"] == always["completed"] == never["completed"] == 80
    assert agg["disaggregated_share"] == 0 and agg["transfer_ms_mean"] == 0
    assert always["disaggregated_share"] == 1
    # median prompt 6k tokens x 128 KiB over 25 GB/s: tens of ms
    assert 10 < always["transfer_ms_mean"] < 200
    assert never["disaggregated_share"] == 0
    assert always["goodput_per_gpu_rps"] == pytest.approx(always["goodput_rps"] / 8)


def test_pool_sizes_from_the_flags():
    from load.sim import bench
    from load.sim.pd_bench import setup_for
    from load.sim.scenarios import get_scenario

    assert setup_for(get_scenario("pd"), bench.RunOptions()).prefill == 5
    s = setup_for(get_scenario("pd"), bench.RunOptions(extra={"prefill_servers": 2}))
    assert (s.prefill, s.decode) == (2, 6)
    with pytest.raises(ValueError, match="--prefill-servers"):
        setup_for(get_scenario("standard-small"), bench.RunOptions())


def test_cli_rejects_bad_pool_sizes(capsys):
    from load.simulate_cli import main

    assert main(["--scenario", "pd", "--policies", "pd-always", "--prefill-servers", "0"]) == 2
    assert "--prefill-servers" in capsys.readouterr().err


# -- what the decode server pays for arriving KV ---------------------------------------------
def test_transfers_into_one_decode_server_queue_on_its_link():
    # two prefill servers finish identical-length prompts at the same time: the second transfer
    # waits for the first on the decode server's NIC
    reqs = [one(0, key="a"), one(1, key="b")]
    spec = get_preset("llama3-8b-a100")
    sim = PDSimulation(ClusterConfig([spec] * 3), reqs, Alternate(0), ("prefill", "prefill", "decode"),
                       KVLink.for_preset("llama3-8b-a100"))
    sim.run()
    one_xfer = 8000 * 131072 / 25e9
    waits = sorted(x for _, x, _ in sim.transfers.values())
    assert waits[0] == pytest.approx(one_xfer) and waits[1] == pytest.approx(2 * one_xfer)


def test_in_step_load_stalls_the_decode_servers_running_requests():
    # a long-running decode on the decode server, then an 8000-token prompt arrives through P/D:
    # loading its KV inside a step stalls the running request for the transfer; async does not
    def decode_gap(load):
        spec = get_preset("llama3-8b-a100")
        first, second = one(0, n=64, out=400, key="x"), one(1, n=8000, out=5, key="y", arrival=0.5)
        sim = PDSimulation(ClusterConfig([spec] * 2), [first, second], Fixed(1, 0), ("prefill", "decode"),
                           KVLink.for_preset("llama3-8b-a100", "tcp-100g", load=load))
        sim.run()
        return first.tpot_ms * (first.output_len - 1), sim.servers[1].kv_load_s

    async_ms, async_load = decode_gap("async")
    step_ms, step_load = decode_gap("in-step")
    xfer_ms = 8000 * 131072 / 10e9 * 1000                            # 104.9 ms over the 10 GB/s TCP link
    first_ms = 64 * 131072 / 10e9 * 1000                             # the running request's own, before it ran
    assert step_load * 1000 == pytest.approx(xfer_ms + first_ms)
    assert async_load * 1000 == pytest.approx(8064 * 131072 / 2039e9 * 1000)   # HBM writes only
    # the running request's decode time grows by the second prompt's load, less its HBM writes
    assert step_ms - async_ms == pytest.approx(xfer_ms - 8000 * 131072 / 2039e9 * 1000, rel=0.02)


def test_a_request_whose_admission_fails_keeps_its_received_kv():
    spec = get_preset("llama3-8b-a100")
    srv = PDSimulation(ClusterConfig([spec] * 2), [], Fixed(1, 0), ("prefill", "decode"),
                       KVLink.for_preset("llama3-8b-a100")).servers[1]
    req = one(7, n=4000)
    srv.remote_kv[req.rid] = 4000
    full = srv.kv.free
    srv.kv.allocate(full)                     # no page left: admission fails
    srv.add(req, 0.0)
    assert srv.plan_step(0.0) == 0.0 and req.rid in srv.remote_kv
    srv.kv.free += full                       # the pages come back
    assert srv.plan_step(0.0) > 0 and req.computed == 3999 and req.rid not in srv.remote_kv


def test_pd_bench_moves_the_decode_tpot_with_the_load_mode():
    from load.sim.pd_bench import bench_pool

    fast = bench_pool("2p1d", 2.0, KVLink.for_preset("llama3-8b-a100", "tcp-100g", load="async"), n=60)
    slow = bench_pool("2p1d", 2.0, KVLink.for_preset("llama3-8b-a100", "tcp-100g", load="in-step"), n=60)
    assert slow["tpot_p50_ms"] > fast["tpot_p50_ms"] and slow["kv_load_share"] > fast["kv_load_share"]
    with pytest.raises(ValueError, match="load"):
        KVLink(131072, load="sometimes")
