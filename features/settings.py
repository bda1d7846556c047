"""Declarative settings: each setting is declared once, on its dataclass field.

A settings class is a dataclass that derives from :class:`EnvSettings`; each field is a
:func:`setting` carrying its environment variable, default, parser (which validates and
normalises) and help text::

    @dataclass(frozen=True)
    class Settings(EnvSettings):
        port: int = setting("LATENCY_TRAINING_PORT", 8000, integer(1, 65535), "TCP port (1-65535)")

- ``Settings.from_env(environ, **overrides)`` reads every variable from ``environ``
  (default ``os.environ``); a keyword override (a command-line flag, a test) wins over the
  variable, ``None`` meaning "not given".
- Constructing the class (directly, by ``from_env`` or ``replace``) parses every field and
  then runs :meth:`EnvSettings.check` for rules across fields. All bad values are reported
  at once in one :class:`SettingsError` whose message names each variable and value.
- ``Settings.doc_table()`` renders the markdown table of the variables (the README's
  "Configuration" tables are these, checked by ``tests/test_settings.py``).

Parsers take the raw value (a string from the environment, or a typed value from a
keyword) and return the typed value or raise ``ValueError`` with the reason.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

Parser = Callable[[Any], Any]
S = TypeVar("S", bound="EnvSettings")


class SettingsError(ValueError):
    """One or more settings have bad values. ``problems`` lists (variable, reason) pairs;
    ``env`` and ``msg`` are the first of them. A field without a variable is named by its
    attribute name."""

    def __init__(self, env: str, msg: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        self.problems = list(problems) or [(env, msg)]
        self.env, self.msg = self.problems[0]
        super().__init__("; ".join(f"{e}: {m}" for e, m in self.problems))


@dataclass(frozen=True)
class Setting:
    """What a field declares: its variable (None = not read from the environment), parser,
    help text and, optionally, how its default is shown in the docs."""

    env: str | None
    parse: Parser
    help: str
    shown: str | None = None


def setting(env: str | None, default: Any, parse: Parser, help: str = "", *, shown: str | None = None) -> Any:
    """A dataclass field declared as a setting (mutable defaults are copied per instance)."""
    meta = {"setting": Setting(env, parse, help, shown)}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def declared(cls: type) -> Iterator[tuple[str, Any, Setting]]:
    """(attribute, default, declaration) of every setting field of ``cls``, in order."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is not None:
            if f.default is not dataclasses.MISSING:
                yield f.name, f.default, spec
            elif f.default_factory is not dataclasses.MISSING:
                yield f.name, f.default_factory(), spec
            else:  # not made by setting(), which gives every field a default or a factory
                raise TypeError(f"{cls.__name__}.{f.name}: a setting without a default")


class EnvSettings:
    """Base of the settings dataclasses (see the module docstring)."""

    #: True: a variable set to blank counts as unset (the default applies); False: blank
    #: is parsed like any value (an integer setting then refuses it).
    blank_is_unset: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Parse (and normalise) every field, then :meth:`check`; raise one
        :class:`SettingsError` listing every bad value."""
        problems: list[tuple[str, str]] = []
        for name, _default, spec in declared(type(self)):
            try:
                object.__setattr__(self, name, spec.parse(getattr(self, name)))
            except (ValueError, TypeError) as e:  # a wrong type given by keyword is a bad value too
                problems.append((spec.env or name, str(e)))
        if not problems:
            try:
                self.check()
            except SettingsError as e:
                problems.extend(e.problems)
        if problems:
            raise SettingsError("", "", problems)

    def check(self) -> None:
        """Rules across fields (every field is parsed when this runs); raise SettingsError."""

    @classmethod
    def from_env(cls: type[S], environ: Mapping[str, str] | None = None, **overrides: Any) -> S:
        """Read every declared variable from ``environ`` (default ``os.environ``); keyword
        overrides (attribute names; None = not given) win. Unknown keywords: TypeError."""
        env = os.environ if environ is None else environ
        specs = {name: spec for name, _default, spec in declared(cls)}
        unknown = set(overrides) - set(specs)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, spec in specs.items():
            if overrides.get(name) is not None:
                values[name] = overrides[name]
            elif spec.env is not None and spec.env in env:
                raw = env[spec.env]
                if not (cls.blank_is_unset and not raw.strip()):
                    values[name] = raw
        return cls(**values)

    @classmethod
    def from_cli(cls: type[S], environ: Mapping[str, str] | None, flags: Mapping[str, tuple[str, Any]]) -> S:
        """:meth:`from_env` with command-line flags: ``flags`` maps an attribute to (flag, value;
        None = not given). A bad value the user gave as a flag is named by that flag, the others
        by their variable."""
        try:
            return cls.from_env(environ, **{attr: value for attr, (_flag, value) in flags.items()})
        except SettingsError as e:
            env = cls.env_names()
            given = {env.get(attr, attr): flag for attr, (flag, value) in flags.items() if value is not None}
            raise SettingsError("", "", [(given.get(name, name), msg) for name, msg in e.problems]) from None

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """attribute -> environment variable, for the fields read from the environment."""
        return {name: spec.env for name, _default, spec in declared(cls) if spec.env is not None}

    @classmethod
    def env_name(cls, attr: str) -> str:
        return cls.env_names()[attr]

    @classmethod
    def doc_table(cls) -> str:
        """The markdown table of the variables: name, default, meaning."""
        lines = ["| variable | default | meaning |", "|---|---|---|"]
        for _name, default, spec in declared(cls):
            if spec.env is not None:
                lines.append(f"| `{spec.env}` | {spec.shown or show_default(default)} | {spec.help} |")
        return "\n".join(lines)


def show_default(value: Any) -> str:
    """How a default reads in the docs: ``unset`` for None or empty, else the value quoted."""
    if value is None or value == [] or value == {}:
        return "unset"
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    elif isinstance(value, (list, tuple)):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    return f"`{text}`"


# ---------------------------------------------------------------------- parsers
def integer(lo: int, hi: int | None = None) -> Parser:
    """An integer in [lo, hi] (no upper bound when hi is None); digits only from text."""
    def parse(v: Any) -> int:
        if isinstance(v, str):
            s = v.strip()
            if not s.lstrip("+-").isdigit():
                raise ValueError(f"must be an integer, got {v!r}")
            v = int(s)
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be an integer, got {v!r}")
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"must be >= {lo}" + ("" if hi is None else f" and <= {hi}") + f", got {v}")
        return v
    return parse


def number(lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False) -> Parser:
    """A finite number in the interval between lo and hi (open or closed at each end)."""
    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError(f"must be a number, got {v!r}")
        try:
            x = float(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError):
            raise ValueError(f"must be a number, got {v!r}") from None
        if not math.isfinite(x) or (x <= lo if lo_open else x < lo) or (x >= hi if hi_open else x > hi):
            top = "" if hi == math.inf else f"{hi:g}"
            raise ValueError(f"must be in {'(' if lo_open else '['}{lo:g}, {top or 'inf'}"
                             f"{')' if hi_open or not top else ']'}, got {v!r}")
        return x
    return parse


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def boolean(v: Any) -> bool:
    """true/false, 1/0, yes/no, on/off (any case); blank is false."""
    if isinstance(v, bool):
        return v
    s = v.strip().lower() if isinstance(v, str) else None
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise ValueError(f"must be true or false, got {v!r}")


def choice(*options: str) -> Parser:
    """One of ``options`` (case-insensitive; returned in lower case)."""
    def parse(v: Any) -> str:
        s = str(v).strip().lower()
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {v!r}")
        return s
    return parse


def text(v: Any) -> str:
    """Any string, surrounding spaces removed."""
    if not isinstance(v, (str, Path)):
        raise ValueError(f"must be a string, got {v!r}")
    return str(v).strip()


def host(v: Any) -> str:
    """A host name or IP address (no spaces)."""
    s = str(v).strip()
    if not s or any(c.isspace() for c in s) or len(s) > 253:
        raise ValueError(f"must be a host name or IP address, got {v!r}")
    return s


def http_url(v: Any) -> str:
    """An http(s) URL with a host (and a valid port if any); trailing slashes removed."""
    s = str(v).strip().rstrip("/")
    p = urlsplit(s)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"must be an http(s) URL, got {v!r}")
    try:
        _ = p.port  # raises on a bad port
    except ValueError:
        raise ValueError(f"bad port in {v!r}") from None
    return s


def url_list(min_items: int = 0, unique: bool = False) -> Parser:
    """http(s) URLs, comma-separated in text (blank items ignored), or a sequence."""
    def parse(v: Any) -> list[str]:
        items = v.split(",") if isinstance(v, str) else list(v)
        urls = [http_url(u) for u in items if str(u).strip()]
        if len(urls) < min_items:
            raise ValueError(f"needs at least {min_items} URL(s), got {v!r}")
        if unique and len(set(urls)) != len(urls):
            raise ValueError(f"duplicate URL in {v!r}")
        return urls
    return parse


def token(v: Any) -> str | None:
    """A secret of at least 8 printable characters without surrounding spaces; "" = none."""
    if v is None or v == "":
        return None
    s = str(v)
    if s != s.strip() or len(s) < 8 or not s.isprintable():
        raise ValueError("must be at least 8 printable characters without surrounding spaces")
    return s


def optional(parse: Parser, empty: Any = None) -> Parser:
    """``parse``, except that None or a blank string gives ``empty``."""
    def wrapped(v: Any) -> Any:
        if v is None or (isinstance(v, str) and not v.strip()):
            return empty
        return parse(v)
    return wrapped


def existing_path(v: Any) -> Path:
    """A path that exists."""
    p = Path(text(v))
    if not p.exists():
        raise ValueError(f"{p} does not exist")
    return p
