"""Read-only answers of the training server about its models and data (the GET endpoints
``/model/download/info``, ``/models/list``, ``/model/{name}/info``, ``/model/*/xgb/json``
and ``/data/status``), as functions of the running :class:`~training_server.service.TrainingService`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from features.matrix import TARGETS
from features.render import rfc3339

from .bodies import HTTPProblem

if TYPE_CHECKING:
    from .service import TrainingService


def model_status(svc: TrainingService) -> dict[str, bool]:
    b = svc.registry.served
    return {t: b.has_model(t) for t in TARGETS}


def download_info(svc: TrainingService) -> dict:
    b = svc.registry.served
    return {"model_type": svc.settings.model_type if b.source == "prior" else b.model_kind,
            "objective_type": b.objective, "model_status": model_status(svc), "quantile": b.quantile,
            "model_version": b.version, "model_source": b.source}


def model_info(svc: TrainingService, name: str) -> dict:
    if name not in TARGETS:
        raise HTTPProblem(404, f"unknown model {name!r}; known: {list(TARGETS)}")
    b = svc.registry.served
    m = b.manifest
    spec = m.models.get(name)
    names, scores, cal, training = (m.feature_names(name), m.scores(name), m.calibration_of(name),
                                    (m.training or {}).get(name))
    return {"name": name, "exists": name in m.learned_targets, "model_version": b.version, "model_source": b.source,
            "model_type": b.model_kind, "objective_type": b.objective, "quantile": b.quantile,
            "file": None if spec is None else {"file": spec.file, "format": spec.format, "size": spec.size,
                                               "sha256": spec.sha256},
            "features": None if names is None else list(names),
            "metrics": None if scores is None else scores.to_json(),
            "calibration": None if cal is None else cal.to_json(),
            "training": None if training is None else training.to_json(),
            "last_model_load": rfc3339(b.loaded_at)}


def models_list(svc: TrainingService) -> dict:
    return {"models": [model_info(svc, t) for t in TARGETS], "served_version": svc.registry.served.version,
            "bundles": svc.registry.versions()}


def xgb_json(svc: TrainingService, target: str) -> bytes:
    b = svc.registry.served
    if b.model_kind != "xgboost" or target not in b.manifest.models:
        raise HTTPProblem(404, f"no XGBoost {target} model is served (model_kind={b.model_kind})")
    key = (b.version, target)
    cached = svc.xgb_json_cache.get(key)
    if cached is None:
        import xgboost as xgb

        spec = b.manifest.models[target]
        data = svc.registry.served_files().get(spec.file)
        if data is None:
            raise HTTPProblem(404, f"{target} model file not available")
        booster = xgb.Booster(params={"nthread": 1})
        booster.load_model(bytearray(data))
        cached = bytes(booster.save_raw("json"))
        svc.xgb_json_cache = {key: cached, **{k: v for k, v in svc.xgb_json_cache.items()
                                              if k[0] == b.version}}
    return cached


def data_status(svc: TrainingService) -> dict:
    w = svc.worker
    counts = svc.store.target_counts()
    return {"stored_rows": svc.store.rows, "max_stored_samples": svc.settings.max_stored_samples,
            "rows_with_target": counts, "strata": len(svc.store.strata_counts()),
            "queue_depth": svc.store.queue_depth, "queue_size": svc.settings.ingest_queue_size,
            "inserted_since_start": svc.store.inserted_total, "evicted_since_start": svc.store.evicted_total,
            "last_row_id": svc.store.last_id,
            "new_samples_since_last_training": None if w is None else w.new_samples,
            "min_samples_for_retrain": svc.settings.min_samples_for_retrain,
            "retrain_cycles": None if w is None else w.cycles,
            "retrain_failures": None if w is None else w.failures,
            "last_retrain": None if w is None or w.last is None else
            {"outcome": w.last.outcome, "reason": w.last.reason, "version": w.last.version,
             "seconds": round(w.last.seconds, 3)},
            "served_version": svc.registry.served.version, "model_source": svc.registry.served.source}
