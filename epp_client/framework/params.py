"""Plugin parameters, declared once.

A plugin is a dataclass: every subclass of :class:`Plugin` is turned into one
(``eq=False``: plugins compare by identity). Each configurable parameter is one field
declared with :func:`param`, which carries its EndpointPickerConfig name (upstream
camelCase), its default, its check and a line of documentation::

    class ProbabilisticAdmitter(Plugin):
        queue_depth_threshold: int = param("queueDepthThreshold", default=5, check=gt(0), doc="...")
        rng: random.Random = field(default_factory=random.Random)    # context, not a parameter

From that one declaration come the constructor (snake_case keywords in declaration
order), the validation (type, finiteness and range: a ``ConfigError`` naming
``type.camelName`` and the bad value), :meth:`Plugin.from_config` (camelCase names,
strict: unknown names are rejected) and the parameter reference in docs/plugins.md
(:func:`describe`). Other init fields (``rng``, ``clock``, ``predictor``...) are context
that ``from_config`` passes through when the caller supplies them. Cross-parameter checks
and derived state go in :meth:`Plugin.setup`, which runs after the fields are validated.

Upstream decodes JSON over the default config: an absent field keeps its default, an
explicit 0 or "" overrides it (B2). ``from_config`` therefore passes only the given keys.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

from epp_client.types import ConfigError

KINDS = ("float", "int", "bool", "str", "duration")
_META = "epp_client.param"


@dataclass(frozen=True)
class Check:
    """A constraint on a (type-checked) value; ``text`` completes "must be ..."."""

    ok: Callable[[Any], bool]
    text: str

    def __call__(self, value: Any) -> str | None:
        return None if self.ok(value) else f"must be {self.text}, got {value!r}"


def ge(lo: float) -> Check:
    return Check(lambda v: v >= lo, f">= {lo:g}")


def gt(lo: float) -> Check:
    return Check(lambda v: v > lo, f"> {lo:g}")


def le(hi: float) -> Check:
    return Check(lambda v: v <= hi, f"<= {hi:g}")


def within(lo: float, hi: float) -> Check:
    return Check(lambda v: lo <= v <= hi, f"in [{lo:g}, {hi:g}]")


def one_of(*choices: str) -> Check:
    return Check(lambda v: v in choices, f"one of {', '.join(map(repr, choices))}")


@dataclass(frozen=True)
class _Decl:
    name: str
    check: Check | None
    kind: str | None
    doc: str
    ignored: bool


@dataclass(frozen=True)
class Param:
    """One declared parameter: ``name`` (camelCase, in configs) is field ``attr``."""

    name: str
    attr: str
    kind: str
    default: Any
    check: Check | None = None
    doc: str = ""
    ignored: bool = False

    def validate(self, owner: str, value: Any) -> Any:
        """Type-check (with the config's coercions) and check one value."""
        where = f"{owner}.{self.name}"
        try:
            v = _coerce(self.kind, value)
        except (TypeError, ValueError) as e:
            detail = f": {e}" if isinstance(e, ValueError) else ""
            raise ConfigError(where, f"must be a {self.kind}, got {value!r}{detail}") from None
        if self.kind == "float" and not math.isfinite(v):
            raise ConfigError(where, f"must be finite, got {value!r}")
        if self.check is not None:
            msg = self.check(v)
            if msg:
                raise ConfigError(where, msg)
        return v


def param(name: str, *, default: Any, check: Check | None = None, kind: str | None = None, doc: str = "",
          ignored: bool = False) -> Any:
    """Declare a configurable field. ``kind`` defaults to the field's annotation
    (float, int, bool, str); ``kind="duration"`` takes a Go duration or seconds.
    ``ignored``: accepted for config compatibility, without effect here."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"parameter {name}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    return dataclasses.field(default=default, metadata={_META: _Decl(name, check, kind, doc, ignored)})


def _coerce(kind: str, value: Any) -> Any:
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


def _declared(cls: type) -> tuple[Param, ...]:
    out = []
    for f in dataclasses.fields(cls):
        decl = f.metadata.get(_META)
        if decl is None:
            continue
        kind = decl.kind or (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
        if kind not in KINDS:
            raise TypeError(f"{cls.__name__}.{f.name}: annotate it as float, int, bool or str, or pass kind=")
        out.append(Param(decl.name, f.name, kind, f.default, decl.check, decl.doc, decl.ignored))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: a parameter name is declared twice: {names}")
    return tuple(out)


_P = TypeVar("_P", bound="Plugin")


@dataclass_transform(eq_default=False, field_specifiers=(param, dataclasses.field))
class Plugin:
    """Base of every configurable plugin (see the module docstring)."""

    #: upstream plugin type; set by ``@plugin`` (epp_client.framework.registry) or by hand
    TYPE: ClassVar[str] = ""
    #: the declared parameters, collected from the fields when the class is created
    PARAMS: ClassVar[tuple[Param, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(eq=False, repr=False)(cls)
        cls.PARAMS = _declared(cls)

    @classmethod
    def owner(cls) -> str:
        return cls.TYPE or cls.__name__

    def __post_init__(self) -> None:
        owner = self.owner()
        for p in self.PARAMS:
            setattr(self, p.attr, p.validate(owner, getattr(self, p.attr)))
        self.setup()

    def setup(self) -> None:
        """Cross-parameter checks and derived state (the parameters are valid here)."""

    @classmethod
    def from_config(cls: type[_P], params: Mapping[str, Any] | None = None, **context: Any) -> _P:
        """Build from camelCase ``params``; ``context`` entries that are init fields of
        this class (``rng``, ``clock``...) are passed through, the others dropped."""
        kwargs = parse_params(cls.owner(), cls.PARAMS, params)
        taken = {f.name for f in dataclasses.fields(cast(Any, cls)) if f.init} - {p.attr for p in cls.PARAMS}
        kwargs.update({k: v for k, v in context.items() if k in taken})
        return cls(**kwargs)

    def __repr__(self) -> str:
        args = ", ".join(f"{p.attr}={getattr(self, p.attr)!r}" for p in self.PARAMS if not p.ignored)
        return f"{type(self).__name__}({args})"


def parse_params(owner: str, spec: tuple[Param, ...], params: Mapping[str, Any] | None) -> dict[str, Any]:
    """camelCase config parameters -> snake_case kwargs (values are checked by the
    constructor). Unknown names raise ConfigError."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{owner}.parameters", f"must be a mapping, got {type(params).__name__}")
    by_name = {p.name: p for p in spec}
    out = {}
    for key, value in params.items():
        p = by_name.get(key)
        if p is None:
            raise ConfigError(f"{owner}.{key}", f"unknown parameter (known: {', '.join(sorted(by_name)) or 'none'})")
        out[p.attr] = value
    return out


def describe(p: Param) -> tuple[str, str, str]:
    """(default, constraint, meaning) of a parameter, as the docs print them."""
    d = p.default
    if p.kind == "bool":
        default = "true" if d else "false"
    elif p.kind == "str":
        default = f"`{d}`" if d else '`""`'
    elif p.kind == "duration":
        default = f"`{d:g}s`"
    else:
        default = f"{d:g}" if isinstance(d, float) else str(d)
    constraint = p.check.text if p.check is not None else ""
    meaning = "accepted and ignored" if p.ignored else p.doc
    return default, constraint, meaning


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
