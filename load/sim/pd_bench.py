"""P/D policies in the simulator and one (load, policy) run of them (``docs/pd.md``).

Every policy runs epp_client's real decision code (``disagg-profile-handler``, the
deciders, the role filters) on a pool of the same GPU count:

- ``pd-aggregated``: every server ``prefill-decode``, llm-d's default profile (queue 2,
  KV 2, prefix 3, max-score picker) - the baseline;
- ``pd-prefix-<N>``: P prefill + D decode servers, ``prefix-based-pd-decider`` with
  ``nonCachedTokens: N``;
- ``pd-always``: ``always-disagg-pd-decider``;
- ``pd-predicted``: ``predicted-pd-decider`` on the predicted-latency producer's
  predictions (``endpointRoleLabel: llm-d.ai/role``), learned online in the loop.

The decode and prefill profiles filter by role and score with the default profile's
scorers. P and D come from the scenario's ``pd`` setup or from ``--prefill-servers`` /
``--decode-servers`` (``RunOptions.extra``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from epp_client.framework.loader import build_scheduler
from epp_client.plugins.filter.role import ROLE_LABEL

from . import workloads as W
from .driver import LifecycleRouter
from .engine import DEFERRED
from .epp_routers import _Sink
from .pd import BOTH, DECODE, PREFILL, KVLink, PDSimulation
from .report import summarize

PD_THRESHOLDS = (512, 2048, 8192)
PD_POLICIES = ("pd-aggregated", *(f"pd-prefix-{n}" for n in PD_THRESHOLDS), "pd-always", "pd-predicted")


def is_pd_policy(policy: str) -> bool:
    if policy in PD_POLICIES:
        return True
    head, _, n = policy.rpartition("-")
    return head == "pd-prefix" and n.isdigit()


@dataclass(frozen=True)
class PDSetup:
    prefill: int
    decode: int
    link: str = "rdma-200g"


class PDRouter(LifecycleRouter):
    """A scheduler's driver whose endpoints carry the servers' roles and whose answer names the
    prefill server too when the prefill profile ran."""

    def bind(self, sim) -> None:
        super().bind(sim)
        for e, role in zip(self.endpoints, sim.roles):
            e.labels = {ROLE_LABEL: role}
        self.disaggregated = 0

    def route(self, req, now):
        idx = super().route(req, now)
        if idx is None:
            return None
        if idx == DEFERRED:
            raise ValueError(f"{self.name}: a filter held a request (holdSlackMs); holds are not supported "
                             "on P/D pools")
        pre = req.ctx[1].picks.get("prefill")
        if pre is None:
            return idx
        self.disaggregated += 1
        return (idx, self.by_name[pre.name])

    def on_dispatch(self, req, idx, now) -> None:
        super().on_dispatch(req, idx, now)
        pre = req.ctx[1].picks.get("prefill")
        if pre is not None:   # the approximate prefix producer records every profile's pick
            assert self.prefix is not None   # make_router builds every PDRouter with prefix=True
            self.prefix.record(pre.name, req.ctx[2])

    def stats(self) -> dict:
        out = super().stats()
        out["disaggregated"] = getattr(self, "disaggregated", 0)
        return out


_SCORERS = [{"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "prefix-cache-scorer", "weight": 3}]


def pd_config(decider: dict | None, producer: bool = False) -> dict:
    plugins: list[dict] = [{"type": "decode-filter"}, {"type": "prefill-filter"}, {"type": "queue-scorer"},
               {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"}, {"type": "max-score-picker"}]
    if producer:
        plugins.append({"type": "predicted-latency-producer",
                        "parameters": {"streamingMode": True, "endpointRoleLabel": ROLE_LABEL}})
    handler: dict = {"type": "disagg-profile-handler", "parameters": {}}
    if decider is not None:
        plugins.append({"name": "decider", **decider})
        handler["parameters"]["deciders"] = {"prefill": "decider"}
    plugins.append(handler)
    return {"plugins": plugins, "schedulingProfiles": [
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, *_SCORERS]},
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, *_SCORERS]}]}


def make_router(policy: str, opts, link: KVLink) -> PDRouter:
    learner = sink = predictor = None
    if policy == "pd-aggregated":
        config, desc = pd_config(None), "aggregated: every server prefill-decode, default profile scorers"
    elif policy.startswith("pd-prefix-"):
        n = int(policy.rsplit("-", 1)[1])
        config = pd_config({"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": n}})
        desc = f"prefix-based-pd-decider nonCachedTokens {n}"
    elif policy == "pd-always":
        config, desc = pd_config({"type": "always-disagg-pd-decider"}), "always-disagg-pd-decider"
    elif policy == "pd-predicted":
        from .online import OnlineLearner

        learner = OnlineLearner(retrain_interval_s=opts.retrain_interval_s, seed=opts.seed)
        predictor = learner.predictor
        sink = _Sink(learner)
        config = pd_config({"type": "predicted-pd-decider", "parameters": {
            "kvBytesPerToken": link.kv_bytes_per_token, "transferBandwidthGBps": link.bandwidth_gbps,
            "transferLatencyMs": link.latency_ms}}, producer=True)
        desc = "predicted-pd-decider on online-learned predictions"
    else:
        raise ValueError(f"unknown P/D policy {policy!r}; known: {', '.join(PD_POLICIES)}")

    def factory(rng: random.Random, clock, wall):
        return build_scheduler(config, predictor=predictor, sink=sink, rng=random.Random(rng.random()),
                               clock=clock, wall_clock=wall)

    return PDRouter(policy, factory, opts.seed, learner=learner, sink=sink, description=desc, prefix=True)


def setup_for(scenario, opts) -> PDSetup:
    p, d = opts.extra.get("prefill_servers"), opts.extra.get("decode_servers")
    base = getattr(scenario, "pd", None)
    if p is None and d is None and base is not None:
        return base
    n = len(scenario.servers)
    if p is None or d is None:
        if p is None and d is None:
            raise ValueError(f"P/D policies need --prefill-servers and --decode-servers (scenario {scenario.name} "
                             "has no P/D pools)")
        p = n - d if p is None else p
        d = n - p if d is None else d
    if p < 1 or d < 1:
        raise ValueError("--prefill-servers and --decode-servers must be >= 1")
    return PDSetup(p, d, base.link if base is not None else "rdma-200g")


def run_one(scenario, arrivals, capacity, load, policy, opts, progress=None):
    """One (load, policy) of a P/D comparison; returns (metrics, raw arrays, router)."""
    setup = setup_for(scenario, opts)
    n = setup.prefill + setup.decode
    spec = scenario.servers[0]
    servers = [spec] * n
    roles = [BOTH] * n if policy == "pd-aggregated" else [PREFILL] * setup.prefill + [DECODE] * setup.decode
    link = KVLink.for_preset(spec.name, opts.extra.get("kv_link") or setup.link,
                             load=opts.extra.get("kv_load") or "async")
    scaled = W.scale_to_rate(arrivals, load * capacity)
    reqs = W.make_requests(scaled, scenario.slo_classes, opts.seed, spec)
    router = make_router(policy, opts, link)
    from .bench import cluster_for  # bench imports this module's policies

    cluster = cluster_for(scenario, servers, opts)
    sim = PDSimulation(cluster, reqs, router, roles, link, tick_interval_s=router.tick_interval_s, progress=progress)
    res = sim.run()
    res.extra.update(router.stats())
    res.extra["transfer_ms_mean"] = (1000 * sum(x for _, x, _ in sim.transfers.values()) / len(sim.transfers)
                                     if sim.transfers else 0.0)
    router.close()
    m, raw = summarize(res, n)
    m["goodput_per_gpu_rps"] = m["goodput_rps"] / n
    m["disaggregated_share"] = m.get("disaggregated", 0) / len(reqs) if reqs else 0.0
    return m, raw, router


#: pools of the P/D realism bench: (roles, policy)
BENCH_POOLS = {"aggregated-1": ((BOTH,), "pd-aggregated"), "aggregated-2": ((BOTH, BOTH), "pd-aggregated"),
               "1p1d": ((PREFILL, DECODE), "pd-always"), "2p1d": ((PREFILL, PREFILL, DECODE), "pd-always")}


def bench_pool(pool: str, rate: float, link: KVLink, preset: str = "llama3-8b-a100", n: int = 300,
               prompt: int = 8000, output: int = 256, seed: int = 0) -> dict:
    """One pool of ``BENCH_POOLS`` on ``n`` Poisson requests at ``rate``/s of ``prompt``-token unique
    prompts and ``output``-token answers: TTFT/TPOT, the transfer and the decode servers' batches."""
    from .bench import RunOptions
    from .engine import ClusterConfig
    from .stepmodel import get_preset

    roles, policy = BENCH_POOLS[pool]
    spec = get_preset(preset)
    arrivals = W.synthetic_poisson(n, rate=rate, seed=seed, input_median=prompt, input_sigma=0.0,
                                   output_median=output, output_sigma=0.0, n_system_prompts=0, max_input=prompt)
    reqs = W.make_requests(arrivals, (), seed, spec)
    router = make_router(policy, RunOptions(seed=seed), link)
    sim = PDSimulation(ClusterConfig([spec] * len(roles)), reqs, router, roles, link)
    res = sim.run()
    m, _ = summarize(res, len(roles))
    decoders = [s for s in sim.servers if s.role != PREFILL]
    tokens = sum(r.output_len for r in reqs if r.done and sim.servers[r.server].role != PREFILL)
    steps = sum(s.steps for s in decoders)
    waits = [x for _, x, _ in sim.transfers.values()]
    return {"pool": pool, "rate": rate, "link": f"{link.bandwidth_gbps:g} GB/s {link.load}",
            **{k: m[k] for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")},
            "transfer_ms_mean": 1000 * sum(waits) / len(waits) if waits else 0.0,
            "decode_batch_mean": tokens / steps if steps else 0.0,
            "kv_load_share": sum(s.kv_load_s for s in decoders) / max(1e-9, sum(s.busy_time for s in decoders))}


def main(argv: list[str] | None = None) -> None:
    """``python -m load.sim.pd_bench``: the P/D realism bench (docs/pd.md, "What the decode server pays")."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m load.sim.pd_bench", description=main.__doc__)
    ap.add_argument("--pools", default="aggregated-2=1.0,1p1d=1.0,2p1d=2.0",
                    help="POOL=RATE,... (pools: " + ", ".join(BENCH_POOLS) + ")")
    ap.add_argument("--links", default="rdma-200g,tcp-100g", help="link names (pd.LINKS_GBPS)")
    ap.add_argument("--loads", default="async,in-step", help="KV load modes (pd.LOAD_MODES)")
    ap.add_argument("--preset", default="llama3-8b-a100")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--prompt", type=int, default=8000)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        pools = [(k, float(v)) for k, _, v in (item.partition("=") for item in a.pools.split(","))]
    except ValueError:
        ap.error(f"--pools: expected POOL=RATE,..., got {a.pools!r}")
    bad = [k for k, _ in pools if k not in BENCH_POOLS]
    if bad:
        ap.error(f"--pools: unknown pool(s) {', '.join(bad)}; known: {', '.join(BENCH_POOLS)}")
    print("| pool | rate | link | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | KV on decode (ms) | decode batch | "
          "decode time taking KV in |\n|---|---|---|---|---|---|---|---|---|---|")
    for pool, rate in pools:
        modes = [("-", "async")] if BENCH_POOLS[pool][1] == "pd-aggregated" else \
            [(ln, ld) for ln in a.links.split(",") for ld in a.loads.split(",")]
        for ln, ld in modes:
            try:
                link = KVLink.for_preset(a.preset, ln if ln != "-" else "rdma-200g", load=ld)
            except ValueError as e:
                ap.error(str(e))
            r = bench_pool(pool, rate, link, a.preset, a.n, a.prompt, a.output, a.seed)
            print(f"| {pool} | {rate:g} | {ln if ln == '-' else r['link']} | {r['ttft_p50_ms']:.0f} | "
                  f"{r['ttft_p90_ms']:.0f} | {r['tpot_p50_ms']:.1f} | {r['tpot_p90_ms']:.1f} | "
                  f"{r['transfer_ms_mean']:.0f} | {r['decode_batch_mean']:.1f} | {100 * r['kv_load_share']:.1f}% |")


if __name__ == "__main__":
    main()
