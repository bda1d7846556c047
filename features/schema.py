"""The wire fields of a feature row and a training entry, and their validation.

This is the single definition of what a row may contain (``docs/wire-api.md`` §1.1).
Validation turns a decoded JSON object into a fixed-order list of floats (the *raw*
columns, ``RAW_COLUMNS``) and raises :class:`FieldError` naming the field at fault.
Everything downstream (the model matrix, the sample store, the prior) works on raw
columns, so training and serving can never disagree on a field's meaning.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Bumped whenever the meaning or order of raw columns or model features changes.
#: A bundle records the schema it was trained with; a server refuses unknown ones.
SCHEMA_VERSION = 1

#: Largest value accepted for integer fields (keeps float64 exact and bounds input).
MAX_INT = 2**31 - 1
#: Largest latency target accepted, in ms (one day). Larger is a client bug, not data.
MAX_LATENCY_MS = 86_400_000.0

POD_TYPES: dict[str, int] = {"": 0, "prefill": 1, "decode": 2}
POD_TYPE_NAMES: tuple[str, ...] = ("", "prefill", "decode")


class FieldError(ValueError):
    """A field failed validation. ``loc`` is a path like ``("requests", 3, "kv_cache_percentage")``."""

    def __init__(self, loc: Sequence[Any], msg: str, kind: str = "value_error") -> None:
        self.loc = tuple(loc)
        self.msg = msg
        self.kind = kind
        super().__init__(f"{'.'.join(str(p) for p in self.loc)}: {msg}")

    def to_detail(self, prefix: Sequence[Any] = ("body",)) -> dict:
        """FastAPI-style error detail entry."""
        return {"loc": [*prefix, *self.loc], "msg": self.msg, "type": self.kind}


@dataclass(frozen=True)
class WireField:
    name: str
    kind: str  # "float" | "int" | "pod_type"
    lo: float = 0.0
    hi: float | None = None
    required: bool = True
    default: float = 0.0
    doc: str = ""


#: Feature-row fields in raw-column order (``docs/wire-api.md`` §1.1).
ROW_FIELDS: tuple[WireField, ...] = (
    WireField("kv_cache_percentage", "float", 0.0, 1.0, doc="KV-cache use as a fraction in [0, 1]"),
    WireField("input_token_length", "int", 0, MAX_INT, doc="prompt tokens"),
    WireField("num_request_waiting", "int", 0, MAX_INT, doc="requests waiting in the server queue"),
    WireField("num_request_running", "int", 0, MAX_INT, doc="requests running (in flight)"),
    WireField("num_tokens_generated", "int", 0, MAX_INT, doc="tokens generated so far"),
    WireField("prefix_cache_score", "float", 0.0, 1.0, doc="share of prompt blocks cached, [0, 1]"),
    WireField("pod_type", "pod_type", required=False, doc='"" (monolithic), "prefill" or "decode"'),
    WireField("prefill_tokens_in_flight", "int", 0, MAX_INT, required=False, doc="uncached prompt tokens in flight"),
    WireField("decode_tokens_in_flight", "int", 0, MAX_INT, required=False, doc="decode tokens in flight"),
    WireField("encoder_input_size", "int", 0, MAX_INT, required=False, doc="multimodal encoder input size"),
    WireField("encoder_matched_size", "int", 0, MAX_INT, required=False,
              doc="cached part of encoder input (<= encoder_input_size)"),
)
RAW_COLUMNS: tuple[str, ...] = tuple(f.name for f in ROW_FIELDS)
COL = {name: i for i, name in enumerate(RAW_COLUMNS)}

#: Numeric targets of a training entry (0 means "not measured").
TARGET_FIELDS: tuple[WireField, ...] = (
    WireField("actual_ttft_ms", "float", 0.0, MAX_LATENCY_MS, doc="observed TTFT (E2E in E2E mode); 0 = absent"),
    WireField("actual_tpot_ms", "float", 0.0, MAX_LATENCY_MS, doc="observed TPOT; 0 = absent"),
)
#: Our extension: what was predicted for the served endpoint (live-error tracking).
PREDICTED_FIELDS: tuple[WireField, ...] = (
    WireField("predicted_ttft_ms", "float", 0.0, MAX_LATENCY_MS, required=False),
    WireField("predicted_tpot_ms", "float", 0.0, MAX_LATENCY_MS, required=False),
)
MAX_MODEL_VERSION_LEN = 128

#: Our extension: the engine twin's view of the request at dispatch on the endpoint that served
#: it (optional; an entry without them is stored and learned from as before). The twin's TTFT
#: is ``(c . F) / speed`` over these sums F of its steps until the request's first token (the
#: step model's coefficients c, in ``ENGINE_COEFFICIENTS`` order; the endpoint's speed), so the
#: training server fits c per endpoint class and a speed per endpoint from them and the
#: measured TTFT (docs/wire-api.md §1.3). All five or none, with ``engine_endpoint``.
ENGINE_FEATURE_FIELDS: tuple[WireField, ...] = (
    WireField("engine_steps", "float", 0.0, doc="the twin's engine steps until the request's first token"),
    WireField("engine_step_tokens", "float", 0.0, doc="tokens in those steps' batches, summed"),
    WireField("engine_step_context", "float", 0.0, doc="context tokens of the decodes, summed over the steps"),
    WireField("engine_decode_steps", "float", 0.0, doc="those steps with decodes in the batch"),
    WireField("engine_prefill_pairs", "float", 0.0, doc="causal token pairs of the prefill chunks, summed"),
)
#: the step model's coefficient each engine feature multiplies (``epp_client.engine.twin.StepModel``)
ENGINE_COEFFICIENTS: tuple[str, ...] = ("fixed_ms", "per_token_ms", "per_context_token_ms", "decode_ms",
                                        "per_prefill_pair_ms")
#: the twin's TTFT at dispatch for the endpoint that served the request (its live error)
ENGINE_TTFT_FIELD = WireField("engine_ttft_ms", "float", 0.0, MAX_LATENCY_MS, required=False,
                              doc="the engine twin's TTFT at dispatch, ms")
#: the measured TTFT the engine sums go with, on an entry that is not itself a TTFT sample (the
#: TPOT entry sent when the request ends, when the sums use the prompt's true length)
ENGINE_ACTUAL_TTFT_FIELD = WireField("engine_actual_ttft_ms", "float", 0.0, MAX_LATENCY_MS, required=False,
                                     doc="the request's measured TTFT the engine sums go with, ms")
#: the endpoint that served the request and its class (model served and pod shape)
ENGINE_NAME_FIELDS: tuple[str, ...] = ("engine_endpoint", "engine_class")
MAX_ENGINE_NAME_LEN = 253
#: the class of an endpoint whose labels name neither its model nor its shape
DEFAULT_ENGINE_CLASS = "default"


def _check_number(value: Any, f: WireField, loc: tuple) -> float:
    # bool is an int subclass in Python; JSON true/false is never a number here.
    t = type(value)
    if t is int:
        x = float(value) if abs(value) < 2**53 else math.inf
    elif t is float:
        x = value
        if f.kind == "int" and not x.is_integer():
            raise FieldError(loc, f"must be an integer, got {value!r}", "int_type")
    else:
        kind = "an integer" if f.kind == "int" else "a number"
        raise FieldError(loc, f"must be {kind}, got {type(value).__name__}", "type_error")
    if not math.isfinite(x):
        raise FieldError(loc, "must be finite", "value_error")
    if x < f.lo or (f.hi is not None and x > f.hi):
        hi = "" if f.hi is None else f" and <= {f.hi:g}"
        raise FieldError(loc, f"out of range: {value!r} (must be >= {f.lo:g}{hi})", "range_error")
    return x


def _check_pod_type(value: Any, loc: tuple) -> float:
    if value is None:
        return 0.0
    if type(value) is not str:
        raise FieldError(loc, f"must be a string, got {type(value).__name__}", "type_error")
    code = POD_TYPES.get(value)
    if code is None:
        raise FieldError(loc, f'must be one of "", "prefill", "decode"; got {value[:40]!r}', "enum_error")
    return float(code)


#: per row field: the field, its name, whether it is an integer, and the bounds within which a number
#: needs no more check (the fast path of :func:`parse_row`; a pod type has none: an empty range)
_ROW_RANGES: tuple[tuple[WireField, str, bool, float, float], ...] = tuple(
    (f, f.name, f.kind == "int", f.lo, min(math.inf if f.hi is None else f.hi, 2**53 - 1))
    if f.kind != "pod_type" else (f, f.name, False, math.inf, -math.inf) for f in ROW_FIELDS)


def parse_row(obj: Any, loc: tuple = ()) -> list[float]:
    """Validate one feature row (a decoded JSON object) into raw columns.

    Unknown keys are ignored. Raises FieldError naming the first bad field.
    """
    if type(obj) is not dict:
        raise FieldError(loc, f"must be an object, got {type(obj).__name__}", "type_error")
    out: list[float] = []
    for f, name, is_int, lo, hi in _ROW_RANGES:
        value: Any = obj.get(name)
        # the common case, decided by the same comparisons as _check_number (NaN and infinities
        # fail the range test and take the full check, which names the fault)
        t = type(value)
        if t is float and lo <= value <= hi and not (is_int and not value.is_integer()):
            out.append(value)
            continue
        if t is int and lo <= value <= hi:
            out.append(float(value))
            continue
        if value is None:
            if f.required:
                if f.name in obj:
                    raise FieldError((*loc, f.name), "must not be null", "type_error")
                raise FieldError((*loc, f.name), "field required", "missing")
            out.append(f.default)
            continue
        if f.kind == "pod_type":
            out.append(_check_pod_type(value, (*loc, f.name)))
        else:
            out.append(_check_number(value, f, (*loc, f.name)))
    if out[COL["encoder_matched_size"]] > out[COL["encoder_input_size"]]:
        raise FieldError((*loc, "encoder_matched_size"), "must be <= encoder_input_size", "range_error")
    return out


def parse_timestamp(value: Any, loc: tuple) -> float | None:
    """RFC 3339 string (or epoch seconds) to epoch seconds; None when absent."""
    if value is None or value == "":
        return None
    if type(value) in (int, float):
        x = float(value)
        if not math.isfinite(x) or x < 0:
            raise FieldError(loc, "must be a non-negative epoch time or an RFC 3339 string", "value_error")
        return x
    if type(value) is not str:
        raise FieldError(loc, f"must be an RFC 3339 string, got {type(value).__name__}", "type_error")
    s = value.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise FieldError(loc, f"not an RFC 3339 timestamp: {value[:40]!r}", "value_error") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass(frozen=True)
class EngineObservation:
    """The engine fields of a training entry: the endpoint, its class, the five sums
    (``ENGINE_FEATURE_FIELDS`` order), the twin's TTFT at dispatch (0: not sent) and the
    measured TTFT they go with when the entry is not a TTFT sample (0: the entry's own)."""

    endpoint: str
    engine_class: str
    features: tuple[float, float, float, float, float]
    twin_ttft_ms: float = 0.0
    actual_ttft_ms: float = 0.0


def _required_numbers(obj: dict, fields: Sequence[WireField], loc: tuple, missing: str = "field required"
                      ) -> list[float]:
    """The values of ``fields`` in ``obj``, each required and checked (FieldError naming it)."""
    out = []
    for f in fields:
        value = obj.get(f.name)
        if value is None:
            raise FieldError((*loc, f.name), missing, "missing")
        out.append(_check_number(value, f, (*loc, f.name)))
    return out


def _engine_name(obj: dict, name: str, loc: tuple, default: str = "") -> str:
    value = obj.get(name)
    if value is None or value == "":
        if not default:
            raise FieldError((*loc, name), "field required with the engine fields", "missing")
        return default
    if type(value) is not str:
        raise FieldError((*loc, name), f"must be a string, got {type(value).__name__}", "type_error")
    if len(value) > MAX_ENGINE_NAME_LEN:
        raise FieldError((*loc, name), f"longer than {MAX_ENGINE_NAME_LEN} characters", "value_error")
    return value


def parse_engine_observation(obj: dict, loc: tuple = ()) -> EngineObservation | None:
    """The entry's engine fields, None when it has none; FieldError naming the field when
    some are missing or one is not a non-negative finite number."""
    if all(obj.get(f.name) is None for f in ENGINE_FEATURE_FIELDS) and obj.get("engine_endpoint") is None:
        return None
    values = _required_numbers(obj, ENGINE_FEATURE_FIELDS, loc, "field required with the engine fields")
    endpoint = _engine_name(obj, "engine_endpoint", loc)
    cls = _engine_name(obj, "engine_class", loc, DEFAULT_ENGINE_CLASS)
    twin_ms, actual_ms = (0.0 if obj.get(f.name) is None else _check_number(obj[f.name], f, (*loc, f.name))
                          for f in (ENGINE_TTFT_FIELD, ENGINE_ACTUAL_TTFT_FIELD))
    return EngineObservation(endpoint, cls, (values[0], values[1], values[2], values[3], values[4]), twin_ms,
                             actual_ms)


@dataclass(frozen=True)
class TrainingEntry:
    """One validated training entry: raw feature columns plus targets and extensions."""

    raw: tuple[float, ...]
    actual_ttft_ms: float
    actual_tpot_ms: float
    timestamp: float | None
    predicted_ttft_ms: float = 0.0
    predicted_tpot_ms: float = 0.0
    model_version: str = ""
    engine: EngineObservation | None = None


def parse_training_entry(obj: Any, loc: tuple = ()) -> TrainingEntry:
    """Validate one training entry. A target of 0 means absent; at least one must be > 0."""
    raw = parse_row(obj, loc)
    targets = _required_numbers(obj, TARGET_FIELDS, loc)
    if targets[0] <= 0 and targets[1] <= 0:
        raise FieldError((*loc, "actual_ttft_ms"), "actual_ttft_ms and actual_tpot_ms are both 0: nothing to learn",
                         "value_error")
    predicted = []
    for f in PREDICTED_FIELDS:
        value = obj.get(f.name)
        predicted.append(0.0 if value is None else _check_number(value, f, (*loc, f.name)))
    version = obj.get("model_version") or ""
    if type(version) is not str:
        raise FieldError((*loc, "model_version"), "must be a string", "type_error")
    if len(version) > MAX_MODEL_VERSION_LEN:
        raise FieldError((*loc, "model_version"), f"longer than {MAX_MODEL_VERSION_LEN} characters", "value_error")
    ts = parse_timestamp(obj.get("timestamp"), (*loc, "timestamp"))
    engine = parse_engine_observation(obj, loc)
    return TrainingEntry(tuple(raw), targets[0], targets[1], ts, predicted[0], predicted[1], version, engine)


def row_from_raw(raw: Sequence[float]) -> dict:
    """Inverse of parse_row: raw columns back to a wire row (for clients and tests)."""
    row: dict[str, Any] = {}
    for f, x in zip(ROW_FIELDS, raw):
        if f.kind == "pod_type":
            row[f.name] = POD_TYPE_NAMES[int(x)]
        elif f.kind == "int":
            row[f.name] = int(x)
        else:
            row[f.name] = float(x)
    return row


def row_json_schema() -> dict:
    """JSON Schema of a feature row, generated from ROW_FIELDS (used in OpenAPI)."""
    props: dict[str, Any] = {}
    for f in ROW_FIELDS:
        if f.kind == "pod_type":
            # null is accepted for every optional field and means "the default"
            props[f.name] = {"type": ["string", "null"], "enum": [*POD_TYPE_NAMES, None], "default": "",
                             "description": f.doc}
            continue
        kind = "integer" if f.kind == "int" else "number"
        p: dict[str, Any] = {"type": kind if f.required else [kind, "null"], "minimum": f.lo, "description": f.doc}
        if f.hi is not None:
            p["maximum"] = f.hi
        if not f.required:
            p["default"] = 0
        props[f.name] = p
    props["encoder_matched_size"]["description"] += " (a larger value is refused with 422)"
    return {
        "type": "object",
        "properties": props,
        "required": [f.name for f in ROW_FIELDS if f.required],
        "additionalProperties": True,
    }


def training_entry_json_schema() -> dict:
    schema = row_json_schema()
    props = dict(schema["properties"])
    for f in (*TARGET_FIELDS, *PREDICTED_FIELDS):
        props[f.name] = {"type": "number", "minimum": f.lo, "maximum": f.hi, "description": f.doc}
    props["timestamp"] = {"type": "string", "format": "date-time", "description": "RFC 3339; receive time when absent"}
    props["model_version"] = {"type": "string", "maxLength": MAX_MODEL_VERSION_LEN}
    for f in (*ENGINE_FEATURE_FIELDS, ENGINE_TTFT_FIELD, ENGINE_ACTUAL_TTFT_FIELD):
        props[f.name] = {"type": "number", "minimum": f.lo, "description": f.doc}
    props["engine_endpoint"] = {"type": "string", "maxLength": MAX_ENGINE_NAME_LEN,
                                "description": "the endpoint that served the request (required with the engine sums)"}
    props["engine_class"] = {"type": "string", "maxLength": MAX_ENGINE_NAME_LEN,
                             "description": f"its class: model and pod shape ({DEFAULT_ENGINE_CLASS!r} when absent)"}
    return {**schema, "properties": props, "required": [*schema["required"], "actual_ttft_ms", "actual_tpot_ms"]}
