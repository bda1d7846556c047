"""Foreign engines (``simulate --engine NAME``): the scenario's servers with other physics, which
the router is never told about (docs/evaluation.md §4, "Foreign engines").

An engine maps a server preset (:class:`~load.sim.stepmodel.ServerSpec`) to another: every
engine is a set of coefficients (its defaults below) applied to the preset, and ``--engine-param
NAME=VALUE`` sets any of them, or any of the preset's own fields, for every server of the pool:

- ``speed_scale`` multiplies the server's speed (every step time divided by it);
- ``prefill_attention_scale`` multiplies the cost of a prefill's causal token pairs (``a_att``);
- ``per_token_scale`` multiplies the per-token cost of a step: the slope of the non-attention
  table ``c_lin`` above its one-token floor, and ``c_tok``;
- ``decode_attention_scale`` multiplies the cost of the context a decode reads (``a_kv``);
- a preset field (``max_num_batched_tokens``, ``max_num_seqs``, ``batching_order``,
  ``kv_capacity_tokens``, ``a_att``, ...) replaces the preset's value before the scales apply.

``splitwise`` takes its step times from SplitwiseSim's measured table (:mod:`load.sim.steptable`)
instead of the formula: only the scales and fields that do not belong to the formula apply.
A pool may mix engines: ``default:4,slow:4`` runs the first 4 servers on ``default``, the next 4
on ``slow`` (the counts add up to the scenario's servers).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .stepmodel import BATCHING_ORDERS, ServerSpec


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    params: Mapping[str, object]
    table: bool = False            # step times from the Splitwise table, not the formula


SCALES = ("speed_scale", "prefill_attention_scale", "per_token_scale", "decode_attention_scale")
#: preset fields only the step-time formula reads (a table engine has no such coefficient)
FORMULA_FIELDS = ("lin_tokens", "lin_ms", "a_kv", "c_attn", "a_att", "c_fix", "c_tok")
_SETTABLE = ("a_kv", "c_attn", "a_att", "c_fix", "c_tok", "kv_capacity_tokens", "block_size",
             "max_num_batched_tokens", "max_num_seqs", "speed", "batching_order")
_INTS = ("kv_capacity_tokens", "block_size", "max_num_batched_tokens", "max_num_seqs")

ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("default", "the scenario's servers as they are", {}),
    Engine("slow", "every step 2x slower", {"speed_scale": 0.5}),
    Engine("fast", "every step 2x faster", {"speed_scale": 2.0}),
    Engine("reshaped", "prefill attention cost 3x, per-token cost 0.5x (a different shape, not a scale)",
           {"prefill_attention_scale": 3.0, "per_token_scale": 0.5}),
    Engine("budget8k", "8,192 batched tokens per step, max_num_seqs 64",
           {"max_num_batched_tokens": 8192, "max_num_seqs": 64}),
    Engine("decode-first", "every running decode batched before any prefill chunk, also after preemptions "
           "(default: admission order)", {"batching_order": "decode-first"}),
    Engine("prefill-first", "the running prompts' chunks batched before the decodes (a long prompt stalls "
           "the decodes)", {"batching_order": "prefill-first"}),
    Engine("splitwise", "step times interpolated from SplitwiseSim's measured table (Llama-2-70B, H100, TP 4; "
           "load/data/splitwise-perf-model), the preset's memory and token budget", {}, table=True),
)}


def known_params(engine: Engine) -> tuple[str, ...]:
    names = (*SCALES, *_SETTABLE)
    if engine.table:
        names = tuple(n for n in names if n not in FORMULA_FIELDS and n not in SCALES[1:])
    return names


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"--engine: unknown engine {name!r}; known: {', '.join(ENGINES)}") from None


def _value(name: str, value: object) -> object:
    if name == "batching_order":
        if value not in BATCHING_ORDERS:
            raise ValueError(f"--engine-param batching_order: {value!r} is not one of {', '.join(BATCHING_ORDERS)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"--engine-param {name}: expected a number, got {value!r}")
    if name in _INTS:
        if value != int(value) or value <= 0:
            raise ValueError(f"--engine-param {name}: expected a positive whole number, got {value!r}")
        return int(value)
    if name in SCALES and value <= 0:
        raise ValueError(f"--engine-param {name}: must be > 0, got {value!r}")
    return float(value)


def check_params(engine: Engine, params: Mapping[str, object]) -> dict[str, object]:
    """``--engine-param`` values checked against the engine's coefficients (ValueError names a bad one)."""
    known = known_params(engine)
    out = {}
    for name, value in params.items():
        if name not in known:
            raise ValueError(f"--engine-param: {name!r} is not a coefficient of engine {engine.name}; "
                             f"known: {', '.join(known)}")
        out[name] = _value(name, value)
    return out


def scaled(spec: ServerSpec, speed_scale: float = 1.0, prefill_attention_scale: float = 1.0,
           per_token_scale: float = 1.0, decode_attention_scale: float = 1.0) -> ServerSpec:
    """``spec`` with the cost scales of the module doc (``SCALES``) applied."""
    k = per_token_scale
    if k != 1.0:
        lin0 = spec.lin_ms[0]
        spec = dataclasses.replace(spec, c_tok=spec.c_tok * k, lin_ms=tuple(lin0 + k * (y - lin0) for y in spec.lin_ms))
    for field, scale in (("speed", speed_scale), ("a_att", prefill_attention_scale), ("a_kv", decode_attention_scale)):
        if scale != 1.0:
            spec = dataclasses.replace(spec, **{field: getattr(spec, field) * scale})
    return spec


def engine_spec(base: ServerSpec, engine: Engine, params: Mapping[str, object] | None = None) -> ServerSpec:
    """``base`` on ``engine``, with ``params`` (checked) over the engine's own coefficients."""
    values = {**engine.params, **check_params(engine, params or {})}
    scales = {k: float(values.pop(k, 1.0)) for k in SCALES}   # type: ignore[arg-type]
    spec = scaled(base.with_overrides({**values, "engine": engine.name}), **scales)
    if engine.table:
        from .steptable import TableSpec, splitwise_curves

        px, py, dx, dy = splitwise_curves()
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(ServerSpec)}
        spec = TableSpec(**fields, prefill_tokens=px, prefill_ms=py, decode_batch=dx, decode_ms=dy)
    return spec


def parse_pool(text: str, n_servers: int) -> list[Engine]:
    """``--engine`` text -> one engine per server: ``NAME`` for all, or ``NAME:COUNT,...`` in order."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("--engine: no engine given")
    if len(parts) == 1 and ":" not in parts[0]:
        return [get_engine(parts[0])] * n_servers
    out: list[Engine] = []
    for part in parts:
        name, colon, count = part.partition(":")
        if not colon:
            raise ValueError(f"--engine: a mixed pool gives every engine a count (NAME:COUNT), got {part!r}")
        try:
            n = int(count)
        except ValueError:
            raise ValueError(f"--engine: not a server count: {part!r}") from None
        if n < 1:
            raise ValueError(f"--engine: {part!r}: the count must be >= 1")
        out += [get_engine(name)] * n
    if len(out) != n_servers:
        raise ValueError(f"--engine: the counts add up to {len(out)} servers, the pool has {n_servers}")
    return out


def pool(servers: Sequence[ServerSpec], text: str, params: Mapping[str, object] | None = None
         ) -> tuple[ServerSpec, ...]:
    """The scenario's servers on the engines of ``--engine`` (ValueError names what is wrong)."""
    engines = parse_pool(text, len(servers))
    for e in {e.name: e for e in engines}.values():
        check_params(e, params or {})
    return tuple(engine_spec(s, e, params) for s, e in zip(servers, engines))


def apply(scenario, text: str = "default", params: Mapping[str, object] | None = None):
    """The scenario with its servers on ``--engine`` (unchanged for ``default`` without parameters)."""
    if text.strip() == "default" and not params:
        return scenario
    servers = pool(scenario.servers, text, params)
    note = f"engine {text}" + (" (" + ", ".join(f"{k}={v}" for k, v in (params or {}).items()) + ")" if params
                               else "")
    return dataclasses.replace(scenario, servers=servers, description=f"{scenario.description}; {note}")


def describe(text: str, params: Mapping[str, object] | None = None) -> str:
    """One line for reports: the engines of the pool and what they change."""
    names = dict.fromkeys(p.partition(":")[0].strip() for p in text.split(",") if p.strip())
    line = "; ".join(f"{n}: {get_engine(n).description}" for n in names)
    if params:
        line += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    return line
