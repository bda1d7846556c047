"""Shape constraints of the *served* model: along each constrained wire field, from random
base points, predictions never fall (TTFT: queue, input tokens, KV use, prefill tokens in
flight; never rise with the prefix score; TPOT: running requests, KV use, decode tokens in
flight). The model is trained with the server's default config on a real trace, written as
a bundle, read back and loaded by the same LoadedBundle the prediction server uses; the
calibration in its manifest (global and per regime) is part of what is checked."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from features.bundle import make_version, read_bundle, write_bundle
from features.matrix import REGIME_NAMES
from features.schema import COL, RAW_COLUMNS
from features.loaded import LoadedBundle
from training_server import calibration, trainer
from training_server.service import TrainingService
from training_server.evaluate import read_trace
from training_server.settings import Settings

from conftest import SHAREGPT

# (target index in predict(), raw column, direction, value range)
CONSTRAINED = [
    (0, "num_request_waiting", +1, (0, 64)),
    (0, "input_token_length", +1, (0, 32_000)),
    (0, "kv_cache_percentage", +1, (0.0, 1.0)),
    (0, "prefill_tokens_in_flight", +1, (0, 200_000)),
    (0, "prefix_cache_score", -1, (0.0, 1.0)),
    (1, "num_request_running", +1, (0, 512)),
    (1, "kv_cache_percentage", +1, (0.0, 1.0)),
    (1, "decode_tokens_in_flight", +1, (0, 1_000_000)),
]


def _served_bundle(tmp_path, raw, ttft, tpot) -> LoadedBundle:
    cfg = TrainingService(Settings(data_dir=tmp_path)).train_config  # what the server trains with
    result = trainer.train_models(raw, ttft, tpot, config=cfg)
    manifest, files = trainer.build_bundle(result, make_version(1))
    path = write_bundle(tmp_path / "bundles", manifest.to_json(), files)
    return LoadedBundle.from_files(*read_bundle(path))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tr = read_trace(SHAREGPT)
    raw, ttft, tpot = tr.raw.copy(), tr.ttft, tr.tpot
    # add the regimes the H200 trace lacks (KV above 80%, long queues): same rows with the
    # load columns moved up and latencies that grow with them, so every regime is calibrated
    rng = np.random.default_rng(0)
    hi = raw.copy()
    hi[:, COL["kv_cache_percentage"]] = rng.uniform(0.8, 1.0, len(hi))
    hi[:, COL["num_request_waiting"]] = rng.integers(0, 20, len(hi))
    factor = 1.0 + hi[:, COL["num_request_waiting"]] / 5.0
    raw = np.vstack([raw, hi])
    ttft = np.concatenate([ttft, ttft * factor])
    tpot = np.concatenate([tpot, tpot * 1.3])
    # interleaved in time: the newest rows (the conformal calibration rows) span every regime
    order = rng.permutation(len(raw))
    raw, ttft, tpot = raw[order], ttft[order], tpot[order]
    bundle = _served_bundle(tmp_path_factory.mktemp("mono"), raw, ttft, tpot)
    assert bundle.source == "learned" and bundle.has_model("ttft") and bundle.has_model("tpot")
    return bundle


base_points = st.fixed_dictionaries({
    "kv_cache_percentage": st.floats(0.0, 1.0),
    "input_token_length": st.integers(0, 32_000),
    "num_request_waiting": st.integers(0, 64),
    "num_request_running": st.integers(0, 512),
    "num_tokens_generated": st.integers(0, 4_000),
    "prefix_cache_score": st.floats(0.0, 1.0),
    "prefill_tokens_in_flight": st.integers(0, 200_000),
    "decode_tokens_in_flight": st.integers(0, 1_000_000),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=base_points)
def test_served_model_is_monotone_along_each_constrained_field(served, base):
    row = np.zeros(len(RAW_COLUMNS))
    for name, v in base.items():
        row[COL[name]] = v
    for target, name, direction, (lo, hi) in CONSTRAINED:
        grid = np.unique(np.concatenate([np.linspace(lo, hi, 41), [row[COL[name]]],
                                         [0.79, 0.8, 0.81] if hi == 1.0 else [0, 1, 2]]))
        grid = grid[(grid >= lo) & (grid <= hi)]
        raw = np.repeat(row[None, :], len(grid), axis=0)
        raw[:, COL[name]] = grid
        y = served.predict(raw)[target] * direction
        steps = np.diff(y)
        assert (steps >= -1e-6 * np.maximum(np.abs(y[:-1]), 1.0)).all(), (
            f"{('ttft', 'tpot')[target]} falls along {name} (direction {direction:+d}) at "
            f"{grid[np.argmin(steps)]}: {y[np.argmin(steps)] * direction} -> {y[np.argmin(steps) + 1] * direction}")


def test_the_checked_bundle_carries_per_regime_calibration(served):
    cal = served.manifest.to_json()["calibration"]["ttft"]
    assert set(cal["by_regime"]) == set(REGIME_NAMES)


def test_regime_offsets_are_made_monotone():
    """A queued regime whose own conformal offset came out lower than the idle one is raised."""
    rng = np.random.default_rng(1)
    resid = np.concatenate([rng.normal(50, 10, 400), rng.normal(10, 10, 400)])
    reg = np.repeat([0, 1], 400)  # idle_lowkv residuals larger than queued_lowkv ones
    spec = calibration.conformal_spec("ttft", resid, reg, 0.9)
    by = {k: v["offset_ms"] for k, v in spec["by_regime"].items()}
    own_idle = calibration.conformal_offset(resid[:400], 0.9)
    assert by["idle_lowkv"] == pytest.approx(own_idle)
    assert by["queued_lowkv"] >= by["idle_lowkv"] and by["queued_highkv"] >= by["idle_highkv"] >= by["idle_lowkv"]
    # TPOT does not constrain the queue direction: its queued offset keeps its own value
    tp = calibration.conformal_spec("tpot", resid, reg, 0.9)["by_regime"]
    assert tp["queued_lowkv"]["offset_ms"] == pytest.approx(calibration.conformal_offset(resid[400:], 0.9))
