"""Plugin registration and discovery.

A plugin module declares each of its plugins with ``@plugin("type-name", Role)`` (Role:
one of the protocols of :mod:`epp_client.framework.protocols`). The decorator checks the
class against its role and marks it; nothing else happens at import time.
:func:`discover` imports every module of the plugin packages and collects the marked
classes, so adding a plugin is adding one module: there is no list to keep.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from epp_client.framework.params import describe
from epp_client.framework.protocols import ROLES

#: Packages whose every module (sub-packages included) is searched for plugins.
PACKAGES = ("epp_client.plugins",)
#: Single modules outside them.
MODULES: tuple[str, ...] = ()

_C = TypeVar("_C", bound=type)


@dataclass(frozen=True)
class Registration:
    type_name: str
    role: type


def _role_methods(role: type) -> list[str]:
    """The methods of a role protocol, those of the protocols it extends included."""
    return [n for base in role.__mro__ if base.__module__ == role.__module__
            for n, v in vars(base).items() if not n.startswith("_") and callable(v)]


def plugin(type_name: str, role: type) -> Callable[[_C], _C]:
    """Class decorator: ``type_name`` is the upstream plugin type, ``role`` its protocol."""
    if role not in ROLES:
        raise TypeError(f"plugin {type_name!r}: role must be one of {', '.join(r.__name__ for r in ROLES)}")

    def register(cls: _C) -> _C:
        missing = [n for n in _role_methods(role) if not callable(getattr(cls, n, None))]
        if missing:
            raise TypeError(f"{cls.__name__} is registered as {type_name!r}, a {role.__name__}, "
                            f"but has no {', '.join(missing)}")
        cls.TYPE = type_name  # type: ignore[attr-defined]
        cls.REGISTRATION = Registration(type_name, role)  # type: ignore[attr-defined]
        return cls

    return register


def role_of(obj: Any) -> type | None:
    """The declared role of a plugin instance or class (None if it has none)."""
    reg = getattr(obj if isinstance(obj, type) else type(obj), "REGISTRATION", None)
    return reg.role if isinstance(reg, Registration) else None


def _modules(packages: Iterable[str], modules: Iterable[str]) -> Iterator[ModuleType]:
    for name in packages:
        pkg = importlib.import_module(name)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            yield importlib.import_module(info.name)
    for name in modules:
        yield importlib.import_module(name)


def discover(packages: Iterable[str] = PACKAGES, modules: Iterable[str] = MODULES) -> dict[str, type]:
    """Plugin type name -> class, for every class registered in those modules."""
    found: dict[str, type] = {}
    for mod in _modules(packages, modules):
        for obj in vars(mod).values():
            if isinstance(obj, type) and obj.__module__ == mod.__name__ and "REGISTRATION" in vars(obj):
                name = vars(obj)["REGISTRATION"].type_name
                if name in found and found[name] is not obj:
                    raise TypeError(f"plugin type {name!r} is registered twice: {found[name].__module__}."
                                    f"{found[name].__name__} and {obj.__module__}.{obj.__name__}")
                found[name] = obj
    return dict(sorted(found.items()))


def reference(registry: dict[str, type] | None = None) -> str:
    """The parameter reference (a Markdown table) of every registered plugin."""
    rows = ["| plugin | role | parameter | default | must be | meaning |", "|---|---|---|---|---|---|"]
    for name, cls in (registry if registry is not None else discover()).items():
        head = f"| `{name}` | {getattr(role_of(cls), '__name__', '')} |"
        params = getattr(cls, "PARAMS", None)
        if params is None:
            rows.append(f"{head} (structured) | | | {(cls.__doc__ or '').strip().splitlines()[0]} |")
            continue
        if not params:
            rows.append(f"{head} (none) | | | |")
        for p in params:
            default, constraint, meaning = describe(p)
            rows.append(f"{head} `{p.name}` | {default} | {constraint} | {meaning} |")
            head = "| | |"
    return "\n".join(rows) + "\n"
