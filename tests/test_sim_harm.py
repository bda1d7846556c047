"""The harm a placement does to the requests running there, in the simulator: the decode-harm
plugins in the loop (fed by the producer's decode state, tokens streamed as a gateway does) and
``simulate --true-harm`` (the same plugins counting the simulator's true harm)."""
from __future__ import annotations

import json

import pytest

from epp_client.plugins.harm import DecodeHarmFilter
from epp_client.types import Endpoint
from epp_client.wellknown import config_text
from load import simulate_cli
from load.sim import bench
from load.sim.harm_oracle import TrueHarm
from load.sim.scenarios import get_scenario


@pytest.fixture(scope="module")
def harm_config(tmp_path_factory):
    """The recommended profile (its decode-harm-filter first, holding requests) as a file."""
    cfg = config_text("predicted-latency-recommended")
    assert "  - pluginRef: predicted-latency-producer\n  - pluginRef: decode-harm-filter\n" in cfg
    path = tmp_path_factory.mktemp("cfg") / "harm.yaml"
    path.write_text(cfg)
    return path


def _run(config: str, true_harm: str, probe: int = 4):
    sc = get_scenario("standard-small")
    # the plugin's wiring, with the figures quoted below: in the idealised world (no step noise, every
    # request served), where the twin's estimate and the true count can be compared decision by decision
    opts = bench.RunOptions(seed=0, limit=300, epp_config=config, true_harm=true_harm, true_harm_probe=probe,
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
    assert m["completed"] == m["requests"] and m["shed"] == 0
    # tokens were streamed to the producer (its decode state measures the pace, not the prediction),
    # at most every output token after the first chunk
    assert 0 < m["streamed_tokens"] < sum(r.output_len for r in bench.prepare(get_scenario("standard-small"),
                                                                              bench.RunOptions(limit=300))[0])


def test_true_harm_replaces_the_twins_count_which_comes_close_to_it(harm_config):
    est, _, _ = _run(harm_config.read_text(), "")
    true, _, router = _run(harm_config.read_text(), "all")
    assert _harm_filter(router).assess.__qualname__.startswith("TrueHarm._mixer")
    # other decisions, about as good: the engine twin's count is near the simulator's true count here
    # (82.7% against 82.0% on this run)
    assert true["slo_attainment"] != est["slo_attainment"]
    assert abs(true["slo_attainment"] - est["slo_attainment"]) < 0.03
    assert "true harm, --true-harm all, judged 4 decode steps" in router.description


def test_true_harm_parts_replace_one_term_of_the_estimate(harm_config):
    """``harm`` / ``own``: the filter's parts come from the truth for that term only; each run
    decides differently from the estimate and from the other."""
    runs = {part: _run(harm_config.read_text(), part) for part in ("", "harm", "own")}
    assert len({m["slo_attainment"] for m, _, _ in runs.values()}) == 3
    for part in ("harm", "own"):
        f = _harm_filter(runs[part][2])
        assert "assess" in vars(f)      # the estimate's terms, one swapped for the truth
        assert f"--true-harm {part}," in runs[part][2].description


def test_true_harm_mixes_the_true_term_into_the_estimate():
    """The mixing itself: the estimate's (harm, own, rest) per endpoint with the true term in its place
    (``all``: the true harm and own miss alone); the twin's outcome is kept."""
    outcome = object()
    estimate = {"a": ((3.0, 1.0, 2.0), outcome), "b": ((0.0, 0.0, 0.0), outcome)}
    true = {"a": (1, False), "b": (2, True)}
    for part, want in (("harm", {"a": (1.0, 1.0, 2.0), "b": (2.0, 0.0, 0.0)}),
                       ("own", {"a": (3.0, 0.0, 2.0), "b": (0.0, 1.0, 0.0)}),
                       ("all", {"a": (1.0, 0.0, 0.0), "b": (2.0, 1.0, 0.0)})):
        th = TrueHarm(part)
        th._true = lambda request, endpoints: {e.name: true[e.name] for e in endpoints}   # type: ignore[method-assign]
        mixed = th._mixer(lambda request, endpoints: dict(estimate))
        assert mixed(None, [Endpoint("a"), Endpoint("b")]) == {n: (terms, outcome) for n, terms in want.items()}
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
        TrueHarm()._true(None, [])
