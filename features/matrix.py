"""The one feature-matrix builder, shared by training and serving.

Input: a raw matrix (rows × ``RAW_COLUMNS``, float64) as produced by
:func:`features.schema.parse_row` or read back from the sample store. Output: the model
input for one target, columns in the fixed order of ``FEATURES[target]``.
Each derived feature is one vectorised numpy expression defined once here, with the
monotone direction physics demands (used as a model constraint and by property tests).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .schema import COL, RAW_COLUMNS, SCHEMA_VERSION, parse_row

TARGETS = ("ttft", "tpot")

_KV = COL["kv_cache_percentage"]
_IN = COL["input_token_length"]
_WAIT = COL["num_request_waiting"]
_RUN = COL["num_request_running"]
_GEN = COL["num_tokens_generated"]
_PFX = COL["prefix_cache_score"]
_POD = COL["pod_type"]
_PTOK = COL["prefill_tokens_in_flight"]
_DTOK = COL["decode_tokens_in_flight"]
_ENC = COL["encoder_input_size"]
_ENCM = COL["encoder_matched_size"]


@dataclass(frozen=True)
class Feature:
    name: str
    fn: Callable[[np.ndarray], np.ndarray]
    #: monotone direction per target: +1 non-decreasing, -1 non-increasing, 0 free.
    monotone: dict


def _col(i: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda r: r[:, i]


def _uncached(r: np.ndarray) -> np.ndarray:
    return (1.0 - r[:, _PFX]) * r[:, _IN]


def _prefix_quartile(r: np.ndarray) -> np.ndarray:
    # 0..3; upstream's bucketing of the prefix score
    return np.minimum(np.floor(r[:, _PFX] * 4.0), 3.0)


def _queued_prefill(r: np.ndarray) -> np.ndarray:
    # prompt work ahead of this request plus its own uncached prompt (tokens)
    return r[:, _PTOK] + _uncached(r)


_ALL: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature("kv_cache_percentage", _col(_KV), {"ttft": 1, "tpot": 1}),
        Feature("input_token_length", _col(_IN), {"ttft": 1, "tpot": 0}),  # a longer prompt never prefills faster
        Feature("num_request_waiting", _col(_WAIT), {"ttft": 1, "tpot": 0}),
        Feature("num_request_running", _col(_RUN), {"ttft": 0, "tpot": 1}),
        Feature("is_queued", lambda r: (r[:, _WAIT] > 0).astype(np.float64), {"ttft": 1, "tpot": 0}),
        Feature("prefill_tokens_in_flight", _col(_PTOK), {"ttft": 1, "tpot": 0}),
        Feature("decode_tokens_in_flight", _col(_DTOK), {"ttft": 0, "tpot": 1}),
        Feature("encoder_input_size", _col(_ENC), {"ttft": 0, "tpot": 0}),
        Feature("encoder_uncached_size", lambda r: r[:, _ENC] - r[:, _ENCM], {"ttft": 0, "tpot": 0}),
        Feature("pod_type", _col(_POD), {"ttft": 0, "tpot": 0}),
        Feature("prefix_cache_score", _col(_PFX), {"ttft": -1, "tpot": 0}),
        Feature("uncached_input_tokens", _uncached, {"ttft": 1, "tpot": 0}),
        Feature("prefix_quartile", _prefix_quartile, {"ttft": -1, "tpot": 0}),
        Feature("queued_prefill_tokens", _queued_prefill, {"ttft": 1, "tpot": 0}),
        Feature("num_tokens_generated", _col(_GEN), {"ttft": 0, "tpot": 0}),
    )
}

#: Model input columns per target, in order. Changing these bumps SCHEMA_VERSION.
FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": (
        "kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
        "is_queued", "prefill_tokens_in_flight", "decode_tokens_in_flight", "encoder_input_size",
        "encoder_uncached_size", "pod_type", "prefix_cache_score", "uncached_input_tokens",
        "prefix_quartile", "queued_prefill_tokens",
    ),
    "tpot": (
        "kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
        "is_queued", "prefill_tokens_in_flight", "decode_tokens_in_flight", "encoder_input_size",
        "pod_type", "num_tokens_generated",
    ),
}

#: The upstream llm-d recipe's feature set (docs/evaluation.md §1 reference), for comparisons.
UPSTREAM_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
             "is_queued", "prefill_tokens_in_flight", "decode_tokens_in_flight", "prefix_cache_score",
             "uncached_input_tokens", "prefix_quartile"),
    "tpot": ("kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
             "is_queued", "prefill_tokens_in_flight", "decode_tokens_in_flight", "num_tokens_generated"),
}
FEATURE_SETS = {"default": FEATURES, "upstream": UPSTREAM_FEATURES}
KNOWN_FEATURES = frozenset(_ALL)

#: Known schema versions this code can build matrices for.
SUPPORTED_SCHEMAS = frozenset({SCHEMA_VERSION})


def feature_names(target: str) -> tuple[str, ...]:
    return FEATURES[target]


def monotone_constraints(target: str, names: Sequence[str] | None = None) -> tuple[int, ...]:
    """Per-column monotone direction for ``target`` (XGBoost/LightGBM constraint order)."""
    return tuple(_ALL[name].monotone[target] for name in (names or FEATURES[target]))


def model_matrix(raw: np.ndarray, target: str, names: Sequence[str] | None = None) -> np.ndarray:
    """Build the model input for ``target`` from a raw matrix (rows × RAW_COLUMNS).

    ``names`` selects the columns (default ``FEATURES[target]``); a bundle records the
    names it was trained with and the runtime passes them back here.
    """
    if raw.ndim != 2 or raw.shape[1] != len(RAW_COLUMNS):
        raise ValueError(f"raw matrix must have shape (n, {len(RAW_COLUMNS)}), got {raw.shape}")
    names = names or FEATURES[target]
    out = np.empty((raw.shape[0], len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        out[:, j] = _ALL[name].fn(raw)
    return out


def raw_matrix(rows: Sequence[dict], field: str = "requests") -> np.ndarray:
    """Validate decoded JSON rows into a raw matrix; FieldError names ``field[i].name``."""
    return np.array([parse_row(r, (field, i)) for i, r in enumerate(rows)], dtype=np.float64).reshape(
        len(rows), len(RAW_COLUMNS)
    )


def schema_description(feature_set: str = "default") -> dict:
    """What a bundle records about the features it was trained with."""
    sets = FEATURE_SETS[feature_set]
    return {
        "schema_version": SCHEMA_VERSION,
        "feature_set": feature_set,
        "raw_columns": list(RAW_COLUMNS),
        "features": {t: list(sets[t]) for t in TARGETS},
    }


#: Load regimes for calibration and reporting (docs/evaluation.md §1): queue empty/queued × KV below/above 80%.
REGIME_NAMES = ("idle_lowkv", "queued_lowkv", "idle_highkv", "queued_highkv")
HIGH_KV = 0.8


def regimes(raw: np.ndarray) -> np.ndarray:
    """Regime index (into REGIME_NAMES) of each raw row."""
    return (raw[:, _WAIT] > 0).astype(np.int64) + 2 * (raw[:, _KV] > HIGH_KV).astype(np.int64)
