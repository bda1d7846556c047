"""Prompt extraction, token estimate and prefix block hashes for OpenAI-style bodies.

Without a tokenizer the gateway uses the ``estimate`` backend llm-d uses: about 4 bytes
per token. Prefix blocks are hashed over the prompt's UTF-8 bytes, ``block_tokens`` x
``BYTES_PER_TOKEN`` bytes each, chained (each hash covers the whole prefix up to its
block), as llm-d's approximate prefix producer hashes token blocks.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

BYTES_PER_TOKEN = 4


class BodyError(ValueError):
    """The request body is not a valid completion request; ``field`` names the culprit."""

    def __init__(self, field: str, msg: str) -> None:
        self.field = field
        self.msg = msg
        super().__init__(f"{field}: {msg}")

    def to_json(self) -> dict:
        return {"error": {"message": f"{self.field}: {self.msg}", "type": "invalid_request_error",
                          "param": self.field, "code": None},
                "detail": [{"loc": ["body", *self.field.split(".")], "msg": self.msg,
                            "type": "value_error"}]}


@dataclass(frozen=True)
class PromptInfo:
    text: bytes            # the prompt as the engine will see it (approximately)
    input_tokens: int      # estimated prompt tokens
    streaming: bool
    model: str
    max_tokens: int | None


def _content_text(content: Any, loc: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                t = part.get("text")
                if isinstance(t, str):
                    parts.append(t)
            else:
                raise BodyError(f"{loc}.{i}", "content part must be a string or an object")
        return "".join(parts)
    raise BodyError(loc, "content must be a string or a list of parts")


def extract_prompt(body: Any, chat: bool) -> PromptInfo:
    """Validate the fields the gateway needs and estimate the prompt; never raises but BodyError."""
    if not isinstance(body, dict):
        raise BodyError("body", "must be a JSON object")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BodyError("messages", "field required: a non-empty list of messages")
        pieces = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise BodyError(f"messages.{i}", "must be an object")
            role = m.get("role")
            if not isinstance(role, str):
                raise BodyError(f"messages.{i}.role", "field required: a string")
            pieces.append(f"<{role}>\n{_content_text(m.get('content'), f'messages.{i}.content')}\n")
        text = "".join(pieces)
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            text = p
        elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            text = "".join(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            # token ids: count them exactly, hash their decimal form
            return PromptInfo(",".join(map(str, p)).encode(), len(p), _stream(body), _model(body),
                              _max_tokens(body))
        else:
            raise BodyError("prompt", "field required: a string, a list of strings or a list of token ids")
    raw = text.encode("utf-8", "surrogatepass")
    return PromptInfo(raw, (len(raw) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN, _stream(body),
                      _model(body), _max_tokens(body))


def _stream(body: dict) -> bool:
    s = body.get("stream", False)
    if s is None:   # as OpenAI: null is the default
        return False
    if not isinstance(s, bool):
        raise BodyError("stream", "must be a boolean")
    return s


def _model(body: dict) -> str:
    m = body.get("model", "")
    if m is None:
        return ""
    if not isinstance(m, str):
        raise BodyError("model", "must be a string")
    return m


def _max_tokens(body: dict) -> int | None:
    for key in ("max_tokens", "max_completion_tokens", "n_predict"):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < -1:
            raise BodyError(key, "must be a non-negative integer")
        return v
    return None


def block_hashes(text: bytes, block_tokens: int, max_blocks: int) -> list[int]:
    """Chained hashes of the full blocks of ``text`` (a partial last block is not hashed).

    64-bit, with Python's keyed hash (SipHash of each block, combined with the previous
    hash): about 3x cheaper per block than a hashlib call, which is most of a decision's
    prefix cost on long prompts (``bench_epp --mode prefix``). The values are specific to
    the process (``PYTHONHASHSEED``); the prefix index that uses them never leaves it.
    The blocks are cut by ``struct`` (one call per 64 of them): the same bytes as slicing
    in Python, at a fraction of the cost.
    """
    if not isinstance(text, bytes):
        text = bytes(text)
    size = block_tokens * BYTES_PER_TOKEN
    n = min(len(text) // size, max_blocks)
    out: list[int] = []
    append = out.append
    prev = 0
    for first in range(0, n, _UNPACK_BLOCKS):
        for block in _unpacker(size, min(_UNPACK_BLOCKS, n - first)).unpack_from(text, first * size):
            prev = hash((prev, block))
            append(prev)
    return out


_UNPACK_BLOCKS = 64


@functools.lru_cache(maxsize=256)
def _unpacker(size: int, blocks: int) -> struct.Struct:
    """Cuts ``blocks`` consecutive blocks of ``size`` bytes."""
    return struct.Struct("<" + f"{size}s" * blocks)
