"""The one feature-matrix builder, shared by training and serving.

Input: a raw matrix (rows × ``RAW_COLUMNS``, float64) as produced by
:func:`features.schema.parse_row` or read back from the sample store. Output: the model
input for one target, columns in the fixed order of ``FEATURES[target]``.
Each derived feature is one vectorised numpy expression defined once here, with the
monotone direction physics demands (used as a model constraint and by property tests).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .schema import COL, RAW_COLUMNS, RAW_COLUMNS_V1, SCHEMA_VERSION, parse_row

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
_PREQ = COL["prefill_requests_in_flight"]
_HEAD = COL["queue_head_wait_ms"]
_DCTX = COL["decode_context_tokens"]


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
        # NaN (unknown) when the row does not carry them: the trees' missing value
        Feature("prefill_requests_in_flight", _col(_PREQ), {"ttft": 1, "tpot": 0}),
        Feature("queue_head_wait_ms", _col(_HEAD), {"ttft": 0, "tpot": 0}),
        Feature("decode_context_tokens", _col(_DCTX), {"ttft": 1, "tpot": 1}),
    )
}

#: Schema 1's model input columns per target (what a schema-1 bundle without feature names used).
FEATURES_V1: dict[str, tuple[str, ...]] = {
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
#: The router's queue fields (``features.schema.QUEUE_FIELDS``) as model columns, per target.
#: TPOT takes the decode context alone: with the two prefill-queue columns as well its forward
#: pinball on sim-sessions and sim-ramp was 0.7-1.8% worse than without any queue column.
QUEUE_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("prefill_requests_in_flight", "queue_head_wait_ms", "decode_context_tokens"),
    "tpot": ("decode_context_tokens",),
}
#: Model input columns per target, in order. Changing these bumps SCHEMA_VERSION. The trainer
#: leaves out a queue column no training row carries (``known_features``).
FEATURES: dict[str, tuple[str, ...]] = {t: (*FEATURES_V1[t], *QUEUE_FEATURES[t]) for t in FEATURES_V1}

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

#: Known schema versions this code can build matrices for (schema 1: the raw columns before
#: the queue fields; its features are computed from today's raw matrix by name).
SUPPORTED_SCHEMAS = frozenset({1, SCHEMA_VERSION})


def feature_names(target: str) -> tuple[str, ...]:
    return FEATURES[target]


def monotone_constraints(target: str, names: Sequence[str] | None = None) -> tuple[int, ...]:
    """Per-column monotone direction for ``target`` (XGBoost/LightGBM constraint order)."""
    return tuple(_ALL[name].monotone[target] for name in (names or FEATURES[target]))


#: Least share of training rows that must carry a column that may be unknown for a model to
#: use it. Trees trained on rows half of which carry the queue fields did worse than without
#: them (sim-ramp forward TTFT pinball 760 ms, 739 without, 730 with them on every row).
MIN_KNOWN_SHARE = 0.9


def known_features(raw: np.ndarray, target: str, names: Sequence[str] | None = None) -> tuple[str, ...]:
    """``names`` (default ``FEATURES[target]``) without the columns unknown (NaN) in more than
    1 - ``MIN_KNOWN_SHARE`` of the rows of ``raw``: a model trained on rows that do not carry
    the queue fields (or rarely do) has schema 1's columns (``FEATURES_V1``)."""
    names = tuple(names or FEATURES[target])
    if not len(raw):
        return names
    x = model_matrix(raw, target, names)
    return tuple(n for j, n in enumerate(names) if np.mean(~np.isnan(x[:, j])) >= MIN_KNOWN_SHARE)


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


def schema_description(feature_set: str = "default", names: Mapping[str, Sequence[str]] | None = None) -> dict:
    """What a bundle records about the features it was trained with (``names``: the columns
    used per target, default the feature set's)."""
    sets = FEATURE_SETS[feature_set]
    features = {t: list((names or {}).get(t) or sets[t]) for t in TARGETS}
    # a model without a queue column is a schema-1 model: servers of either schema serve it
    v1 = not any(set(features[t]) & set(QUEUE_FEATURES[t]) for t in TARGETS)
    return {
        "schema_version": 1 if v1 else SCHEMA_VERSION,
        "feature_set": feature_set,
        "raw_columns": list(RAW_COLUMNS_V1 if v1 else RAW_COLUMNS),
        "features": features,
    }


#: Load regimes for calibration and reporting (docs/evaluation.md §1): queue empty/queued × KV below/above 80%.
REGIME_NAMES = ("idle_lowkv", "queued_lowkv", "idle_highkv", "queued_highkv")
HIGH_KV = 0.8


def regimes(raw: np.ndarray) -> np.ndarray:
    """Regime index (into REGIME_NAMES) of each raw row."""
    return (raw[:, _WAIT] > 0).astype(np.int64) + 2 * (raw[:, _KV] > HIGH_KV).astype(np.int64)
