"""Plugin parameters: one declarative spec per class, shared by the constructor check and
``from_config`` (upstream camelCase names, strict: unknown names are rejected).

Upstream decodes JSON over the default config: an absent field keeps its default, an
explicit 0 or "" overrides it (B2). ``from_config`` therefore passes only the given keys.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .types import ConfigError


@dataclass(frozen=True)
class Param:
    camel: str
    snake: str
    kind: str  # "float" | "int" | "bool" | "str" | "duration"
    check: Callable[[Any], str | None] | None = None  # returns an error message or None


def _type_ok(kind: str, value: Any) -> Any:
    t = type(value)
    if kind == "float":
        if t in (int, float):
            return float(value)
    elif kind == "int":
        if t is int:
            return value
        if t is float and value.is_integer():
            return int(value)
    elif kind == "bool":
        if t is bool:
            return value
    elif kind == "str":
        if t is str:
            return value
    elif kind == "duration":
        if t is str:
            return parse_duration(value)
        if t in (int, float) and value >= 0:
            return float(value)  # seconds
    raise TypeError


def check_value(owner: str, p: Param, value: Any) -> Any:
    """Type-check and validate one parameter; ConfigError names it (camelCase)."""
    try:
        v = _type_ok(p.kind, value)
    except (TypeError, ValueError) as e:
        detail = f": {e}" if isinstance(e, ValueError) else ""
        raise ConfigError(f"{owner}.{p.camel}", f"must be a {p.kind}, got {value!r}{detail}") from None
    if p.kind == "float" and not math.isfinite(v):
        raise ConfigError(f"{owner}.{p.camel}", f"must be finite, got {value!r}")
    if p.check is not None:
        msg = p.check(v)
        if msg:
            raise ConfigError(f"{owner}.{p.camel}", msg)
    return v


def validate(owner: str, spec: tuple[Param, ...], values: Mapping[str, Any]) -> dict:
    """Constructor-side validation of snake_case values (all params of ``spec``)."""
    return {p.snake: check_value(owner, p, values[p.snake]) for p in spec if p.snake in values}


def from_camel(owner: str, spec: tuple[Param, ...], params: Mapping[str, Any] | None) -> dict:
    """camelCase config parameters -> snake_case kwargs. Unknown names raise ConfigError."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{owner}.parameters", f"must be a mapping, got {type(params).__name__}")
    by_camel = {p.camel: p for p in spec}
    out = {}
    for key, value in params.items():
        p = by_camel.get(key)
        if p is None:
            raise ConfigError(f"{owner}.{key}", f"unknown parameter (known: {', '.join(sorted(by_camel)) or 'none'})")
        out[p.snake] = check_value(owner, p, value)
    return out


_DUR = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go duration string (``5m``, ``1h30m``, ``250ms``) to seconds."""
    s = text.strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DUR.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not s:
        raise ValueError("empty duration")
    return total


def ge(lo: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= lo else f"must be >= {lo:g}, got {v!r}"


def gt(lo: float) -> Callable[[Any], str | None]:
    return lambda v: None if v > lo else f"must be > {lo:g}, got {v!r}"


def within(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be in [{lo:g}, {hi:g}], got {v!r}"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(map(repr, choices))}, got {v!r}"


class Configurable:
    """Mixin: ``PARAMS`` spec, ``TYPE`` (upstream plugin type), and ``from_config``."""

    TYPE = ""
    PARAMS: tuple[Param, ...] = ()
    #: constructor-only keyword arguments that from_config may pass through (e.g. rng)
    EXTRA: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, params: Mapping[str, Any] | None = None, **extra: Any):
        kwargs = from_camel(cls.TYPE or cls.__name__, cls.PARAMS, params)
        kwargs.update({k: v for k, v in extra.items() if k in cls.EXTRA})
        return cls(**kwargs)

    def _validated(self, **values: Any) -> dict:
        return validate(self.TYPE or type(self).__name__, self.PARAMS, values)


def max_endpoints(v: int) -> int:
    """Pickers: a value <= 0 becomes 1 (B2.7)."""
    return v if v > 0 else 1
