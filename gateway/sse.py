"""Incremental reading of an OpenAI-style response to count generated tokens.

Streaming responses are split into SSE events (each ends at a blank line, ``\\n\\n`` or
``\\r\\n\\r\\n``); an event carrying text (``choices[].text`` or ``choices[].delta.content``)
counts as one token unless the response reports usage (``usage.completion_tokens``), which
wins (epp-plugins A.2.6). The gateway forwards every chunk as received and only *observes*
it here, except for a stream whose usage the gateway asked for on the client's behalf
(``gateway.usage``): the observer then also holds what the client gets, every byte but the
usage-only event (``"choices": []`` with ``usage``), released one complete event at a time.
"""
from __future__ import annotations

import orjson

MAX_EVENT_BYTES = 1 << 20
MAX_BODY_COPY = 4 << 20


def _has_content(obj: dict) -> bool:
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        if ch.get("text"):
            return True
        d = ch.get("delta")
        if isinstance(d, dict) and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
            return True
    if obj.get("content"):  # llama.cpp native /completion events
        return True
    return False


def _usage_tokens(obj: dict, key: str = "completion_tokens") -> int | None:
    """``usage[key]`` of a response object (``completion_tokens``, ``prompt_tokens``), if a count."""
    u = obj.get("usage")
    if isinstance(u, dict):
        v = u.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


class StreamObserver:
    """Feed raw SSE bytes; tells when the first content event arrives and counts tokens.
    With ``strip_usage``, ``take`` gives the bytes fed so far for the client, usage-only
    events removed, and ``rest`` the bytes of an unfinished event once the stream ends."""

    def __init__(self, strip_usage: bool = False) -> None:
        self._buf = bytearray()
        self.content_events = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None     # usage.prompt_tokens, when the stream reports usage
        self.done = False
        self.error_event = False
        self.strip_usage = strip_usage
        self._out = bytearray()                   # strip_usage: complete events for the client, not yet taken

    def feed(self, chunk: bytes) -> int:
        """Returns the number of content events completed in this chunk."""
        self._buf += chunk
        new = 0
        while True:
            buf = self._buf
            i = buf.find(b"\n\n")
            j = buf.find(b"\r\n\r\n")
            if i < 0 and j < 0:
                if len(buf) > MAX_EVENT_BYTES:  # runaway event: drop it, keep going
                    if self.strip_usage:          # (the client still gets it)
                        self._out += buf
                    self._buf = bytearray()
                return new
            end, stop = (j, j + 4) if j >= 0 and (i < 0 or j < i) else (i, i + 2)
            content, usage_only = self._event(bytes(buf[:end]))
            new += content
            if self.strip_usage and not usage_only:
                self._out += buf[:stop]
            self._buf = buf[stop:]

    def take(self, chunk: bytes) -> bytes:
        """What the client gets for ``chunk``, just fed: the chunk itself, or with ``strip_usage``
        every event completed and not yet taken, usage-only ones left out."""
        if not self.strip_usage:
            return chunk
        out = bytes(self._out)
        self._out.clear()
        return out

    def rest(self) -> bytes:
        """With ``strip_usage``, what is held back once the stream ends or fails: the bytes not
        taken (an unfinished event is the engine's, forwarded as is); ``b""`` otherwise."""
        if not self.strip_usage:
            return b""
        out = bytes(self._out + self._buf)
        self._out.clear()
        self._buf.clear()
        return out

    def _event(self, event: bytes) -> tuple[int, bool]:
        """(content events: 0 or 1, whether it is a usage-only event)."""
        data = b"".join(line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return 0, False
        if data.strip() == b"[DONE]":
            self.done = True
            return 0, False
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return 0, False
        if not isinstance(obj, dict):
            return 0, False
        if "error" in obj:
            self.error_event = True
        u = _usage_tokens(obj)
        if u is not None:
            self.usage_tokens = u
            self.prompt_tokens = _usage_tokens(obj, "prompt_tokens")
        if _has_content(obj):
            self.content_events += 1
            return 1, False
        return 0, obj.get("choices") == [] and isinstance(obj.get("usage"), dict)

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.content_events


class BodyObserver:
    """Non-streaming: keep a bounded copy of the body to read ``usage`` at the end."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.overflow = False
        self._parsed: tuple[int, dict | None] | None = None   # (body length parsed, its JSON object)

    def feed(self, chunk: bytes) -> None:
        if not self.overflow:
            if len(self._buf) + len(chunk) > MAX_BODY_COPY:
                self.overflow = True
                self._buf = bytearray()
            else:
                self._buf += chunk

    def usage(self, key: str = "completion_tokens") -> int | None:
        """``usage[key]`` of the body (None: overflowed, not JSON or not reported); the body is
        parsed once, at the first call after the last chunk."""
        if self.overflow:
            return None
        if self._parsed is None or self._parsed[0] != len(self._buf):
            try:
                obj = orjson.loads(bytes(self._buf))
            except orjson.JSONDecodeError:
                obj = None
            self._parsed = (len(self._buf), obj if isinstance(obj, dict) else None)
        obj = self._parsed[1]
        return _usage_tokens(obj, key) if obj is not None else None

    @property
    def tokens(self) -> int | None:
        return self.usage()


def error_event(message: str, code: int = 502) -> bytes:
    """An SSE event carrying an OpenAI-style error (how a stream that cannot go on ends)."""
    return b"data: " + orjson.dumps({"error": {"message": message, "type": "upstream_error", "code": code}}) + b"\n\n"
