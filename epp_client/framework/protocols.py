"""The roles a plugin can play, as protocols (what the scheduler calls on it).

A plugin declares its role when it registers (``@plugin("type-name", Scorer)``, see
:mod:`epp_client.framework.registry`); registration checks that the class has the role's
methods, and the config builder places each plugin by its declared role.

- :class:`Producer`: before scheduling, writes ``Endpoint.prediction`` on every
  candidate; follows each request through its lifecycle (training samples).
- :class:`InFlightLoadProducer`: the router's own count of what it dispatched where
  (``Endpoint.inflight``), kept by the lifecycle hooks.
- :class:`Admitter`: may refuse a request before any profile runs.
- :class:`Filter`: keeps a sub-list of the candidates, in order.
- :class:`Scorer`: a raw score per endpoint name (the profile clamps it to [0, 1] and
  applies the weight).
- :class:`Picker`: chooses the endpoints from the scores.
- :class:`PDDecider`: asked by the profile handler whether to disaggregate a request.
- :class:`ProfileHandler`: which scheduling profiles run, and the headers they imply.

- :class:`PrefixProducer`: which prompt blocks each endpoint probably has cached
  (``Endpoint.prefix_match``), from the dispatches it recorded.

Profile plugins may also implement :class:`LifecycleObserver` (the scheduler calls it);
the router-level request lifecycle is :class:`epp_client.framework.lifecycle.RequestLifecycle`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from epp_client.types import Admission, Endpoint, InferenceRequest, InFlightLoad


@runtime_checkable
class RequestHooks(Protocol):
    """The request lifecycle as a plugin follows it, after the pick: ``pre_request`` at dispatch
    (``picks``: profile name -> that profile's endpoint, the primary profile first), the body
    chunks, the end (aborts included), or ``discard`` for a request never dispatched (denied,
    dropped, held). The scheduler calls these on the in-flight accounting, on every profile
    plugin that has them, then on the producer; :class:`RequestHooksBase` gives no-ops."""

    def pre_request(self, request: InferenceRequest, picks: Mapping[str, Endpoint], now: float | None = None) -> None:
        ...

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None: ...

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None: ...

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200,
                    aborted: bool = False, output_tokens: int | None = None,
                    prompt_tokens: int | None = None) -> None: ...

    def discard(self, request_id: str) -> None: ...


class RequestHooksBase:
    """No-op :class:`RequestHooks`, for a plugin to override the hooks it needs."""

    def pre_request(self, request: InferenceRequest, picks: Mapping[str, Endpoint], now: float | None = None) -> None:
        return None

    def on_first_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        return None

    def on_chunk(self, request_id: str, now: float | None = None, tokens: int | None = None) -> None:
        return None

    def on_complete(self, request_id: str, now: float | None = None, *, status: int = 200,
                    aborted: bool = False, output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        return None

    def discard(self, request_id: str) -> None:
        return None


@runtime_checkable
class Producer(RequestHooks, Protocol):
    """Before scheduling, writes ``Endpoint.prediction`` on every candidate; follows each
    request through its lifecycle (:class:`RequestHooks`)."""

    def produce(self, request: InferenceRequest, endpoints: list[Endpoint], now: float | None = None) -> None: ...

    async def aproduce(self, request: InferenceRequest, endpoints: list[Endpoint],
                       now: float | None = None) -> None: ...


@runtime_checkable
class InFlightLoadProducer(RequestHooks, Protocol):
    """The router's own count of what it dispatched where, kept by the lifecycle hooks."""

    def load(self, name: str) -> InFlightLoad: ...

    def snapshot(self, name: str) -> InFlightLoad: ...


@runtime_checkable
class PrefixProducer(Protocol):
    def produce(self, hashes: Sequence, endpoints: Iterable[Endpoint], total_blocks: int | None = None) -> None: ...

    def record(self, endpoint: str, hashes: Sequence) -> Any: ...


@runtime_checkable
class Admitter(Protocol):
    def admit(self, request: InferenceRequest | None, endpoints: list[Endpoint]) -> Admission: ...


@runtime_checkable
class Filter(Protocol):
    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    def score(self, request: InferenceRequest, endpoints: list[Endpoint]) -> dict[str, float]: ...


@runtime_checkable
class Picker(Protocol):
    def pick(self, endpoints: list[Endpoint], scores: dict[str, float]) -> list[Endpoint]: ...


@runtime_checkable
class PDDecider(Protocol):
    def disaggregate(self, request: InferenceRequest, endpoint: Endpoint | None,
                     candidates: list[Endpoint] | None = None) -> bool: ...


@runtime_checkable
class ProfileHandler(Protocol):
    """Chooses the profiles a request runs. ``admits``: whether the global admitters judge
    the request; ``primary``: the profile whose pick serves it; ``decision``: the label
    of what ran (counted in ``decisions``); ``required_profiles``: names the config must have."""

    def required_profiles(self) -> tuple[str, ...]: ...

    def admits(self, request: InferenceRequest, candidates: list[Endpoint]) -> bool: ...

    def run(self, request: InferenceRequest, profiles: Mapping[str, Any], candidates: list[Endpoint]) -> dict: ...

    def primary(self, results: Mapping[str, Any]) -> str: ...

    def decision(self, request: InferenceRequest, results: Mapping[str, Any]) -> str: ...

    def headers(self, profile_results: Mapping[str, Any]) -> dict[str, str | None]: ...


#: Every role, in the order the docs list them.
ROLES: tuple[type, ...] = (Producer, InFlightLoadProducer, PrefixProducer, Admitter, Filter, Scorer, Picker, PDDecider,
                           ProfileHandler)
