"""The gateway asks the engine for usage on every stream and removes the usage chunk the client
did not ask for (``gateway.usage``, ``sse.StreamObserver`` with ``strip_usage``)."""
from __future__ import annotations

import httpx
import orjson
import pytest

from fake_engine import engines  # noqa: F401 (fixture)
from gateway.sse import StreamObserver
from gateway.usage import ask_for_usage
from test_gateway_proxy import CompletionUsage, start_gateway, wait_until

CHAT = ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                 "stream": True})
COMPLETION = ("/v1/completions", {"model": "m", "prompt": "hello world", "max_tokens": 6, "stream": True})


def events(stream: bytes) -> list[bytes]:
    """The stub engine's events (each ends with a blank line), terminators kept."""
    return [e + b"\n\n" for e in stream.split(b"\n\n") if e]


def is_usage_chunk(event: bytes) -> bool:
    return event.startswith(b"data: {") and orjson.loads(event[6:]).get("choices") == []


# ---- the request ------------------------------------------------------------------------
def asks(raw_body: dict, enabled: bool = True):
    raw = orjson.dumps(raw_body)
    fwd = ask_for_usage(raw, raw_body, enabled)
    return raw, fwd, orjson.loads(fwd.body)


@pytest.mark.parametrize("stream_options", [None, {}, {"include_usage": False}, {"include_usage": None}])
def test_a_stream_whose_client_did_not_ask_asks_for_usage(stream_options):
    body = {"model": "m", "prompt": "p", "stream": True}
    if stream_options is not None:
        body["stream_options"] = stream_options
    raw, fwd, sent = asks(body)
    assert fwd.strip_usage and sent == {**body, "stream_options": {"include_usage": True}}


def test_vllm_continuous_usage_stays_off_when_the_client_had_it_without_include_usage():
    _, fwd, sent = asks({"prompt": "p", "stream": True,
                         "stream_options": {"include_usage": False, "continuous_usage_stats": True}})
    assert fwd.strip_usage and sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}


@pytest.mark.parametrize("body,enabled", [
    ({"prompt": "p", "stream": True, "stream_options": {"include_usage": True}}, True),   # the client asked
    ({"prompt": "p", "stream": True, "stream_options": {"include_usage": 1}}, True),      # loosely, but asked
    ({"prompt": "p", "stream": True, "stream_options": "yes"}, True),                     # the engine's to refuse
    ({"prompt": "p", "stream": False}, True),
    ({"prompt": "p", "stream": None}, True),
    ({"prompt": "p"}, True),
    ({"prompt": "p", "stream": True}, False),                                             # the setting is off
])
def test_other_bodies_are_forwarded_unchanged(body, enabled):
    raw, fwd, _ = asks(body, enabled)
    assert fwd.body is raw and not fwd.strip_usage


def test_a_body_that_is_no_json_object_is_forwarded_unchanged():
    for raw, parsed in ((b"[1, 2]", [1, 2]), (b"not json", None)):
        fwd = ask_for_usage(raw, parsed, True)
        assert fwd.body is raw and not fwd.strip_usage


# ---- the response -----------------------------------------------------------------------
def sse(*objs, end: bytes = b"\n\n") -> list[bytes]:
    return [b"data: " + orjson.dumps(o) + end for o in objs] + [b"data: [DONE]" + end]


TOKENS = [{"choices": [{"index": 0, "text": f"t{i}"}]} for i in range(3)]
USAGE = {"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 3, "total_tokens": 40}}


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n"])
def test_the_usage_chunk_is_stripped_whatever_the_reads_that_split_it(end):
    evs = sse(*TOKENS, USAGE, end=end)
    stream = b"".join(evs)
    want = b"".join(e for e in evs if b'"usage"' not in e)
    for cut in range(1, len(stream)):
        for reads in ([stream[:cut], stream[cut:]], [stream[i:i + cut] for i in range(0, len(stream), cut)]):
            o = StreamObserver(strip_usage=True)
            got = b""
            for r in reads:
                o.feed(r)
                got += o.take(r)
            got += o.rest()
            assert got == want, (cut, reads)
            assert o.prompt_tokens == 37 and o.tokens == 3 and o.content_events == 3 and o.done


def test_only_a_usage_only_chunk_is_stripped():
    last = {"choices": [{"index": 0, "text": "t3", "finish_reason": "length"}], "usage": USAGE["usage"]}
    evs = sse(*TOKENS, last, {"choices": [], "note": "no usage"}, {"error": {"message": "x"}})
    o = StreamObserver(strip_usage=True)
    stream = b"".join(evs)
    o.feed(stream)
    assert o.take(stream) == stream and o.prompt_tokens == 37


def test_an_unfinished_last_event_reaches_the_client_when_the_stream_ends():
    evs = sse(*TOKENS, USAGE)
    stream = b"".join(evs[:3]) + b'data: {"choices": [{"text": "cut'
    o = StreamObserver(strip_usage=True)
    o.feed(stream)
    assert o.take(stream) == b"".join(evs[:3]) and o.rest() == b'data: {"choices": [{"text": "cut'


def test_without_strip_usage_every_chunk_passes_as_fed():
    o = StreamObserver()
    for chunk in sse(*TOKENS, USAGE):
        o.feed(chunk[:5])
        assert o.take(chunk[:5]) == chunk[:5]
    assert o.rest() == b""


# ---- through the gateway, on loopback ----------------------------------------------------
@pytest.mark.parametrize("path,body", [CHAT, COMPLETION])
@pytest.mark.parametrize("piece_bytes", [0, 7])
def test_a_stream_without_include_usage_teaches_the_true_prompt_length_and_looks_untouched(engines, path, body,
                                                                                           piece_bytes):
    eng = engines[0]
    eng.state.piece_bytes = piece_bytes      # 7: the engine writes every event in pieces
    router = CompletionUsage()
    gw, srv = start_gateway([eng.url], router)
    try:
        via = httpx.post(srv.url + path, json=body, headers={"x-request-id": "u1"})
        assert via.status_code == 200
        sent = eng.state.received[-1]
        assert sent["stream_options"] == {"include_usage": True}
        assert {k: v for k, v in sent.items() if k != "stream_options"} == body
        headers = dict(eng.state.raw_headers[-1])
        assert int(headers[b"content-length"]) == len(eng.state.bodies[-1])   # the rewritten body's length
        # what the engine streamed to the gateway: the same request, straight to it
        engine_stream = httpx.post(eng.url + path, json=sent).content
        usage_events = [e for e in events(engine_stream) if is_usage_chunk(e)]
        assert len(usage_events) == 1
        assert via.content == engine_stream.replace(usage_events[0], b"")
        assert b'"usage"' not in via.content and via.content.endswith(b"data: [DONE]\n\n")
        assert wait_until(lambda: gw.records and gw.records[-1].ok)
        rec = gw.records[-1]
        assert router.prompt_tokens[rec.request_id] == 10 != rec.input_tokens   # the engine's count, not the estimate
        assert rec.tokens == body["max_tokens"]
    finally:
        srv.stop()


@pytest.mark.parametrize("stream_options,enabled", [({"include_usage": True}, True), (None, False)])
def test_a_client_that_asked_or_the_setting_off_gets_the_engines_bytes_for_its_own_body(engines, stream_options,
                                                                                        enabled):
    path, body = COMPLETION
    if stream_options is not None:
        body = {**body, "stream_options": stream_options}
    raw = orjson.dumps(body)
    eng = engines[0]
    router = CompletionUsage()
    gw, srv = start_gateway([eng.url], router, stream_usage=enabled)
    try:
        direct = httpx.post(eng.url + path, content=raw).content
        via = httpx.post(srv.url + path, content=raw)
        assert via.status_code == 200 and via.content == direct
        assert eng.state.bodies[-1] == raw                       # the body as the client sent it
        assert (b'"usage"' in via.content) == enabled            # the usage chunk the client asked for
        assert wait_until(lambda: gw.records and gw.records[-1].ok)
        assert router.prompt_tokens[gw.records[-1].request_id] == (10 if enabled else None)
    finally:
        srv.stop()


def test_an_engine_that_ignores_include_usage_streams_intact(engines):
    path, body = CHAT
    eng = engines[0]
    eng.state.usage_chunk = False
    router = CompletionUsage()
    gw, srv = start_gateway([eng.url], router)
    try:
        direct = httpx.post(eng.url + path, json=body).content
        via = httpx.post(srv.url + path, json=body)
        assert via.status_code == 200 and via.content == direct and direct.endswith(b"data: [DONE]\n\n")
        assert eng.state.received[-1]["stream_options"] == {"include_usage": True}
        assert wait_until(lambda: gw.records and gw.records[-1].ok)
        rec = gw.records[-1]
        assert rec.tokens == body["max_tokens"] and router.prompt_tokens[rec.request_id] is None
    finally:
        srv.stop()
