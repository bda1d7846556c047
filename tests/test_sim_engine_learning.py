"""The engine twin learns a foreign engine through the product's learning path in the simulator:
the recommended profile's decode-harm-filter reports its step sums with each TTFT entry, the
in-process training service (the training server's own) fits and publishes the engine section,
and the filter steps each endpoint with it. On ``--engine slow`` (every step twice as slow as the
twin's prior) the twin's TTFT error for the chosen endpoint falls within 15% over the second half
of the run; with ``learnEngine: false`` it stays about 2x off (the witness).

The idealised world (``--ideal``) isolates the step model: under the realism defaults the router
sees prompt lengths through the gateway's estimate (log-sd 0.25) and stale scrapes, and the
twin's error has a floor of about 25% that a twin told the true coefficients has too
(docs/evaluation.md §4, "Foreign engines")."""
from __future__ import annotations

import yaml

from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.profiles import config_text
from load.sim import bench, engines
from load.sim.scenarios import get_scenario


def _config(**params) -> str:
    cfg = yaml.safe_load(config_text("predicted-latency-recommended"))
    plugin = next(p for p in cfg["plugins"] if p["type"] == "decode-harm-filter")
    plugin.setdefault("parameters", {}).update(params)
    return yaml.safe_dump(cfg)


def _run(learn: bool, limit: int | None = None) -> tuple[dict, DecodeHarmFilter]:
    sc = engines.apply(get_scenario("standard-small"), "slow")
    opts = bench.RunOptions(seed=0, ideal=True, epp_config=_config(learnEngine=learn), limit=limit)
    arr, cap = bench.prepare(sc, opts)
    m, _, router = bench.run_one(sc, arr, cap, 0.8, "predicted", opts)
    f = next(x for p in router.lifecycle.profiles for x in p.filters if isinstance(x, DecodeHarmFilter))
    return m, f


def test_the_twin_learns_a_slow_engine_from_the_prior():
    m, f = _run(True)
    assert m["twin_ttft_n"] > 600
    assert m["twin_ttft_error_last_half"] <= 0.15, m["twin_ttft_error_last_half"]
    learned = f.step_models.learned
    assert learned is not None and set(learned.classes) == {"default"}
    # the speeds are relative to the class (geometric mean 1): the coefficients took the 2x
    coef, speeds = learned.classes["default"]
    assert len(speeds) == 4 and all(0.8 < s < 1.25 for s in speeds.values())
    prior = f.step_model
    assert coef["per_token_ms"] / prior.per_token_ms > 1.6


def test_without_learning_the_twin_stays_on_its_prior():
    m, f = _run(False, limit=300)     # the prior is 2x off from the first request: a short run shows it
    assert f.step_models.learned is None
    assert m["twin_ttft_error_last_half"] > 0.4
