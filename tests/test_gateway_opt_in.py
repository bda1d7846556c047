"""The gateway with an opt-in config, on loopback (real gateway, fake engines): the
x-prediction-based-scheduling header reaches scheduling and picks the profile; warm-up
fallbacks are counted; --config takes a well-known name."""
from __future__ import annotations

import random
import re

import httpx
import pytest

from epp_client.framework.loader import build_scheduler
from epp_client.plugins.handler.opt_in import with_opt_in
from epp_client.profiles import RECOMMENDED_CONFIG
from epp_client.training import ListSink
from fake_engine import ADMIN_TOKEN, ServerThread, admin_get, engines, free_port  # noqa: F401 (fixture)
from gateway.app import build_app
from gateway.core import Gateway
from gateway.settings import GatewaySettings, SettingsError
from test_handler_opt_in import FixedPredictor

WARM_UP_FALLBACKS = re.compile(r'^latency_gateway_fallbacks_total\{reason="warm-up"\} (\S+)$', re.M)


def test_the_header_picks_the_profile_through_a_real_gateway(engines):
    engines[1].state.waiting = 8          # the predicted TTFT grows with the queue: engine a is best
    predictor = FixedPredictor(source="prior")
    router = build_scheduler(with_opt_in(RECOMMENDED_CONFIG), predictor=predictor, sink=ListSink(),
                             rng=random.Random(3))
    s = GatewaySettings(endpoints=[e.url for e in engines], port=free_port(), scrape_interval_s=0.05,
                        admin_token=ADMIN_TOKEN)
    gw = Gateway(s, router)
    srv = ServerThread(build_app(gw), s.port).start()
    try:
        def send(opt_in: str | None) -> None:
            headers = {"x-llm-d-slo-ttft-ms": "5000", "x-llm-d-slo-tpot-ms": "500"}
            if opt_in is not None:
                headers["x-prediction-based-scheduling"] = opt_in
            r = httpx.post(srv.url + "/v1/completions", timeout=10, headers=headers,
                           json={"prompt": "route me " * 30, "max_tokens": 4, "stream": True})
            assert r.status_code == 200

        send("true")                      # the servers answer from the prior: warm-up
        predictor.source = "learned"
        send("true")
        send(None)
        send("false")
        recs = admin_get(srv.url, "/gateway/requests", timeout=5).json()["records"]
        assert [(r["decision"], r["fallback"]) for r in recs] == [("warm-up", True), ("predicted", False),
                                                                   ("heuristic", False), ("heuristic", False)]
        assert recs[1]["endpoint"].startswith("ep0-")            # the predicted profile's pick: the short queue
        assert recs[1]["predicted_ttft_ms"] == pytest.approx(100.0)
        assert router.profile_handler.decisions == {("unknown", "warm-up"): 1, ("unknown", "predicted"): 1,
                                                    ("unknown", "heuristic"): 2}
        assert WARM_UP_FALLBACKS.findall(httpx.get(srv.url + "/metrics", timeout=5).text) == ["1.0"]
        # the header went on to the engine with the rest of the request
        sent = [h.get("x-prediction-based-scheduling") for e in engines for h in e.state.headers]
        assert sorted(x for x in sent if x) == ["false", "true", "true"]
    finally:
        srv.stop()


def test_config_takes_a_well_known_name(tmp_path):
    from gateway.cli import make_router

    s = GatewaySettings(endpoints=["http://127.0.0.1:1"], config="predicted-latency-recommended",
                        prediction_urls=["http://127.0.0.1:2"], training_url="http://127.0.0.1:3")
    router = make_router(s)
    try:
        assert router.profiles[0].picker.TYPE == "max-score-picker"
        assert router.profiles[0].scorers[0][0].headroom_selection_strategy == "most"
    finally:
        router.producer.predictor.close()
        router.producer.sink.close()
    with pytest.raises(SettingsError, match="predicted-latency-recommended"):
        GatewaySettings(endpoints=["http://127.0.0.1:1"], config="predicted-latency-typo")
