"""``predicted-pd-decider``: disaggregate when the prefill pool's predicted TTFT plus the
KV transfer beats prefilling on the decode endpoint, or when that local prefill would
push the decode endpoint's running requests past their TPOT budget.

The predictor here is a deterministic table (TTFT by role and queue length) so that each
rule's boundary can be placed exactly; the rows it receives are the producer's real rows."""
from __future__ import annotations

import math
import random

import pytest

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest, PrefixMatch
from epp_client.framework.loader import build_scheduler
from epp_client.plugins.decider.predicted import PredictedPDDecider, kv_transfer_ms
from epp_client.predictor import BulkPrediction

ROLE = "llm-d.ai/role"


class TablePredictor:
    """TTFT = base[pod_type] + 100 ms per waiting request; TPOT = tpot ms."""

    def __init__(self, decode_ttft: float, prefill_ttft: float, tpot: float = 20.0) -> None:
        # a prefill-decode endpoint's rows carry no pod_type: it predicts like a prefill one here
        self.base = {"decode": decode_ttft, "prefill": prefill_ttft, "": prefill_ttft}
        self.tpot = tpot

    def predict_bulk(self, rows):
        return BulkPrediction([self.base[r.get("pod_type", "")] + 100.0 * r["num_request_waiting"] for r in rows],
                              [self.tpot] * len(rows), "table")


def config(**params) -> dict:
    return {"plugins": [
        {"type": "predicted-latency-producer", "parameters": {"endpointRoleLabel": ROLE, "streamingMode": True}},
        {"type": "decode-filter"}, {"type": "prefill-filter"}, {"type": "queue-scorer"}, {"type": "max-score-picker"},
        {"type": "predicted-pd-decider", "parameters": params},
        {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "predicted-pd-decider"}}}],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]},
            {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "queue-scorer"}]}]}


def pool(decode_running=0, prefill_waiting=0, cached_blocks=0, prefill_role="prefill"):
    return [Endpoint(name="d0", address="10.0.0.1", port=8000, labels={ROLE: "decode"},
                     metrics=EndpointMetrics(running_requests_size=decode_running),
                     prefix_match=PrefixMatch(cached_blocks, 200, 16)),
            Endpoint(name="p0", address="10.0.0.2", port=8000, labels={ROLE: prefill_role},
                     metrics=EndpointMetrics(waiting_queue_size=prefill_waiting), prefix_match=PrefixMatch(0, 200, 16))]


def run(pred, tokens=3000, headers=None, **kw):
    s = build_scheduler(config(**kw), predictor=pred, rng=random.Random(1))
    res = s.schedule(InferenceRequest(input_tokens=tokens, streaming=True, headers=headers or {}), pool_args(kw))
    return s, res


_POOL: dict = {}


def pool_args(_kw):
    return pool(**_POOL)


@pytest.fixture(autouse=True)
def _reset_pool():
    _POOL.clear()
    yield


def test_transfer_time_formula():
    # 3000 tokens x 131072 B / 25 GB/s = 15.73 ms
    assert kv_transfer_ms(3000, 131072, 25.0) == pytest.approx(3000 * 131072 / 25e9 * 1e3)
    assert PredictedPDDecider(transfer_latency_ms=2.0).transfer_ms(3000) == pytest.approx(2.0 + 15.728640)


def test_ttft_rule_boundary():
    # a prefill-only endpoint's predicted TTFT is the path's TTFT: remote 500 vs local 501 -> yes
    s, res = run(TablePredictor(decode_ttft=501, prefill_ttft=500))
    assert res.decision == "prefill-decode" and s.profile_handler.prefill_decider.reasons["ttft"] == 1
    s, res = run(TablePredictor(decode_ttft=500, prefill_ttft=500))
    assert res.decision == "decode-only"


def test_prefill_only_endpoint_ttft_already_contains_the_transfer():
    # A disaggregated request's TTFT sample is its prefill endpoint's row and measures
    # prefill + KV transfer + first decode step, so a prefill endpoint's predicted TTFT
    # includes the transfer: remote 500 beats local 500 + transfer / 2 (adding the 15.7 ms
    # transfer again would keep the prefill local).
    transfer = kv_transfer_ms(3000, 131072, 25.0)
    s, res = run(TablePredictor(decode_ttft=500 + transfer / 2, prefill_ttft=500))
    assert res.decision == "prefill-decode" and res.picks["prefill"].name == "p0"
    assert s.profile_handler.prefill_decider.remote_ttft_ms(res.picks["prefill"], 3000) == pytest.approx(500)


def test_a_decode_capable_remote_pays_the_transfer_of_the_uncached_tokens():
    # p0 also decodes (prefill-decode): its TTFT samples are local prefills, so the path
    # through it adds the transfer of what d0 lacks. One waiting request on p0 (TTFT +100)
    # makes the decode profile pick d0.
    transfer = kv_transfer_ms(3000, 131072, 25.0)
    _POOL.update(prefill_role="prefill-decode", prefill_waiting=1)
    s, res = run(TablePredictor(decode_ttft=600 + transfer + 1, prefill_ttft=500))
    assert res.picks["decode"].name == "d0" and res.decision == "prefill-decode"
    s, res = run(TablePredictor(decode_ttft=600 + transfer, prefill_ttft=500))
    assert res.decision == "decode-only"
    # 150 of 200 blocks (2400 tokens) cached on d0: only 600 tokens (3.1 ms) travel
    _POOL.update(cached_blocks=150)
    s, res = run(TablePredictor(decode_ttft=605, prefill_ttft=500))
    assert res.decision == "prefill-decode"
    _POOL.update(cached_blocks=0)  # all 3000 to move: 15.7 ms > 5 ms gain
    s, res = run(TablePredictor(decode_ttft=605, prefill_ttft=500))
    assert res.decision == "decode-only"


def test_a_loaded_prefill_pool_keeps_prefill_local():
    _POOL.update(prefill_waiting=3)  # remote TTFT 500 + 300
    s, res = run(TablePredictor(decode_ttft=700, prefill_ttft=500))
    assert res.decision == "decode-only"


def test_tpot_rule_protects_running_decodes():
    # local TTFT 600 < remote 700, but 600 ms of prefill over a 64-token window
    # adds 9.4 ms to TPOT 20 -> 29.4 > SLO 25 while d0 has running requests: disaggregate
    hdr = {"x-llm-d-slo-tpot-ms": "25", "x-llm-d-slo-ttft-ms": "2000"}
    _POOL.update(decode_running=4)
    s, res = run(TablePredictor(decode_ttft=600, prefill_ttft=700), headers=hdr)
    assert res.decision == "prefill-decode" and s.profile_handler.prefill_decider.reasons == {"ttft": 0, "tpot": 1}
    # the same with a looser TPOT SLO (30 > 29.4): keep it local
    s, res = run(TablePredictor(decode_ttft=600, prefill_ttft=700), headers={**hdr, "x-llm-d-slo-tpot-ms": "30"})
    assert res.decision == "decode-only"
    # nobody running on the decode endpoint: no one to protect
    _POOL.update(decode_running=0)
    s, res = run(TablePredictor(decode_ttft=600, prefill_ttft=700), headers=hdr)
    assert res.decision == "decode-only"
    # the remote path would miss the request's TTFT SLO: keep it local
    _POOL.update(decode_running=4)
    s, res = run(TablePredictor(decode_ttft=600, prefill_ttft=700), headers={**hdr, "x-llm-d-slo-ttft-ms": "650"})
    assert res.decision == "decode-only"


def test_tpot_rule_counts_the_stalls_of_the_prefills_it_already_kept_local():
    # TPOT 20, SLO 30: one local prefill of 600 ms adds 600 / 64 = 9.4 ms (29.4 <= 30: local),
    # but a second one on the same endpoint right after adds (600 + 600) / 64 = 18.8 ms
    # (38.8 > 30): the running requests feel both, so it goes to the prefill pool. The stall
    # decays over 64 tokens x 20 ms = 1.28 s: 10 s later it is gone and local is fine again.
    hdr = {"x-llm-d-slo-tpot-ms": "30", "x-llm-d-slo-ttft-ms": "2000"}
    now = [100.0]
    pred = TablePredictor(decode_ttft=600, prefill_ttft=700)
    s = build_scheduler(config(), predictor=pred, rng=random.Random(1), clock=lambda: now[0])
    decider = s.profile_handler.prefill_decider

    def decide():
        request = InferenceRequest(input_tokens=3000, streaming=True, headers=hdr)
        return s.schedule(request, pool(decode_running=4)).decision

    assert decide() == "decode-only" and decider.stall_ms("d0", 20.0, now[0]) == pytest.approx(600)
    assert decide() == "prefill-decode" and decider.reasons == {"ttft": 0, "tpot": 1}
    now[0] += 1.28
    assert decider.stall_ms("d0", 20.0, now[0]) == pytest.approx(600 / math.e)
    now[0] += 10.0
    assert decide() == "decode-only"
    assert decider.stall_ms("p0", 20.0, now[0]) == 0.0  # nothing was kept on the prefill endpoint


def test_a_late_remote_path_keeps_a_prefill_local_only_while_the_kept_stalls_fit_the_budget():
    # TPOT 20, SLO 25: a 600 ms local prefill breaks it (29.4), but the prefill pool would
    # miss the request's 650 ms TTFT SLO (700): the first one stays local. The second one
    # finds that stall already kept there (20 + 600 / 64 = 29.4 > 25 with nothing added):
    # keeping more would sink the decode endpoint, so it goes to the prefill pool.
    hdr = {"x-llm-d-slo-tpot-ms": "25", "x-llm-d-slo-ttft-ms": "650"}
    now = [100.0]
    s = build_scheduler(config(), predictor=TablePredictor(decode_ttft=600, prefill_ttft=700),
                        rng=random.Random(1), clock=lambda: now[0])

    def decide():
        request = InferenceRequest(input_tokens=3000, streaming=True, headers=hdr)
        return s.schedule(request, pool(decode_running=4)).decision

    assert decide() == "decode-only"
    assert decide() == "prefill-decode" and s.profile_handler.prefill_decider.reasons == {"ttft": 0, "tpot": 1}
    now[0] += 10.0   # the kept stall has decayed: the exception applies again
    assert decide() == "decode-only"


def test_judge_prefill_pick_judges_the_endpoint_the_prefill_profile_picks():
    # TTFT = role base + 100 ms per waiting request + 1000 ms x KV use. The prefill profile
    # (queue-scorer) picks p0 (nothing waiting) although its KV makes it the slower path:
    # p0 1400 ms, p1 600 ms, local on d0 1000 ms.
    class KVTable(TablePredictor):
        def predict_bulk(self, rows):
            out = super().predict_bulk(rows)
            return BulkPrediction([t + 1000.0 * r["kv_cache_percentage"] for t, r in zip(out.ttft_ms, rows)],
                                  out.tpot_ms, "table")

    eps = [Endpoint(name="d0", address="10.0.0.1", port=8000, labels={ROLE: "decode"},
                    metrics=EndpointMetrics(), prefix_match=PrefixMatch(0, 200, 16)),
           Endpoint(name="p0", address="10.0.0.2", port=8000, labels={ROLE: "prefill"},
                    metrics=EndpointMetrics(kv_cache_usage=0.9), prefix_match=PrefixMatch(0, 200, 16)),
           Endpoint(name="p1", address="10.0.0.3", port=8000, labels={ROLE: "prefill"},
                    metrics=EndpointMetrics(waiting_queue_size=1), prefix_match=PrefixMatch(0, 200, 16))]
    pred = KVTable(decode_ttft=1000, prefill_ttft=500)
    # judgePrefillPick false: the best predicted candidate (p1, 600 < 1000) says yes, and the
    # request goes to p0
    s = build_scheduler(config(judgePrefillPick=False), predictor=pred, rng=random.Random(1))
    res = s.schedule(InferenceRequest(input_tokens=3000, streaming=True), eps)
    assert res.decision == "prefill-decode" and res.picks["prefill"].name == "p0"
    # judging the pick (default): p0's 1400 ms loses to the local 1000 ms
    s = build_scheduler(config(), predictor=pred, rng=random.Random(1))
    res = s.schedule(InferenceRequest(input_tokens=3000, streaming=True), eps)
    assert res.decision == "decode-only" and "prefill" not in res.picks
    # and a yes keeps the pick the decider judged
    s = build_scheduler(config(), predictor=KVTable(decode_ttft=1500, prefill_ttft=500), rng=random.Random(1))
    res = s.schedule(InferenceRequest(input_tokens=3000, streaming=True), eps)
    assert res.decision == "prefill-decode" and res.picks["prefill"].name == "p0"


def test_no_predictions_means_no_disaggregation():
    class Down:
        def predict_bulk(self, rows):
            return None
    s, res = run(Down())
    assert res.ok and res.decision == "decode-only"


def test_min_prompt_tokens_gate_and_parameter_validation():
    s, res = run(TablePredictor(decode_ttft=5000, prefill_ttft=10), tokens=999, minPromptTokens=1000)
    assert res.decision == "decode-only"
    with pytest.raises(ConfigError) as e:
        build_scheduler(config(transferBandwidthGBps=0))
    assert "transferBandwidthGBps" in e.value.param
