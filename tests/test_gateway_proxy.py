"""Gateway proxy behaviour against a fake OpenAI-compatible streaming engine on loopback."""
from __future__ import annotations

import time

import httpx
import orjson
import pytest

from epp_client.heuristics import LeastLoadScheduler
from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer
from fake_engine import FakeEngine, ServerThread, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.prompt import BodyError, block_hashes, extract_prompt
from gateway.routing import to_endpoint
from gateway.scrape import EndpointState, parse_metrics
from gateway.settings import GatewaySettings, SettingsError
from gateway.sse import StreamObserver


class FixedOrder(LeastLoadScheduler):
    """Test policy: always tries the endpoints in the configured order."""

    name = "fixed"

    def order(self, request, candidates):
        return list(candidates)


def start_gateway(urls, router=None, **kw):
    kw.setdefault("scrape_interval_s", 0.05)
    s = GatewaySettings(endpoints=urls, port=free_port(), **kw)
    gw = Gateway(s, router or FixedOrder())
    srv = ServerThread(build_app(gw), s.port).start()
    return gw, srv


def wait_until(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "m", "prompt": "hello world", "max_tokens": 6, "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "hello world", "max_tokens": 6, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 4, "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
])
@pytest.mark.parametrize("stream_usage", [True, False])
def test_pass_through_is_byte_for_byte(engines, path, body, stream_usage):
    """The client gets the engine's bytes for its own request; a stream's usage chunk only the
    gateway asked for (``stream_usage``, tests/test_gateway_usage.py) is not among them."""
    gw, srv = start_gateway([engines[0].url], stream_usage=stream_usage)
    try:
        direct = httpx.post(engines[0].url + path, json=body).content
        via = httpx.post(srv.url + path, json=body)
        assert via.status_code == 200
        assert via.content == direct
        assert via.headers["x-engine"] == "a"
        rec = gw.records[-1]
        assert rec.ok and rec.tokens == body["max_tokens"]
        if body.get("stream"):
            assert rec.tpot_ms is not None and rec.ttft_ms is not None
        else:
            assert rec.tpot_ms is None and rec.ttft_ms == pytest.approx(rec.e2e_ms)
    finally:
        srv.stop()


class CountingTokens(FixedOrder):
    """FixedOrder that records the tokens each request's chunks report to the policy."""

    def __init__(self):
        super().__init__()
        self.streamed = {}

    def on_first_chunk(self, request_id, now=None, tokens=None):
        super().on_first_chunk(request_id, now, tokens)
        self.streamed[request_id] = [tokens]

    def on_chunk(self, request_id, now=None, tokens=None):
        super().on_chunk(request_id, now, tokens)
        self.streamed[request_id].append(tokens)


def test_the_policy_hears_every_streamed_token(engines):
    """A producer measures each running request's TPOT so far from the tokens its chunks carry."""
    router = CountingTokens()
    gw, srv = start_gateway([engines[0].url], router)
    try:
        via = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 7, "stream": True},
                         headers={"x-request-id": "counted"})
        assert via.status_code == 200
        assert wait_until(lambda: gw.records and gw.records[-1].ok)
        rec = gw.records[-1]
        assert rec.client_request_id == "counted" and via.headers["x-request-id"] == "counted"
        reported = router.streamed[rec.request_id]     # the policy accounts the gateway's own id
        assert reported[0] >= 1 and all(t >= 1 for t in reported) and sum(reported) == 7
    finally:
        srv.stop()


class CompletionUsage(FixedOrder):
    """FixedOrder that records the prompt length each request's completion reports to the policy."""

    def __init__(self):
        super().__init__()
        self.prompt_tokens = {}

    def on_complete(self, request_id, now=None, *, status=200, aborted=False, output_tokens=None,
                    prompt_tokens=None):
        super().on_complete(request_id, now, status=status, aborted=aborted, output_tokens=output_tokens,
                            prompt_tokens=prompt_tokens)
        self.prompt_tokens[request_id] = prompt_tokens


@pytest.mark.parametrize("body,stream_usage,reported", [
    ({"prompt": "x", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}, True, 10),
    ({"prompt": "x", "max_tokens": 3, "stream": True}, True, 10),     # the gateway asked for the usage
    ({"prompt": "x", "max_tokens": 3, "stream": True}, False, None),
    ({"prompt": "x", "max_tokens": 3}, True, 10),
])
def test_the_policy_hears_the_prompt_length_the_engine_reports(engines, body, stream_usage, reported):
    """The engine's usage.prompt_tokens (the true count; the gateway routed with its byte-based
    estimate) reaches the policy's on_complete when the response reports usage: the producer's
    engine sums for learning the twin use it."""
    router = CompletionUsage()
    gw, srv = start_gateway([engines[0].url], router, stream_usage=stream_usage)
    try:
        assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 200
        assert wait_until(lambda: gw.records and gw.records[-1].ok)
        assert router.prompt_tokens[gw.records[-1].request_id] == reported
    finally:
        srv.stop()


def test_streaming_is_forwarded_chunk_by_chunk(engines):
    eng = engines[0]
    eng.state.token_delay = 0.3
    gw, srv = start_gateway([eng.url])
    try:
        body = {"prompt": "x", "max_tokens": 4, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body) as r:
            it = r.iter_raw()
            first = next(it)
            engine_busy_at_first = (eng.state.active, eng.state.completed)
            rest = b"".join(it)
        # the first token arrived while the engine was still streaming (0.9 s of token delays to go)
        assert b"tok0" in first and b"tok3" not in first
        assert engine_busy_at_first == (1, 0)
        assert b"[DONE]" in rest
        rec = gw.records[-1]
        assert rec.tpot_ms >= 290  # 0.3 s between tokens (sleeps only ever last longer)
    finally:
        srv.stop()


def test_ttft_measured_at_first_token_not_role_chunk(engines):
    eng = engines[0]
    eng.state.first_token_delay = 0.4
    gw, srv = start_gateway([eng.url])
    try:
        body = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "stream": True}
        assert httpx.post(srv.url + "/v1/chat/completions", json=body).status_code == 200
        assert gw.records[-1].ttft_ms >= 380
    finally:
        srv.stop()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("failure", ["refused", "error503", "empty", "hang"])
def test_retry_on_other_endpoint_before_first_byte(engines, failure):
    bad, good = engines
    urls = [bad.url, good.url]
    if failure == "refused":
        urls = [dead_url(), good.url]
    else:
        bad.state.mode = failure
    # slow scrapes: the failing endpoint is still a candidate when the request comes
    gw, srv = start_gateway(urls, first_byte_timeout_s=0.5, scrape_interval_s=30)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3, "stream": True})
        assert r.status_code == 200
        assert r.headers["x-engine"] == "b"
        assert good.state.completed == 1
        assert gw.records[-1].attempts == 2
        m = httpx.get(srv.url + "/metrics").text
        assert "latency_gateway_retries_total" in m and f'endpoint="{gw.endpoints[0].name}"' in m
        if failure == "hang":  # the hung upstream request was cancelled, not left running
            assert wait_until(lambda: bad.state.cancelled == 1)
    finally:
        srv.stop()


def test_endpoint_whose_scrapes_fail_is_skipped(engines):
    gw, srv = start_gateway([dead_url(), engines[1].url])
    try:
        assert wait_until(lambda: gw.endpoints[0].scrape_failures >= 3)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 2})
        assert r.status_code == 200 and gw.records[-1].attempts == 1
    finally:
        srv.stop()


def test_all_endpoints_failing_gives_502_naming_upstream(engines):
    for e in engines:
        e.state.mode = "error503"
    gw, srv = start_gateway([e.url for e in engines])
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p"})
        assert r.status_code == 502
        assert "upstream" in r.json()["error"]["message"]
        assert sum(len(e.state.received) for e in engines) == 2
    finally:
        srv.stop()


def last_event(body: bytes) -> dict:
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    return orjson.loads(events[-1][6:])


def test_no_retry_after_first_byte_and_the_stream_ends_with_an_error_event(engines):
    bad, good = engines
    bad.state.mode = "die_mid"
    bad.state.die_after = 2
    gw, srv = start_gateway([bad.url, good.url])
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 5, "stream": True})
        assert r.status_code == 200
        assert b"tok1" in r.content and b"[DONE]" not in r.content  # the client saw the truncation...
        err = last_event(r.content)["error"]                          # ...as an error event, the last one
        assert err["code"] == 502 and "mid-stream" in err["message"]
        assert len(good.state.received) == 0           # and nothing was retried
        assert not gw.records[-1].ok and gw.records[-1].status == 502
        assert gw.endpoints[0].dispatch_failures == 1  # it counts against the engine
        m = httpx.get(srv.url + "/metrics").text
        assert 'latency_gateway_requests_total{path="/v1/completions",status="502"} 1.0' in m
        assert 'status="200"' not in m
    finally:
        srv.stop()


def test_client_disconnect_cancels_upstream(engines):
    eng = engines[0]
    eng.state.token_delay = 0.2
    gw, srv = start_gateway([eng.url])
    try:
        with httpx.stream("POST", srv.url + "/v1/completions",
                          json={"prompt": "p", "max_tokens": 200, "stream": True}) as r:
            next(r.iter_raw())
        # the client closed after the first chunk: the engine must see the disconnect soon,
        # long before its 40 s of tokens
        assert wait_until(lambda: eng.state.cancelled == 1, 5)
        assert eng.state.completed == 0
        assert wait_until(lambda: gw.inflight.snapshot(gw.endpoints[0].name).requests == 0)
        assert 'latency_gateway_client_disconnects_total{stage="response"} 1.0' in httpx.get(srv.url + "/metrics").text
    finally:
        srv.stop()


def test_client_disconnect_before_first_byte_cancels_upstream(engines):
    eng = engines[0]
    eng.state.first_token_delay = 30
    gw, srv = start_gateway([eng.url])
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3}, timeout=0.5)
        assert wait_until(lambda: eng.state.cancelled == 1, 5)
    finally:
        srv.stop()


def test_idle_timeout_cuts_a_stalled_stream(engines):
    eng = engines[0]
    eng.state.token_delay = 5
    gw, srv = start_gateway([eng.url], idle_timeout_s=0.3)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3, "stream": True})
        assert b"tok0" in r.content and "idle-timeout" in last_event(r.content)["error"]["message"]
        assert wait_until(lambda: eng.state.cancelled == 1, 5)
        assert wait_until(lambda: gw.inflight.snapshot(gw.endpoints[0].name).requests == 0)
    finally:
        srv.stop()


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", b"{not json", "body"),
    ("/v1/completions", b'{"model": "m"}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -5}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "x"}]}', "messages.0.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages.0.content"),
])
def test_bad_request_is_4xx_naming_the_field(engines, path, body, field):
    gw, srv = start_gateway([engines[0].url])
    try:
        r = httpx.post(srv.url + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert field in r.json()["error"]["message"]
        assert engines[0].state.received == []
    finally:
        srv.stop()


def test_metrics_scrape_and_gateway_metrics(engines):
    engines[0].state.kv_cache_usage = 0.42
    engines[0].state.waiting = 3
    gw, srv = start_gateway([engines[0].url])
    try:
        assert wait_until(lambda: gw.endpoints[0].metrics.kv_cache_usage == 0.42)
        assert gw.endpoints[0].metrics.waiting == 3
        httpx.post(srv.url + "/v1/completions", json={"prompt": "p", "max_tokens": 3, "stream": True})
        text = httpx.get(srv.url + "/metrics").text
        for name in ("latency_gateway_requests_total", "latency_gateway_decisions_total",
                     "latency_gateway_ttft_seconds_bucket", "latency_gateway_tpot_seconds_bucket",
                     "latency_gateway_fallbacks_total", "latency_gateway_admission_denied_total"):
            assert name in text
        assert 'latency_gateway_endpoint_kv_cache_usage{endpoint="%s"} 0.42' % gw.endpoints[0].name in text
    finally:
        srv.stop()


def test_prefix_index_records_dispatches_per_endpoint(engines):
    gw, srv = start_gateway([e.url for e in engines])
    try:
        shared = "system prompt " * 200  # ~2800 bytes: 10 blocks of 64 tokens
        httpx.post(srv.url + "/v1/completions", json={"prompt": shared + "first question", "max_tokens": 1})
        r = gw.records[-1]
        assert r.prefix_match_blocks == 0 and r.prefix_total_blocks == 10
        httpx.post(srv.url + "/v1/completions", json={"prompt": shared + "second question", "max_tokens": 1})
        r = gw.records[-1]
        assert r.prefix_match_blocks == 10
        # the other endpoint never saw it
        _, hashes = gw.request_info({}, {"prompt": shared}, False)
        assert gw.prefix.match(gw.endpoints[1].name, hashes).match_blocks == 0
    finally:
        srv.stop()


# ---- pure pieces -------------------------------------------------------------------------

def test_prefix_index_lru_and_chaining():
    idx = ApproxPrefixProducer(block_size_tokens=1, lru_capacity_per_endpoint=4)
    a = block_hashes(b"aaaabbbbccccdddd", 1, 100)
    b = block_hashes(b"aaaaXXXXccccdddd", 1, 100)
    assert len(a) == 4 and a[0] == b[0] and a[2] != b[2]  # chained: a change poisons what follows
    idx.record("e", a)
    assert idx.match("e", a).match_blocks == 4
    assert idx.match("e", b).match_blocks == 1
    idx.record("e", block_hashes(b"zzzzyyyy", 1, 100))  # evicts the two oldest
    assert idx.size("e") == 4 and idx.match("e", a).match_blocks == 0
    assert idx.match("other", a).score == 0.0


def test_block_hashes_chain_every_full_block_across_unpack_batches():
    """Each hash is hash((previous hash, block bytes)), also past the 64 blocks cut per
    struct call; a partial last block and blocks past max_blocks are left out."""
    text = bytes(range(256)) * 130 + b"tail"     # 130 full 256-byte blocks (64 tokens each)
    expect, prev = [], 0
    for i in range(0, 130 * 256, 256):
        prev = hash((prev, text[i:i + 256]))
        expect.append(prev)
    assert block_hashes(text, 64, 2048) == expect
    assert block_hashes(bytearray(text), 64, 100) == expect[:100]
    assert block_hashes(text[:255], 64, 10) == []


def test_prompt_estimate_and_errors():
    p = extract_prompt({"prompt": "x" * 41, "stream": True, "max_tokens": 7}, chat=False)
    assert p.input_tokens == 11 and p.streaming and p.max_tokens == 7
    assert extract_prompt({"prompt": [1, 2, 3]}, chat=False).input_tokens == 3
    c = extract_prompt({"messages": [{"role": "user", "content": [{"type": "text", "text": "ab"}]}]}, chat=True)
    assert c.input_tokens > 0
    with pytest.raises(BodyError) as e:
        extract_prompt({"prompt": None}, chat=False)
    assert e.value.field == "prompt"


def test_metric_name_mapping_vllm_and_llamacpp():
    v = parse_metrics('vllm:kv_cache_usage_perc{model_name="a"} 0.5\nvllm:num_requests_waiting{model_name="a"} 2\n'
                      'vllm:num_requests_running{model_name="a"} 1\n'
                      'vllm:lora_requests_info{max_lora="3",running_lora_adapters="x",waiting_lora_adapters="y,z"} 5\n')
    assert (v.kv_cache_usage, v.waiting, v.running, v.max_lora) == (0.5, 2, 1, 3)
    assert v.active_lora == {"x"} and v.waiting_lora == {"y", "z"}
    ll = parse_metrics("# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
                       "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 3\n"
                       "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n")
    assert (ll.kv_cache_usage, ll.running, ll.waiting) == (0.25, 3, 1)
    assert parse_metrics("other_metric 1\n").kv_cache_usage is None


def test_the_engines_kv_cache_size_is_read_from_its_cache_config_info():
    # vLLM's info gauge: the configuration as labels, value 1 (num_gpu_blocks is "None" until profiled)
    v = parse_metrics('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",'
                      'cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",'
                      'num_gpu_blocks="31250",num_cpu_blocks="None"} 1.0\n')
    assert (v.cache_num_blocks, v.cache_block_size) == (31_250, 16)
    ep = to_endpoint(EndpointState(name="e", url="http://127.0.0.1:9", metrics=v))
    assert ep.metrics is not None and ep.metrics.kv_capacity_tokens == 500_000
    sg = parse_metrics('sglang:cache_config_info{num_pages="2000",page_size="64"} 1\n')
    assert (sg.cache_num_blocks, sg.cache_block_size) == (2_000, 64)
    for bad in ('num_gpu_blocks="None",block_size="16"', 'num_gpu_blocks="0",block_size="16"',
                'num_gpu_blocks="12x",block_size="16"', 'block_size="16"'):
        m = parse_metrics(f"vllm:cache_config_info{{{bad}}} 1\n")
        assert (m.cache_num_blocks, m.cache_block_size) == (0, 0), bad


def test_sse_observer_counts_tokens_across_split_chunks():
    ev = b"".join(b"data: " + orjson.dumps({"choices": [{"text": f"t{i}"}]}) + b"\n\n" for i in range(5))
    o = StreamObserver()
    n = sum(o.feed(ev[i:i + 7]) for i in range(0, len(ev), 7))
    assert n == 5 and o.tokens == 5
    o.feed(b'data: {"choices": [], "usage": {"completion_tokens": 9}}\r\n\r\ndata: [DONE]\n\n')
    assert o.tokens == 9 and o.done


def test_settings_validation_names_the_setting():
    with pytest.raises(SettingsError, match="LATENCY_GATEWAY_ENDPOINTS"):
        GatewaySettings(endpoints=[])
    with pytest.raises(SettingsError, match="LATENCY_GATEWAY_ENDPOINTS.*ftp://x"):
        GatewaySettings(endpoints=["ftp://x"])
    with pytest.raises(SettingsError, match="LATENCY_GATEWAY_ENDPOINTS: duplicate"):
        GatewaySettings(endpoints=["http://127.0.0.1:1", "http://127.0.0.1:1/"])
    with pytest.raises(SettingsError, match="LATENCY_GATEWAY_IDLE_TIMEOUT_S"):
        GatewaySettings(endpoints=["http://127.0.0.1:1"], idle_timeout_s=0)
    with pytest.raises(SettingsError, match="record_capacity"):  # set by keyword only: named by its attribute
        GatewaySettings(endpoints=["http://127.0.0.1:1"], record_capacity=0)
    with pytest.raises(SettingsError, match="LATENCY_GATEWAY_PORT: must be an integer, got 'x'"):
        GatewaySettings.from_env_and_args({"endpoints": ["http://127.0.0.1:1"]}, {"LATENCY_GATEWAY_PORT": "x"})
    # a flag wins over its variable; a blank variable counts as unset
    s = GatewaySettings.from_env_and_args({"endpoints": None, "port": 9, "log_level": "info"},
                                          {"LATENCY_GATEWAY_ENDPOINTS": "http://a:1, http://b:2/",
                                           "LATENCY_GATEWAY_PORT": "x", "TRAINING_SERVER_URL": " "})
    assert (s.endpoints, s.port, s.training_url) == (["http://a:1", "http://b:2"], 9, None)


def test_cli_command_serves_and_rejects_bad_settings(engines, tmp_path):
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "latency_cli.main", "gateway", "--endpoints", "ftp://x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "LATENCY_GATEWAY_ENDPOINTS" in bad.stderr and "ftp://x" in bad.stderr
    port = free_port()
    cfg = tmp_path / "epp.yaml"
    cfg.write_text("plugins:\n- type: queue-scorer\n- type: max-score-picker\n")
    p = subprocess.Popen([sys.executable, "-m", "latency_cli.main", "gateway", "--endpoints",
                          ",".join(e.url for e in engines), "--port", str(port), "--config", str(cfg)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(up, 30), p.stderr.read1().decode() if p.poll() is not None else "not up"
        r = httpx.post(url + "/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True})
        assert r.status_code == 200 and b"[DONE]" in r.content
        assert r.headers["x-engine"] in ("a", "b")
    finally:
        p.terminate()
        p.wait(10)
