"""Incremental reading of an OpenAI-style response to count generated tokens.

The bytes are never modified: the gateway forwards every chunk as received and only
*observes* it here. Streaming responses are split into SSE events; an event carrying text
(``choices[].text`` or ``choices[].delta.content``) counts as one token unless the
response reports usage (``usage.completion_tokens``), which wins (epp-plugins A.2.6).
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
    """Feed raw SSE bytes; tells when the first content event arrives and counts tokens."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.content_events = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None     # usage.prompt_tokens, when the stream reports usage
        self.done = False
        self.error_event = False

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
                    self._buf = bytearray()
                return new
            if j >= 0 and (i < 0 or j < i):
                event, self._buf = bytes(buf[:j]), buf[j + 4:]
            else:
                event, self._buf = bytes(buf[:i]), buf[i + 2:]
            new += self._event(event)

    def _event(self, event: bytes) -> int:
        data = b"".join(line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return 0
        if data.strip() == b"[DONE]":
            self.done = True
            return 0
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return 0
        if not isinstance(obj, dict):
            return 0
        if "error" in obj:
            self.error_event = True
        u = _usage_tokens(obj)
        if u is not None:
            self.usage_tokens = u
            self.prompt_tokens = _usage_tokens(obj, "prompt_tokens")
        if _has_content(obj):
            self.content_events += 1
            return 1
        return 0

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
