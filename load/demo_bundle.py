"""Build real model bundles from a recorded trace, without the training server.

Used by the prediction-server tests and by ``load/bench_predict.py``: a quick XGBoost or
LightGBM quantile model per target, trained on the recorded llm-d trace shipped in
``load/data/llmd-h200-traces/`` (``load.data.SHAREGPT``) with the one feature builder
(``features.matrix.model_matrix``), saved in the library's native format and written with
``features.bundle.write_bundle``.
This is not the production trainer (that is ``training_server``); it only has to produce
genuine bundles of both kinds.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from features.bundle import make_version, write_bundle
from features.manifest import build_manifest
from features.matrix import FEATURES, TARGETS, model_matrix
from features.prior import DEFAULT_PRIOR, upper_values
from features.schema import parse_training_entry
from load.data import SHAREGPT, open_data

QUANTILE = 0.9


@functools.lru_cache(maxsize=4)
def load_trace(path: str = str(SHAREGPT)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw matrix, ttft targets, tpot targets) of a recorded trace (0 = absent)."""
    raws, ttft, tpot = [], [], []
    with open_data(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            e = parse_training_entry(json.loads(line), (i,))
            raws.append(e.raw)
            ttft.append(e.actual_ttft_ms)
            tpot.append(e.actual_tpot_ms)
    return np.array(raws, dtype=np.float64), np.array(ttft), np.array(tpot)


@functools.lru_cache(maxsize=16)
def train_files(kind: str = "xgboost", rounds: int = 40, path: str = str(SHAREGPT),
                max_depth: int = 5) -> tuple[dict, dict, dict]:
    """Train one model per target; returns (files {name: bytes}, models {target: (file, format)},
    metrics {target: {"coverage" (%), "residual_std" (ms)}})."""
    raw, ttft, tpot = load_trace(path)
    files, models, metrics = {}, {}, {}
    for target, y_all in zip(TARGETS, (ttft, tpot)):
        mask = y_all > 0
        x = model_matrix(raw[mask], target)
        y = y_all[mask]
        if kind == "xgboost":
            import xgboost as xgb

            booster = xgb.train({"objective": "reg:quantileerror", "quantile_alpha": QUANTILE, "max_depth": max_depth,
                                 "learning_rate": 0.1, "tree_method": "hist", "nthread": 1, "seed": 1},
                                xgb.DMatrix(x, label=y), num_boost_round=rounds)
            data = bytes(booster.save_raw("ubj"))
            pred = booster.inplace_predict(x)
            name, fmt = f"{target}.ubj", "xgboost-ubj"
        elif kind == "lightgbm":
            import lightgbm as lgb

            booster = lgb.train({"objective": "quantile", "alpha": QUANTILE, "num_leaves": 15, "max_depth": max_depth,
                                 "learning_rate": 0.1, "num_threads": 1, "verbose": -1, "seed": 1},
                                lgb.Dataset(x, label=y), num_boost_round=rounds)
            data = booster.model_to_string().encode()
            pred = booster.predict(x, num_threads=1)
            name, fmt = f"{target}.txt", "lightgbm-text"
        else:
            raise ValueError(f"unknown model kind {kind!r}")
        files[name] = data
        models[target] = (name, fmt)
        resid = y - np.asarray(pred)
        metrics[target] = {"coverage": float(np.mean(resid <= 0) * 100.0), "residual_std": float(np.std(resid))}
    return files, models, metrics


def demo_base(path: str = str(SHAREGPT)) -> dict:
    """A base like the trainer's (features.prior): the default prior's slopes past the largest
    values of the trace (so the served path applies it as real bundles do)."""
    raw, ttft, tpot = load_trace(path)
    out = {}
    for target, y in zip(TARGETS, (ttft, tpot)):
        x = model_matrix(raw[y > 0], target)
        out[target] = {**DEFAULT_PRIOR[target], "link": "beyond",
                       "upper": upper_values(x, FEATURES[target], DEFAULT_PRIOR[target]["coef"])}
    return out


def build_bundle(root: Path, seq: int, kind: str = "xgboost", rounds: int = 40,
                 calibration: dict | None = None, max_depth: int = 5, lineage: dict | None = None) -> Path:
    """Train (cached per kind/rounds/depth) and write bundle ``seq`` under ``root``; returns its dir.
    The training server's default recipe is 200 rounds of depth 4 (the benchmark uses that).
    ``kind="prior"`` writes a prior-only bundle (no model files); ``lineage`` is copied into
    the manifest as is."""
    files, models, metrics = ({}, {}, {}) if kind == "prior" else train_files(kind, rounds, max_depth=max_depth)
    manifest = build_manifest(
        version=make_version(seq), model_kind=kind, quantile=QUANTILE, mode="streaming", models=models, files=files,
        prior=DEFAULT_PRIOR, base={} if kind == "prior" else demo_base(),
        training={t: {"n_train": 0, "n_test": 0} for t in TARGETS}, metrics=metrics,
        calibration=calibration or None, lineage=lineage)
    return write_bundle(Path(root), manifest.to_json(), files)
