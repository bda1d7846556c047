"""The typed manifest: exact JSON round trip (disk and wire), validation on parse, frozen values,
the one builder, and coverage in percent everywhere."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from features.bundle import MANIFEST, BundleError, make_version, read_bundle
from features.loaded import LoadedBundle
from features.manifest import Manifest, build_manifest
from features.matrix import REGIME_NAMES, TARGETS
from features.prior import DEFAULT_PRIOR
from features.scoring import evaluate_bundle
from load.data import SHAREGPT
from load.demo_bundle import build_bundle
from training_server import evaluate, trainer

LINEAGE = {"id": "5f0c2a9e4b7d41c8", "created_at": 1796212345.25}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return build_bundle(tmp_path_factory.mktemp("demo"), 3, "xgboost", lineage=LINEAGE,
                        calibration={"ttft": {"offset_ms": 5.0, "by_regime": {"queued_highkv": {"scale": 1.5}}}})


@pytest.fixture(scope="module")
def trained():
    tr = evaluate.read_trace(SHAREGPT)
    cfg = trainer.TrainConfig(params={"n_estimators": 30})
    result = trainer.train_models(tr.raw[:1500], tr.ttft[:1500], tr.tpot[:1500], config=cfg)
    bundle = trainer.loaded_bundle(result)
    scores = evaluate_bundle(bundle, tr.raw[1500:2500], tr.ttft[1500:2500], tr.tpot[1500:2500])
    return trainer.build_bundle(result, make_version(9), metrics=scores, training={"ttft": {"n_test": 7}},
                                extra={"trained_on": {"max_row_id": 1500, "stored_rows": 1500}})


def test_a_bundle_on_disk_round_trips_exactly(demo_dir):
    raw = json.loads((demo_dir / MANIFEST).read_bytes())
    m = Manifest.from_json(raw)
    assert m.to_json() == raw
    assert json.dumps(m.to_json(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    # typed readers, no dict chains
    assert m.lineage is not None and m.lineage.id == LINEAGE["id"]
    cal = m.calibration_of("ttft")
    assert cal is not None and (cal.offset, cal.factor, cal.live) == (5.0, 1.0, 1.0)
    assert cal.by_regime is not None and cal.by_regime["queued_highkv"].scale == 1.5
    assert cal.by_regime["queued_highkv"].offset_ms is None  # falls back to the global offset
    assert m.calibration_of("tpot") is None and m.targets == TARGETS
    assert m.feature_names("ttft") == tuple(raw["features"]["features"]["ttft"])
    assert m.residual_std("tpot") == raw["metrics"]["tpot"]["residual_std"] > 0
    assert m.model_bytes == sum(p.stat().st_size for p in demo_dir.iterdir() if p.name != MANIFEST)


def test_a_trained_manifest_round_trips_through_the_wire_form(trained):
    manifest, files = trained
    wire = json.loads(json.dumps(manifest.to_json()))  # what /v1/bundles/latest sends
    again = Manifest.from_json(wire)
    assert again == manifest and again.to_json() == wire
    assert manifest.trained_max_row_id == 1500
    assert manifest.n_train("ttft") == wire["training"]["ttft"]["n_train"] > 100
    assert manifest.training is not None and manifest.training["ttft"].n_test == 7
    assert manifest.recipe is not None and manifest.recipe["name"] == "default"
    assert set(manifest.base or {}) == set(manifest.models)
    cal = manifest.calibration_of("ttft")
    assert cal is not None and cal.n_calibration and cal.n_calibration > 0
    s = manifest.scores("ttft")
    assert s is not None and s.by_regime is not None and set(s.by_regime) <= set(REGIME_NAMES)
    assert {spec.file for spec in manifest.models.values()} == set(files)


def test_coverage_is_a_percentage_in_every_builder(demo_dir, trained):
    demo = Manifest.from_json(json.loads((demo_dir / MANIFEST).read_bytes()))
    for m in (demo, trained[0]):
        for t in TARGETS:
            s = m.scores(t)
            assert s is not None and s.coverage is not None
            assert 50.0 < s.coverage <= 100.0, (t, s.coverage)  # a p90 model covers most actuals


def test_unknown_keys_and_nulls_are_kept():
    raw = json.loads(json.dumps(build_manifest(
        version=make_version(1), model_kind="prior", quantile=0.9, mode="streaming", models={}, files={},
        prior=DEFAULT_PRIOR).to_json()))
    raw["from_a_newer_trainer"] = {"x": [1, 2.5, None]}
    raw["seeded_from"] = {"version": make_version(7), "lineage": None}
    raw["calibration"] = {"tpot": {"scale": 1.2, "note": "kept"}}
    m = Manifest.from_json(raw)
    assert m.to_json() == raw
    assert m.seeded_from is not None and m.seeded_from.lineage is None
    assert m.extra["from_a_newer_trainer"]["x"] == (1, 2.5, None)


def test_a_seed_path_written_by_older_versions_is_dropped():
    raw = build_manifest(version=make_version(1), model_kind="prior", quantile=0.9, mode="streaming", models={},
                         files={}, prior=DEFAULT_PRIOR).to_json()
    raw["seeded_from"] = {"version": make_version(5), "path": "/home/someone/seed"}
    assert Manifest.from_json(raw).to_json()["seeded_from"] == {"version": make_version(5)}


@pytest.mark.parametrize("change,needle", [
    ({"metrics": {"ttft": {"residual_std": -1.0}}}, "metrics.ttft.residual_std"),
    ({"lineage": {"id": "5f0c2a9e", "created_at": time.time() + 7 * 86400}}, "lineage.created_at"),
    ({"calibration": {"ttft": {"scale": 0.0}}}, "calibration.ttft.scale"),
    ({"base": {"ttft": {"intercept": 1.0, "coef": {"num_request_waiting": -1.0}, "link": "add"}}},
     "base.ttft.coef"),
    ({"metrics": {"ttft": 3}}, "Scores"),
])
def test_from_json_validates(trained, change, needle):
    raw = {**trained[0].to_json(), **change}
    with pytest.raises(BundleError, match=needle.replace(".", r"\.")):
        Manifest.from_json(raw)
    with pytest.raises(BundleError):
        trained[0].updated(**change)


def test_manifests_are_frozen_and_updated_makes_a_new_one(trained):
    m = trained[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.version = make_version(10)  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.models["ttft"] = m.models["tpot"]  # type: ignore[index]
    with pytest.raises(TypeError):
        m.prior["ttft"].coef["num_request_waiting"] = 0.0  # type: ignore[index]
    newer = m.updated(version=make_version(10), trained_on=None, lineage=LINEAGE)
    assert newer.version == make_version(10) and newer.trained_on is None and newer.lineage is not None
    assert "trained_on" not in newer.to_json() and m.trained_max_row_id == 1500  # the original is unchanged


def test_the_builder_fills_sizes_and_digests_and_the_bundle_loads(tmp_path, trained):
    manifest, files = trained
    for spec in manifest.models.values():
        assert spec.size == len(files[spec.file]) and len(spec.sha256) == 64
    bundle = LoadedBundle.from_files(manifest, files)
    assert bundle.manifest is manifest and bundle.source == "learned"
    raw_rows = np.array(evaluate.read_trace(SHAREGPT).raw[:20])
    from features.bundle import write_bundle
    disk = LoadedBundle.from_files(*read_bundle(write_bundle(tmp_path, manifest.to_json(), files)))
    assert disk.manifest == manifest
    for a, b in zip(disk.predict(raw_rows), bundle.predict(raw_rows)):
        np.testing.assert_array_equal(a, b)


def test_the_builtin_prior_has_a_typed_manifest():
    b = LoadedBundle.builtin_prior(0.8)
    assert b.manifest.version == "prior-default" and b.manifest.quantile == 0.8 and not b.manifest.models
    assert b.manifest.prior_json() == DEFAULT_PRIOR and b.manifest.trained_max_row_id == 0


def _base_only(manifest: Manifest, target: str, link: str = "add") -> dict:
    """The manifest's JSON with ``target`` answered by its base alone (no model file)."""
    obj = json.loads(json.dumps(manifest.to_json()))
    obj["models"].pop(target)
    obj["base"][target] = {**obj["prior"][target], "link": link,
                           "upper": {n: 1.0 for n in obj["prior"][target]["coef"]}}
    obj["calibration"][target] = {"scale": 1.25}
    return obj


def test_a_target_answered_by_its_base_alone(trained):
    manifest, files = trained
    m = Manifest.from_json(_base_only(manifest, "tpot"))
    assert m.targets == ("ttft",) and m.learned_targets == ("ttft", "tpot") and m.base_only("tpot")
    assert not m.base_only("ttft") and Manifest.from_json(m.to_json()) == m
    bundle = LoadedBundle.from_files(m, {k: v for k, v in files.items() if k.startswith("ttft")})
    assert bundle.source == "learned" and bundle.has_model("tpot")
    raw_rows = evaluate.read_trace(SHAREGPT).raw[:50]
    from features.matrix import model_matrix
    b = m.base["tpot"]
    x = model_matrix(raw_rows, "tpot", m.feature_names("tpot"))
    names = m.feature_names("tpot")
    want = (b.intercept + sum(x[:, names.index(n)] * w for n, w in b.coef.items())) * 1.25
    np.testing.assert_allclose(bundle.predict(raw_rows)[1], want)
    # the trees' target is unchanged
    full = LoadedBundle.from_files(manifest, files)
    np.testing.assert_array_equal(bundle.predict(raw_rows)[0], full.predict(raw_rows)[0])
    # every target by its base alone: a learned bundle without model files
    alone = Manifest.from_json(_base_only(Manifest.from_json(_base_only(manifest, "tpot")), "ttft"))
    assert not alone.models and LoadedBundle.from_files(alone, {}).source == "learned"


def test_a_base_alone_must_add_and_a_learned_bundle_needs_a_model_or_a_base(trained):
    manifest, _ = trained
    with pytest.raises(BundleError, match=r"base\.tpot: a target without a model needs link 'add'"):
        Manifest.from_json(_base_only(manifest, "tpot", link="beyond"))
    obj = _base_only(manifest, "tpot")
    obj["models"] = {}
    obj.pop("base")
    with pytest.raises(BundleError, match="models is empty for a learned bundle"):
        Manifest.from_json(obj)
