"""The harm a placement does to the requests running there, in the simulator: the decode-harm
plugins in the loop (fed by the producer's decode state, tokens streamed as a gateway does) and
``simulate --true-harm`` (the same plugins counting the simulator's true harm)."""
from __future__ import annotations

import functools
import json

import pytest

from epp_client.engine.model import Outcome
from epp_client.engine.twin_engine import TwinEngine
from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.profiles import config_text
from epp_client.types import Endpoint
from load import simulate_cli
from load.sim import bench
from load.sim.harm_oracle import TrueEngine, TrueHarm
from load.sim.scenarios import get_scenario


@pytest.fixture(scope="module")
def harm_config(tmp_path_factory):
    """The recommended profile (its decode-harm-filter first, holding requests) as a file."""
    cfg = config_text("predicted-latency-recommended")
    assert "  - pluginRef: predicted-latency-producer\n  - pluginRef: decode-harm-filter\n" in cfg
    # the count decides every placement, the hold is bounded by the SLO slack alone and retried every 50 ms:
    # the truth and the twin are compared on the count (least-late placement bypasses it for requests late
    # everywhere)
    pinned = "    holdSlackMs: 300\n    holdRetryMs: 50\n    hopelessPlacement: count\n    maxHoldSloShare: 1\n" \
        "    maxHoldMs: 1000000000\n"
    assert "    holdSlackMs: 300\n" in cfg
    path = tmp_path_factory.mktemp("cfg") / "harm.yaml"
    path.write_text(cfg.replace("    holdSlackMs: 300\n", pinned))
    return path


LIMIT = 200     # requests per run: enough for queues at 90% load, few enough for the oracle's replays
PARTS_LIMIT = 60    # the parts only need to decide differently: the first requests do (a twelfth of the cost)


@functools.cache    # the runs are deterministic and only read: each one once per module
def _run(config: str, true_harm: str, probe: int = 4, limit: int = LIMIT):
    sc = get_scenario("standard-small")
    # the plugin's wiring, with the figures quoted below: in the idealised world (no step noise, every
    # request served), where the twin's estimate and the true count can be compared decision by decision
    opts = bench.RunOptions(seed=0, limit=limit, epp_config=config, true_harm=true_harm, true_harm_probe=probe,
                            ideal=True)
    arr, cap = bench.prepare(sc, opts)
    return bench.run_one(sc, arr, cap, 0.9, "predicted", opts)


def _harm_filter(router) -> DecodeHarmFilter:
    return next(f for p in router.lifecycle.profiles for f in p.filters if isinstance(f, DecodeHarmFilter))


def test_the_filter_sees_the_requests_running_on_each_endpoint(harm_config):
    m, _, router = _run(harm_config.read_text(), "")
    f = _harm_filter(router)
    assert 0 < f.filtered < m["requests"]     # it dropped endpoints, not on every decision
    # it held some requests (holdSlackMs): each was scheduled again until placed, none was lost
    assert 0 < router.held_requests <= router.holds == f.holds
    # every request served, but those the filter refused at once (first token past maxTtftMs everywhere)
    assert m["completed"] + m["shed"] == m["requests"] and m["shed"] == f.shed <= 0.01 * m["requests"]
    # tokens were streamed to the producer (its decode state measures the pace, not the prediction),
    # at most every output token after the first chunk
    assert 0 < m["streamed_tokens"] < sum(r.output_len for r in bench.prepare(get_scenario("standard-small"),
                                                                              bench.RunOptions(limit=LIMIT))[0])


def test_true_harm_replaces_the_twins_count_which_comes_close_to_it(harm_config):
    est, _, _ = _run(harm_config.read_text(), "")
    true, _, router = _run(harm_config.read_text(), "all")
    f = _harm_filter(router)
    # the truth reaches the filter through its engine-model interface, the twin is out of the loop
    assert isinstance(f.engine_model, TrueEngine) and "assess" not in vars(f)
    # other decisions, and better ones: the truth's outcomes place and hold requests better than the
    # twin's estimate on this run (99.0% against 98.5%)
    assert true["slo_attainment"] > est["slo_attainment"]
    assert "true harm, --true-harm all, judged 4 decode steps" in router.description


def test_true_harm_parts_replace_one_term_of_the_estimate(harm_config):
    """``harm`` / ``own``: the filter's outcomes come from the truth for that part only; each run
    decides differently from the estimate and from the other."""
    runs = {part: _run(harm_config.read_text(), part, limit=PARTS_LIMIT) for part in ("", "harm", "own")}
    # what each run decided: its attainment, median TTFT and holds (all three tie on attainment here)
    assert len({(m["slo_attainment"], m["ttft_p50_ms"], r.holds) for m, _, r in runs.values()}) == 3
    for part in ("harm", "own"):
        f = _harm_filter(runs[part][2])
        assert isinstance(f.engine_model, TrueEngine) and isinstance(f.engine_model.estimate, TwinEngine)
        assert f"--true-harm {part}," in runs[part][2].description


class _Known:
    """An engine model with fixed outcomes per endpoint (the estimate, or the truth)."""

    def __init__(self, outcomes: dict) -> None:
        self.outcomes = outcomes

    def placement(self, request, endpoint, prompt, cached):
        return self.outcomes[endpoint.name]

    def outcome(self, name):
        return self.outcomes[name]


def test_true_harm_mixes_the_true_part_into_the_estimate():
    """The mixing itself: ``all`` the true outcome, ``harm`` the true harm with the estimated TTFT
    and TPOT, ``own`` the estimated harm with the true TTFT and TPOT."""
    est = _Known({"a": Outcome(3, 100.0, 10.0)})
    true = _Known({"a": Outcome(1, 900.0, 90.0)})
    for part, want in (("all", Outcome(1, 900.0, 90.0)), ("harm", Outcome(1, 100.0, 10.0)),
                       ("own", Outcome(3, 900.0, 90.0))):
        th = TrueHarm(part)
        th.outcome = true.outcome   # type: ignore[method-assign]
        assert TrueEngine(th, est).placement(None, Endpoint("a"), 10, 0) == want
    with pytest.raises(ValueError, match="part 'some'"):
        TrueHarm("some")
    with pytest.raises(ValueError, match="at least 1"):
        TrueHarm("all", probe=0)


def test_true_harm_needs_a_harm_plugin_and_a_predicted_policy(harm_config, tmp_path, capsys):
    base = ["--scenario", "standard-small", "--limit", "20", "--load", "0.5", "--out", str(tmp_path), "--no-plots",
            "--quiet", "--true-harm"]
    assert simulate_cli.main([*base, "--policies", "predicted", "--epp-config", "predicted-latency-slo"]) == 2
    assert "decode-harm-filter" in capsys.readouterr().err
    assert simulate_cli.main([*base, "--policies", "random", "--epp-config", str(harm_config)]) == 2
    assert "predicted policy" in capsys.readouterr().err
    assert simulate_cli.main([*base, "--policies", "predicted", "--epp-config", str(harm_config)]) == 0
    assert simulate_cli.main([*base, "--policies", "predicted"]) == 0    # the recommended profile has the filter
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert (meta["true_harm"], meta["true_harm_probe"]) == ("all", 4)
    assert simulate_cli.main([*base, "own", "--true-harm-probe", "16", "--policies", "predicted"]) == 0
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert (meta["true_harm"], meta["true_harm_probe"]) == ("own", 16)
    assert simulate_cli.main([*base[:-1], "--true-harm-probe", "16", "--policies", "predicted"]) == 2
    assert "goes with --true-harm" in capsys.readouterr().err
    assert simulate_cli.main([*base, "--true-harm-probe", "0", "--policies", "predicted"]) == 2
    assert "at least 1" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="outside a scheduling decision"):
        TrueHarm().outcome("e0")
