"""The ``predicted-latency-producer``'s view of an endpoint for the engine twin: its running
requests in dispatch order, prefilling (before the first chunk) or decoding (after)."""
from __future__ import annotations

from epp_client.engine.twin import Running
from epp_client.plugins.producer.request_state import RequestContext, RunningQueue
from epp_client.plugins.producer.twin_view import running_on


def _ctx(rid, dispatch, ttft_ms=0.0, tokens=0, tokens_known=True, uncached=None, pace=0.0):
    ctx = RequestContext(rid, 1000)
    ctx.dispatch, ctx.ttft_ms, ctx.tokens, ctx.tokens_known = dispatch, ttft_ms, tokens, tokens_known
    ctx.uncached = 1000 if uncached is None else uncached
    ctx.predictions = {"a": (100.0, pace)}
    return ctx


def test_decoding_then_prefilling_requests_in_dispatch_order():
    q = RunningQueue()
    ctxs = {c.request_id: c for c in (
        _ctx("dec-counted", 10.0, ttft_ms=500.0, tokens=40),
        _ctx("dec-paced", 11.0, ttft_ms=200.0, tokens_known=False, pace=100.0),
        _ctx("head", 12.0, uncached=300),
        _ctx("behind", 13.0),
    )}
    for rid, slo in (("dec-counted", 25.0), ("dec-paced", 0.0), ("gone", 5.0), ("head", 30.0), ("behind", 0.0)):
        q.add("a", rid, slo)
    got = running_on("a", 14.0, q, ctxs, first_token_at={"a": 12.5})
    assert got == (
        Running(3500.0, 40, 25.0, 1040),               # 4 s since dispatch − 0.5 s TTFT, 40 tokens counted
        Running(2800.0, 29, 0.0, 1029),                 # tokens from its predicted TPOT: 1 + 2800 // 100
        Running(0.0, 0, 30.0, 1000, 300, 1500.0),       # head of the queue: prefilling since the last first token
        Running(0.0, 0, 0.0, 1000, 1000, 0.0),          # behind it: not yet started
    )
    assert running_on("b", 14.0, q, ctxs, {}) == ()
