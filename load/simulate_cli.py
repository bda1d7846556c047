"""``latency-predictor simulate``: closed-loop routing benchmark on a simulated cluster.

Example::

    latency-predictor simulate --scenario standard --policies least-queue,predicted \\
        --load 0.8,1.0 --seed 1 --out out/standard
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from load.sim import bench, engines, flowsim, parallel, verdict
from load.sim import capacity as capsearch
from load.sim.harm_oracle import TRUE_HARM_PARTS
from load.sim.report import write_plots, write_report, write_results
from load.sim.scenarios import LOADS, POLICIES, SCENARIOS, get_scenario


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="latency-predictor simulate", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=None, help="scenario name (see --list; default standard)")
    p.add_argument("--list", action="store_true", help="list scenarios, server presets and policies, then exit")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="replay your own trace instead of a scenario: Mooncake JSONL or Azure LLM inference CSV "
                        "(detected; .gz ok); the scenario name is the file's stem")
    p.add_argument("--servers", type=int, default=None,
                   help="with --trace: servers in the pool (default 8, or prefill + decode servers when both are "
                        "given)")
    p.add_argument("--preset", default=None, help="with --trace: server preset (see --list; default llama3-8b-a100)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: all of --list's sweep; with --capacity: "
                        + ", ".join(capsearch.DEFAULT_POLICIES) + ")")
    p.add_argument("--engine", default="default", metavar="NAME[:COUNT,...]",
                   help="run the servers on a foreign engine the router is not told about (see --list), or a "
                        "mixed pool, e.g. default:4,slow:4 (counts in server order, adding up to the pool)")
    p.add_argument("--engine-param", action="append", default=[], metavar="NAME=VALUE",
                   help="set an engine coefficient for every server, e.g. speed_scale=0.7, "
                        "prefill_attention_scale=2, max_num_seqs=32 (repeatable; see load/sim/engines.py)")
    p.add_argument("--capacity", action="store_true",
                   help="per policy, the highest load at which SLO attainment stays >= 90%%, to within 2%% "
                        "(--load is not used); report.md opens with the verdict")
    p.add_argument("--from-sweep", default=None, metavar="DIR",
                   help="with --capacity: start from a sweep's runs (its --out; same scenario, seed and options)")
    p.add_argument("--load", default=",".join(str(x) for x in LOADS),
                   help="comma-separated loads as fractions of the cluster's capacity; with --trace, 'native' replays "
                        "the trace at its own timestamps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1,
                   help="run seeds SEED..SEED+N-1 and report every metric as mean ± std (no plots)")
    p.add_argument("--out", default=None, help="output directory (report.md, results.json, plots)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N requests of the workload")
    p.add_argument("--retrain-interval", type=float, default=60.0,
                   help="simulated seconds between retrains of the predicted policies (in-process mode)")
    p.add_argument("--predictor", default=None,
                   help="prediction server URL(s), comma-separated: use real servers instead of in-process models")
    p.add_argument("--training-url", default=None, help="training server URL (with --predictor)")
    p.add_argument("--true-latencies", action="store_true",
                   help="predicted policies: answer the producer with the simulator's true per-endpoint latencies "
                        "(the oracle's forward probe) instead of models, to see how much better predictions could "
                        "give a profile (slower: a forward simulation per candidate)")
    p.add_argument("--true-harm", nargs="?", const="all", default="", choices=TRUE_HARM_PARTS,
                   metavar="PART",
                   help="predicted policies: the config's decode-harm-filter / decode-harm-scorer count the "
                        "simulator's truth instead of their estimate (load/sim/harm_oracle.py; slower): all (the "
                        "default) the true count alone (requests a placement pushes over their TPOT SLO plus the "
                        "request's own miss), harm only the requests pushed over, own only the request's own miss")
    p.add_argument("--true-harm-probe", type=int, default=None, metavar="STEPS",
                   help="with --true-harm: the decode steps past the request's first token the truth is judged at "
                        "(default 4)")
    p.add_argument("--record-trace", default=None,
                   help="write the training entries that epp_client's producer emits during the run (llm-d "
                        "policies only) to this JSONL file, in the wire format of /add_training_data_bulk")
    p.add_argument("--epp-config", default=None,
                   help="EndpointPickerConfig for the predicted policies: a YAML file or a well-known name "
                        "(predicted-latency-recommended, predicted-latency-slo); default: each policy's own")
    p.add_argument("--opt-in-share", type=float, default=None, metavar="SHARE",
                   help="predicted policies: the share of requests (0..1, drawn per request from the seed) sent with "
                        "x-prediction-based-scheduling: true; the others take llm-d's default profile, and opted-in "
                        "ones too until a learned model answers (default: every request predicted, no opt-in)")
    p.add_argument("--flow-ttl", type=float, default=60.0,
                   help="request TTL in seconds of the <router>+<ordering> flow-control policies (0: none)")
    p.add_argument("--flow-detector", action="append", default=[], metavar="NAME=VALUE",
                   help="saturation detector of the flow-control policies: type=concurrency-detector (default "
                        "utilization-detector) or a parameter, e.g. queueDepthThreshold=2, maxConcurrency=16 "
                        "(repeatable; llm-d's defaults otherwise)")
    p.add_argument("--flow-param", action="append", default=[], metavar="NAME=VALUE",
                   help="program-aware-fairness parameter of the +las and +turn-priority policies, e.g. "
                        "lasWeightHeadWait=0.5, lasHalfLifeSeconds=10, turnPriorityTimeWeight=0.1 (repeatable; "
                        "B4.5's defaults otherwise)")
    p.add_argument("--prefill-servers", type=int, default=None,
                   help="P/D policies (pd-*): prefill servers (the rest of the scenario's GPUs decode)")
    p.add_argument("--decode-servers", type=int, default=None,
                   help="P/D policies (pd-*): decode servers (with --prefill-servers: any GPU count)")
    p.add_argument("--ideal", action="store_true",
                   help="the idealised world, for comparison only: one consistent metrics snapshot of all servers "
                        "every 50 ms, exact step times, identical servers, exact prompt token counts, no client "
                        "deadline, a free drain after the last arrival (default: realism on, docs/evaluation.md §4)")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="client deadline in seconds after arrival: a request not finished by then is abandoned "
                        "and counts as a miss (default: the scenario's, else 120 s, the gateway's first-byte "
                        "timeout; 0: none)")
    p.add_argument("--workers", type=int, default=None,
                   help="run the (load, policy) simulations in this many processes (default: the cores available; "
                        "1 with --record-trace); the results are the same for any count")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _loads(text: str, native: bool = False) -> list[tuple[str, float | None]]:
    """(label, load) pairs; ``native`` (allowed with ``native=True``) has load None until resolved."""
    out: list[tuple[str, float | None]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part == "native":
            if not native:
                raise ValueError("--load: 'native' needs --trace (a scenario has no pace of its own)")
            out.append((part, None))
            continue
        try:
            x = float(part)
        except ValueError:
            raise ValueError(f"--load: not a number: {part!r}") from None
        if not 0 < x <= 10:
            raise ValueError(f"--load: {part} is out of range (0, 10]")
        out.append((part, x))
    if not out:
        raise ValueError("--load: no load level given")
    return out


def _scenario(args):
    """The named scenario, or with ``--trace`` the user's trace (read now: a malformed file fails here)."""
    if args.trace is None:
        if args.servers is not None or args.preset is not None:
            raise ValueError("--servers and --preset go with --trace (a scenario brings its own pool)")
        return get_scenario(args.scenario or "standard")
    if args.scenario is not None:
        raise ValueError("--trace replaces --scenario: give one of them")
    from load.sim.trace import DEFAULT_PRESET, DEFAULT_SERVERS, trace_scenario

    servers = args.servers
    if servers is None:
        pd = (args.prefill_servers, args.decode_servers)
        servers = pd[0] + pd[1] if None not in pd else DEFAULT_SERVERS
    return trace_scenario(Path(args.trace), servers, args.preset or DEFAULT_PRESET)


def _pairs(items: list[str], flag: str) -> dict:
    """``NAME=VALUE`` options -> {name: value} (values read as YAML scalars: 0.5, 16, 10s)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name or not eq:
            raise ValueError(f"{flag}: expected NAME=VALUE, got {item!r}")
        out[name] = yaml.safe_load(value) if value else None
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        print("scenarios:")
        for s in SCENARIOS.values():
            print(f"  {s.name:<20} {s.description}")
        from load.sim.stepmodel import PRESETS

        print("\nserver presets (--trace ... --preset NAME):")
        for spec in PRESETS.values():
            print(f"  {spec.name:<20} KV cache {spec.kv_capacity_tokens:,} tokens, {spec.max_num_batched_tokens} "
                  "batched tokens per step")
        print("\nengines (--engine NAME, or a mixed pool NAME:COUNT,...):")
        for e in engines.ENGINES.values():
            print(f"  {e.name:<20} {e.description}")
        print("\npolicies:\n  " + ", ".join(bench.known_policies()))
        print("  <router>+<ordering>: flow control in front of a router, ordering one of fcfs, round-robin, las, "
              "turn-priority (e.g. token-load+turn-priority, predicted+las)")
        return 0
    try:
        scenario = engines.apply(_scenario(args), args.engine, _pairs(args.engine_param, "--engine-param"))
        if args.policies is None:
            args.policies = ",".join(capsearch.DEFAULT_POLICIES if args.capacity else POLICIES)
        parsed_loads = _loads(args.load, native=args.trace is not None)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        bad = [p for p in policies if not bench.is_known(p)]
        if bad or not policies:
            raise ValueError(f"--policies: unknown {', '.join(bad) or '(none given)'}; "
                             f"known: {', '.join(bench.known_policies())}")
        if args.record_trace and not any(p in bench.EPP_POLICIES for p in policies):
            raise ValueError("--record-trace needs an llm-d policy (training entries come from epp_client's "
                             f"producer): one of {', '.join(bench.EPP_POLICIES)}")
        detector = _pairs(args.flow_detector, "--flow-detector")
        from epp_client.flowcontrol import make_detector

        make_detector(detector)   # validate now: ConfigError names the parameter
        flow_params = flowsim.policy_params(_pairs(args.flow_param, "--flow-param"))
        for flag, v in (("--prefill-servers", args.prefill_servers), ("--decode-servers", args.decode_servers)):
            if v is not None and v < 1:
                raise ValueError(f"{flag}: must be >= 1, got {v}")
        if args.workers is None:
            args.workers = parallel.default_workers()
        if args.workers < 1:
            raise ValueError(f"--workers: must be >= 1, got {args.workers}")
        if args.deadline is not None:
            if args.ideal:
                raise ValueError("--deadline goes with the realism defaults, not with --ideal (no deadlines)")
            if not args.deadline >= 0:
                raise ValueError(f"--deadline: must be >= 0 seconds (0: none), got {args.deadline:g}")
        if args.seeds < 1:
            raise ValueError(f"--seeds: must be >= 1, got {args.seeds}")
        if args.from_sweep is not None and not args.capacity:
            raise ValueError("--from-sweep goes with --capacity")
        if (args.predictor is None) != (args.training_url is None):
            raise ValueError("--predictor and --training-url go together")
        if args.true_latencies:
            if args.predictor is not None:
                raise ValueError("--true-latencies replaces the models: it does not go with --predictor")
            if not any(p in bench.PREDICTED_POLICIES for p in policies):
                raise ValueError("--true-latencies needs a predicted policy: one of "
                                 + ", ".join(bench.PREDICTED_POLICIES))
        if args.true_harm_probe is not None:
            if not args.true_harm:
                raise ValueError("--true-harm-probe goes with --true-harm")
            if args.true_harm_probe < 1:
                raise ValueError(f"--true-harm-probe: at least 1 decode step, got {args.true_harm_probe}")
        probe = bench.RunOptions.true_harm_probe if args.true_harm_probe is None else args.true_harm_probe
        if args.true_harm and not any(p in bench.PREDICTED_POLICIES for p in policies):
            raise ValueError("--true-harm needs a predicted policy: one of " + ", ".join(bench.PREDICTED_POLICIES))
        if args.opt_in_share is not None:
            if not 0.0 <= args.opt_in_share <= 1.0:
                raise ValueError(f"--opt-in-share: must be in [0, 1], got {args.opt_in_share:g}")
            if not any(p in bench.PREDICTED_POLICIES for p in policies):
                raise ValueError("--opt-in-share needs a predicted policy: one of "
                                 + ", ".join(bench.PREDICTED_POLICIES))
        epp_config = None
        if args.epp_config:
            from epp_client.framework.loader import build_scheduler
            from epp_client.profiles import config_text

            try:
                epp_config = config_text(args.epp_config)
            except OSError as e:
                raise ValueError(f"--epp-config: {e}") from None
            build_scheduler(epp_config)     # validate now: ConfigError names the bad key
        if args.true_harm:
            from load.sim.epp_routers import PREDICTED_CONFIGS

            without = [p for p in policies if p in PREDICTED_CONFIGS
                       and "decode-harm-" not in (epp_config or PREDICTED_CONFIGS[p][0])]
            if without:
                raise ValueError(f"--true-harm: the config of {', '.join(without)} has no decode-harm-filter or "
                                 "decode-harm-scorer (give one with --epp-config)")
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    trace = open(args.record_trace, "w") if args.record_trace else None
    opts = bench.RunOptions(seed=args.seed, limit=args.limit, predictor_url=args.predictor,
                            training_url=args.training_url, retrain_interval_s=args.retrain_interval,
                            record_trace=trace, epp_config=epp_config, opt_in_share=args.opt_in_share,
                            true_latencies=args.true_latencies, true_harm=args.true_harm,
                            true_harm_probe=probe,
                            flow_ttl_s=args.flow_ttl, flow_detector=detector, flow_params=flow_params,
                            ideal=args.ideal, deadline_s=args.deadline,
                            extra={"prefill_servers": args.prefill_servers, "decode_servers": args.decode_servers})
    loads: list[tuple[str, float]] = [(label, x) for label, x in parsed_loads if x is not None]
    native_note = None
    if len(loads) < len(parsed_loads):     # 'native' (None): resolved to the trace's own pace
        from load.sim.trace import native_load

        try:
            arrivals, capacity = bench.prepare(scenario, opts)
            share = native_load(arrivals, capacity)
        except ValueError as e:
            print(f"simulate: {e}", file=sys.stderr)
            return 2
        loads = [(label, share if x is None else x) for label, x in parsed_loads]
        native_note = (f"load native = the trace's own pace, {share * capacity:.3f} requests/s = "
                       f"{100 * share:.1f}% of capacity ({capacity:.3f} requests/s)")
        print(native_note)
    if args.capacity:
        return _main_capacity(args, scenario, policies, opts)
    if args.seeds > 1:
        return _main_seeds(args, scenario, loads, policies, opts, native_note)
    arrivals, capacity = bench.prepare(scenario, opts)
    bar = bench.ProgressBar(len(loads) * len(policies), enabled=not args.quiet)
    results: dict = {}
    raw: dict = {}
    wall: dict = {}
    notes: dict = {}
    try:
        runs = parallel.run_sweep(scenario, arrivals, capacity, loads, policies, opts, args.workers, bar)
    finally:
        bar.close()
        if trace is not None:
            trace.close()
    for (label, pol), (m, r, note, w, c) in runs.items():
        results.setdefault(label, {})[pol] = m
        raw[(label, pol)] = r
        notes[pol] = note
        wall[(label, pol)] = (w, c)
    slo = [f"{c.name}: share {c.share:g}, TTFT <= {c.ttft_ms:g} ms"
           + (f" + {c.ttft_ms_per_1k_input:g} ms/1k input" if c.ttft_ms_per_1k_input else "")
           + (f" + {c.ttft_slowdown:g} x idle prefill time" if c.ttft_slowdown else "")
           + f", TPOT <= {c.tpot_ms:g} ms, priority {c.priority}" for c in scenario.slo_classes]
    realism = bench.realism_for(scenario, opts)
    meta = {"requests": len(arrivals), "capacity_rps": capacity, "cluster": scenario.cluster_desc(),
            "realism": realism.describe() if realism is not None else "",
            "engine": engines.describe(args.engine, _pairs(args.engine_param, "--engine-param")),
            "run_key": _run_key(args, scenario, opts, len(arrivals), capacity), "slo": slo, "policy_notes": notes,
            "load_share": dict(loads),
            **({"opt_in_share": args.opt_in_share} if args.opt_in_share is not None else {}),
            **({"true_latencies": True} if args.true_latencies else {}),
            **({"true_harm": args.true_harm, "true_harm_probe": opts.true_harm_probe} if args.true_harm else {}),
            **({"native_load": native_note} if native_note else {}),
            **({"flow_params": opts.flow_params} if opts.flow_params else {}),
            "wall_s": {f"{lab}|{p}": w for (lab, p), (w, _) in wall.items()},
            "cpu_s": {f"{lab}|{p}": c for (lab, p), (_, c) in wall.items()}}
    summary = {lab: {p: {k: v for k, v in m.items()} for p, m in per.items()} for lab, per in results.items()}
    if args.out:
        out = Path(args.out)
        write_results(out, scenario.name, args.seed, summary, meta)
        plots = [] if args.no_plots else write_plots(out, results, raw, dict(loads))
        report = write_report(out, scenario, args.seed, results, {**meta, "wall_s": wall}, plots)
        verdict.prepend(report, verdict.lines(results))
        if scenario.programs is not None:
            from load.sim.agentic import append_section
            append_section(report, results)
        print(f"wrote {out / 'report.md'} and {out / 'results.json'}")
    else:
        from load.sim.report import table
        for label, per in results.items():
            print(f"\nload {label}\n" + table(per))
            if scenario.programs is not None:
                from load.sim.agentic import table as ptable
                print(ptable(per))
    return 0


def _run_key(args, scenario, opts, requests: int, capacity: float) -> dict:
    return bench.run_key(scenario, opts, engines.describe(args.engine, _pairs(args.engine_param, "--engine-param")),
                         requests, capacity)


def _main_capacity(args, scenario, policies, opts) -> int:
    t0 = time.monotonic()
    arrivals, cap_rps = bench.prepare(scenario, opts)
    try:
        key = _run_key(args, scenario, opts, len(arrivals), cap_rps)
        known = None if args.from_sweep is None else capsearch.from_sweep(Path(args.from_sweep), key)
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    caps = capsearch.run(scenario, arrivals, cap_rps, policies, opts, args.workers, known=known,
                        log=None if args.quiet else lambda msg: print(msg, file=sys.stderr))
    meta = {"requests": len(arrivals), "capacity_rps": cap_rps, "cluster": scenario.cluster_desc(),
            "engine": engines.describe(args.engine, _pairs(args.engine_param, "--engine-param")),
            "wall_s": time.monotonic() - t0, "workers": args.workers}
    if args.out:
        capsearch.write(Path(args.out), scenario, args.seed, caps, meta)
        print(f"wrote {Path(args.out) / 'report.md'} and {Path(args.out) / 'results.json'}")
    else:
        print("\n".join([*verdict.lines({}, caps), *capsearch.table(caps)]))
    return 0


def _main_seeds(args, scenario, loads, policies, opts, native_note=None) -> int:
    from load.sim import seeds

    bar = bench.ProgressBar(args.seeds * len(loads) * len(policies), enabled=not args.quiet)
    try:
        per_seed = seeds.run_seeds(scenario, loads, policies, opts, args.seeds, bar, args.workers)
    finally:
        bar.close()
        if opts.record_trace is not None:
            opts.record_trace.close()
    agg = seeds.aggregate(per_seed)
    if args.out:
        seeds.write(Path(args.out), scenario.name, args.seed, args.seeds, per_seed, agg, native_note,
                    opts.flow_params)
        print(f"wrote {Path(args.out) / 'report.md'} and {Path(args.out) / 'results.json'}")
    else:
        note = "\n".join(x for x in (native_note, flowsim.params_note(opts.flow_params)) if x) or None
        print(seeds.report(scenario.name, args.seed, args.seeds, agg, note, per_seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
