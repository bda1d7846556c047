"""Asking the engine for usage on every stream (``LATENCY_GATEWAY_STREAM_USAGE``).

The routing policy learns from each request's true prompt length, the engine's
``usage.prompt_tokens``; a stream reports usage only when its request sets
``stream_options.include_usage``. So the gateway sets it in the body it forwards for a
stream whose client did not, and removes the engine's usage-only chunk (``"choices": []``
with ``usage``) from the client's stream (``sse.StreamObserver`` with ``strip_usage``):
the client gets every other byte as the engine sent it.

A client that asked for usage (``include_usage`` set to anything but ``false``/``null``), a
request that is not a stream, a body that is not a JSON object and a ``stream_options`` that is
not an object (the engine answers it) are forwarded unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Forward:
    """The body the engine gets and whether the client's stream loses its usage-only chunk."""

    body: bytes
    strip_usage: bool = False


def ask_for_usage(raw: bytes, body: Any, enabled: bool) -> Forward:
    """``raw``: the client's body, ``body``: its parsed JSON. The rewritten body is ``body``
    serialized again with ``stream_options.include_usage: true`` (and ``continuous_usage_stats``,
    vLLM's usage on every chunk, ``false`` when the client sent it: without ``include_usage`` it
    had no effect)."""
    if not enabled or not isinstance(body, dict) or body.get("stream") is not True:
        return Forward(raw)
    so = body.get("stream_options")
    if so is None:
        so = {}
    if not isinstance(so, dict) or so.get("include_usage") not in (None, False):
        return Forward(raw)
    so = {**so, "include_usage": True}
    if "continuous_usage_stats" in so:
        so["continuous_usage_stats"] = False
    return Forward(orjson.dumps({**body, "stream_options": so}), strip_usage=True)
