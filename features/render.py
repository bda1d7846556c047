"""The prediction object of the wire API (docs/wire-api.md §1.2 ``p``), rendered once for
both servers: the prediction server's bulk answers and the training server's ``/predict``.

The fields that do not depend on the row (uncertainty, model type, version...) are computed
once per served bundle (:meth:`PredictionFields.of`); :meth:`PredictionFields.render` turns
arrays of TTFT/TPOT predictions into prediction objects on the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from .loaded import LoadedBundle
from .manifest import thaw


def rfc3339(ts: float) -> str:
    """``ts`` (seconds since the epoch) as an RFC 3339 UTC time with milliseconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class PredictionFields:
    """A bundle's constant prediction-object fields, precomputed."""

    model_type: str
    last_model_load: str
    #: constant trailing fields of a prediction object, in wire order
    const: tuple
    ttft_u: float
    tpot_u: float
    ttft_w: float  # z * uncertainty
    tpot_w: float

    @classmethod
    def of(cls, bundle: LoadedBundle) -> PredictionFields:
        model_type = bundle.model_kind if bundle.source == "learned" else "prior"
        last = rfc3339(bundle.loaded_at)
        ut, up = float(bundle.uncertainty("ttft")), float(bundle.uncertainty("tpot"))
        z = float(bundle.bound_width)
        const = (("model_type", model_type), ("objective_type", bundle.objective),
                 ("quantile", float(bundle.quantile)), ("last_model_load", last),
                 ("model_version", bundle.version), ("model_source", bundle.source))
        return cls(model_type, last, const, ut, up, z * ut, z * up)

    def render(self, ttft: np.ndarray, tpot: np.ndarray, predicted_at: str) -> list[dict]:
        """Prediction objects for arrays of predictions (one per row)."""
        t = ttft.tolist()
        p = tpot.tolist()
        t_lo = np.maximum(ttft - self.ttft_w, 0.0).tolist() if self.ttft_w else t
        t_hi = (ttft + self.ttft_w).tolist() if self.ttft_w else t
        p_lo = np.maximum(tpot - self.tpot_w, 0.0).tolist() if self.tpot_w else p
        p_hi = (tpot + self.tpot_w).tolist() if self.tpot_w else p
        ut, up = self.ttft_u, self.tpot_u
        (k0, mt), (k1, ob), (k2, q), (k3, lml), (k4, mv), (k5, ms) = self.const
        return [
            {"ttft_ms": a, "tpot_ms": b, "ttft_uncertainty": ut, "tpot_uncertainty": up,
             "ttft_prediction_bounds": [alo, ahi], "tpot_prediction_bounds": [blo, bhi],
             "predicted_at": predicted_at, k0: mt, k1: ob, k2: q, k3: lml, k4: mv, k5: ms}
            for a, b, alo, ahi, blo, bhi in zip(t, p, t_lo, t_hi, p_lo, p_hi)
        ]


def engine_document(bundle: LoadedBundle) -> tuple[int, dict]:
    """``GET /v1/engine`` of both servers: the served bundle's learned engine step model
    (manifest ``engine``, features.bundle.validate_engine) with its version (200), or 404 with
    the reason none is served yet."""
    engine = bundle.manifest.engine
    if engine is None:
        why = ("no learned bundle is served yet" if bundle.source != "learned" else
               f"bundle {bundle.version} has no engine section: no endpoint class has enough TTFT entries with "
               "the engine fields yet")
        return 404, {"detail": f"no engine step model learned: {why}"}
    return 200, {"model_version": bundle.version, "model_source": bundle.source, "engine": thaw(engine)}
