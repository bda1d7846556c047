"""P/D disaggregation (B4.7) through ``build_scheduler``: the disagg profile
handler's stage orders, the stage headers, the
decision counters, and predicted latency with P/D (TTFT trained on the prefill endpoint,
TPOT on the decode endpoint, ``pod_type`` in every row).
"""
from __future__ import annotations

import prometheus_client
import pytest

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.metrics import EppCollector
from epp_client.predictor import InProcessPredictor
from epp_client.training import ListSink
from features.loaded import LoadedBundle
from support.pd import ROLE, pd_config, pool, req, sched


# -- decode-first -----------------------------------------------------------------------
def test_decode_first_runs_prefill_when_the_decider_says_yes_and_sets_the_header():
    s = sched(pd_config(decider_params={"nonCachedTokens": 512}))
    r = req(2000)
    res = s.schedule(r, pool())
    assert res.ok and res.endpoint.name == "d0" and res.decision == "prefill-decode"
    assert {k: e.name for k, e in res.picks.items()} == {"decode": "d0", "prefill": "p0"}
    assert s.primary_profile == "decode"
    s.pre_request(r, res)
    assert r.headers["x-prefiller-host-port"] == "10.0.2.0:8200"
    assert "x-encoder-hosts-ports" not in r.headers
    assert s.profile_handler.decisions == {("unknown", "prefill-decode"): 1}


def test_decode_only_removes_a_client_supplied_prefill_header():
    s = sched(pd_config(decider_params={"nonCachedTokens": 512}))
    r = req(100, **{"x-prefiller-host-port": "evil:1"})
    res = s.schedule(r, pool())
    assert res.ok and res.decision == "decode-only" and set(res.profiles) == {"decode"}
    s.pre_request(r, res)
    assert "x-prefiller-host-port" not in r.headers


def test_no_prefill_endpoint_falls_back_to_decode_only():
    s = sched(pd_config("always-disagg-pd-decider"))
    r = req(4000)
    res = s.schedule(r, pool(prefill_roles=()))
    assert res.ok and res.decision == "decode-only"
    s.pre_request(r, res)
    assert "x-prefiller-host-port" not in r.headers


def test_no_decode_endpoint_fails_and_counts_no_decision():
    s = sched(pd_config("always-disagg-pd-decider"))
    res = s.schedule(req(4000), pool(decode_queue=()))
    assert not res.ok and res.status == 429 and res.decision == ""
    assert not s.profile_handler.decisions
    assert s.profile_handler.prefill_decider.decisions == {}  # not asked


# -- prefill-first ----------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["prefill-first", "prefill_first", "PrefillFirst", "prefill"])
def test_prefill_first_always_runs_prefill_then_decode(spelling):
    s = sched(pd_config(None, stage_order=spelling))
    r = req(10)
    res = s.schedule(r, pool())
    assert res.decision == "prefill-decode" and res.endpoint.name == "d0" and res.picks["prefill"].name == "p0"
    s.pre_request(r, res)
    assert r.headers["x-prefiller-host-port"] == "10.0.2.0:8200"


def test_prefill_first_without_prefill_endpoints_is_decode_only():
    s = sched(pd_config(None, stage_order="prefill-first"))
    assert s.schedule(req(10), pool(prefill_roles=())).decision == "decode-only"


def test_prefill_first_rejects_a_prefill_decider():
    with pytest.raises(ConfigError) as e:
        sched(pd_config("always-disagg-pd-decider", stage_order="prefill-first"))
    assert "deciders.prefill" in e.value.param


@pytest.mark.parametrize("mutate, where", [
    (lambda c: c["plugins"][-1]["parameters"].update(stageOrder="sideways"), "stageOrder"),
    (lambda c: c["plugins"][-1]["parameters"].update(deciders={"prefill": "queue-scorer"}), "deciders.prefill"),
    (lambda c: c["plugins"][-1]["parameters"].update(deciderPluginName="x"), "deciderPluginName"),  # mixed
    (lambda c: c["plugins"][-2].update(parameters={"nonCachedTokens": -1}), "nonCachedTokens"),
    (lambda c: c["schedulingProfiles"].pop(0), "schedulingProfiles"),  # no decode profile
])
def test_invalid_handler_configs_name_the_parameter(mutate, where):
    cfg = pd_config()
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        sched(cfg)
    assert where in e.value.param


def test_legacy_flat_parameters_are_accepted():
    cfg = pd_config(decider_params={"nonCachedTokens": 10})
    cfg["plugins"][-1]["parameters"] = {"deciderPluginName": "prefix-based-pd-decider", "decodeProfile": "decode"}
    assert sched(cfg).schedule(req(500), pool()).decision == "prefill-decode"


def test_prefill_decode_endpoints_serve_both_profiles():
    s = sched(pd_config("always-disagg-pd-decider"))
    eps = [Endpoint(name="a", address="h1", port=1, labels={ROLE: "both"}, metrics=EndpointMetrics(waiting_queue_size=0)),
           Endpoint(name="b", address="::1", port=2, labels={ROLE: "prefill-decode"},
                    metrics=EndpointMetrics(waiting_queue_size=5))]
    r = req(100)
    res = s.schedule(r, eps)
    assert res.picks["decode"].name == "a" and res.picks["prefill"].name == "a"
    eps[0].metrics.waiting_queue_size = 9
    res = s.schedule(r, eps)
    s.pre_request(r, res)
    assert r.headers["x-prefiller-host-port"] == "[::1]:2"  # Go's JoinHostPort brackets IPv6


# -- decision counters ------------------------------------------------------------------
def test_decision_counter_is_exported_per_model_and_type():
    s = sched(pd_config(decider_params={"nonCachedTokens": 512}))
    for tokens, model in ((2000, "m1"), (2000, "m1"), (10, "m1"), (10, "")):
        s.schedule(InferenceRequest(input_tokens=tokens, target_model=model), pool())
    reg = prometheus_client.CollectorRegistry()
    reg.register(EppCollector(scheduler=s))

    def val(model, decision):
        return reg.get_sample_value("llm_d_epp_disagg_decision_total", {
            "plugin_name": "disagg-profile-handler", "plugin_type": "disagg-profile-handler",
            "model_name": model, "decision_type": decision})
    assert (val("m1", "prefill-decode"), val("m1", "decode-only"), val("unknown", "decode-only")) == (2, 1, 1)


# -- predicted latency with P/D ---------------------------------------------------------
class RecordingPredictor(InProcessPredictor):
    def __init__(self):
        bundle = LoadedBundle.builtin_prior()
        super().__init__(lambda: bundle)
        self.rows: list[list[dict]] = []

    def predict_bulk(self, rows):
        self.rows.append([dict(r) for r in rows])
        return super().predict_bulk(rows)


def test_a_disaggregated_prompt_is_in_flight_prefill_work_only_on_its_prefill_endpoint():
    # the decode endpoint receives the prompt's KV; counting its tokens there (upstream) made a
    # decode endpoint look like a server with every remote prefill queued (docs/pd.md)
    s = sched(pd_config("prefix-based-pd-decider", {"nonCachedTokens": 2048}))
    long, short = req(3000), req(1600)
    res = s.schedule(long, pool(), now=0.0)
    s.pre_request(long, res, now=0.0)
    d = res.picks["decode"].name
    assert res.decision == "prefill-decode"
    assert (s.inflight.snapshot("p0").tokens, s.inflight.snapshot("p0").requests) == (3000, 1)
    assert (s.inflight.snapshot(d).tokens, s.inflight.snapshot(d).requests) == (0, 1)
    res = s.schedule(short, pool(), now=0.1)
    s.pre_request(short, res, now=0.1)
    assert res.decision == "decode-only" and s.inflight.snapshot(res.endpoint.name).tokens == 1600
    s.on_first_chunk(long.request_id, now=0.5)
    s.on_complete(long.request_id, now=1.0)
    assert s.inflight.snapshot(d).requests == (1 if res.endpoint.name == d else 0)
    assert s.inflight.snapshot("p0").tokens == 0


def test_pd_predictions_carry_pod_type_and_train_ttft_on_prefill_tpot_on_decode():
    pred, sink = RecordingPredictor(), ListSink()
    s = sched(pd_config("always-disagg-pd-decider", producer=True), predictor=pred, sink=sink)
    r = InferenceRequest(input_tokens=3000, streaming=True,
                         headers={"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "100"})
    res = s.schedule(r, pool(), now=0.0)
    assert [row.get("pod_type") for row in pred.rows[0]] == ["decode", "decode", "prefill"]
    assert all(e.prediction is not None for e in res.candidates)  # one call for all, before the profiles
    s.pre_request(r, res, now=0.0)
    assert s.inflight.snapshot("p0").requests == 1 and s.inflight.snapshot("d0").requests == 1
    s.on_first_chunk(r.request_id, now=0.5)
    assert s.inflight.snapshot("p0").requests == 0  # the prefill entry ends at the first chunk
    s.on_chunk(r.request_id, now=0.6)
    s.on_complete(r.request_id, now=1.5, output_tokens=11)
    ttft, tpot = [e for e in sink.entries if e["actual_tpot_ms"] == 0], [e for e in sink.entries if e["actual_tpot_ms"] > 0]
    assert len(ttft) == 1 and ttft[0]["pod_type"] == "prefill" and ttft[0]["actual_ttft_ms"] == pytest.approx(500)
    p0 = next(e for e in res.candidates if e.name == "p0")
    assert ttft[0]["predicted_ttft_ms"] == pytest.approx(p0.prediction.ttft_ms)
    assert len(tpot) == 1 and tpot[0]["pod_type"] == "decode"
    d0 = next(e for e in res.candidates if e.name == "d0")
    assert tpot[0]["predicted_tpot_ms"] == pytest.approx(d0.prediction.tpot_ms)
    # a prefill endpoint is never TPOT-invalid: it does not decode
    assert p0.prediction.tpot_valid


# -- gateway ----------------------------------------------------------------------------
def test_gateway_dispatch_sends_the_prefill_host_port_upstream():
    import asyncio

    from gateway.routing import to_endpoint
    from gateway.scrape import EndpointState

    s = sched(pd_config(decider_params={"nonCachedTokens": 512}))
    eps = [to_endpoint(EndpointState("dec", "http://127.0.0.1:9001", labels={ROLE: "decode"})),
           to_endpoint(EndpointState("pre", "http://127.0.0.1:9002", labels={ROLE: "prefill"}))]
    for e in eps:
        e.prefix_match = PrefixMatch(0, 100, 16)

    def dispatched(tokens):
        req = InferenceRequest("r%d" % tokens, {"x-prefiller-host-port": "client:1"}, 0, tokens, "m", True)
        res = asyncio.run(s.aschedule(req, eps))
        s.pre_request(req, res)
        return res, req.headers
    (r_long, h_long), (r_short, h_short) = dispatched(4000), dispatched(10)
    assert [e.name for e in r_long.picked] == ["dec"] and h_long["x-prefiller-host-port"] == "127.0.0.1:9002"
    assert [e.name for e in r_short.picked] == ["dec"] and "x-prefiller-host-port" not in h_short
