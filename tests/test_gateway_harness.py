"""The real-engine harness's pieces (workload, driver, statistics, report) through the
gateway, with fake engines standing in for llama-server (the real run is outside CI)."""
from __future__ import annotations

import asyncio

import pytest

from gateway.app import build_app
from gateway.core import Gateway
from gateway.settings import GatewaySettings
from fake_engine import ADMIN_TOKEN, ServerThread, engines, free_port  # noqa: F401 (fixture)
from load.real_engine.driver import Result, drive, fetch_records
from load.real_engine.gateway_policy import build_router
from load.real_engine.report import write_report
from load.real_engine.stats import accuracy, pinball, pool_rounds, summarize
from load.real_engine.workload import make_workload, prompt_for


def test_pinball_and_coverage_by_model():
    recs = [
        {"ok": True, "ttft_ms": 100.0, "predicted_ttft_ms": 150.0, "tpot_ms": 10.0, "predicted_tpot_ms": 8.0,
         "model_version": "v000001"},
        {"ok": True, "ttft_ms": 200.0, "predicted_ttft_ms": 150.0, "tpot_ms": None, "predicted_tpot_ms": 8.0,
         "model_version": "prior-default"},
        {"ok": False, "ttft_ms": 1.0, "predicted_ttft_ms": 0.0, "tpot_ms": None, "predicted_tpot_ms": None,
         "model_version": "v000001"},
    ]
    a = accuracy(recs)
    assert a["ttft_all_n"] == 2 and a["ttft_all_coverage"] == 0.5
    # under-prediction by 50 costs 0.9*50, over-prediction by 50 costs 0.1*50
    assert a["ttft_all_pinball_ms"] == pytest.approx((0.1 * 50 + 0.9 * 50) / 2)
    assert a["ttft_learned_coverage"] == 1.0 and a["ttft_prior_coverage"] == 0.0
    assert a["tpot_all_n"] == 1 and a["tpot_all_coverage"] == 0.0
    assert pinball([], []) is None


def test_workload_is_deterministic_multi_turn_with_shared_prefixes():
    w1, w2 = make_workload(seed=3, n_conversations=6), make_workload(seed=3, n_conversations=6)
    assert [c.turns for c in w1.conversations] == [c.turns for c in w2.conversations]
    assert len({c.system_id for c in w1.conversations}) > 1
    c = w1.conversations[0]
    p1 = prompt_for(c, [], c.turns[0].question)
    p2 = prompt_for(c, [(c.turns[0].question, " an answer")], c.turns[1].question)
    assert p2.startswith(p1) and p1.startswith(c.system)


def test_drive_summarize_and_report_through_the_gateway(engines, tmp_path):
    for e in engines:
        e.state.first_token_delay, e.state.token_delay = 0.02, 0.005
    dead = f"http://127.0.0.1:{free_port()}"
    s = GatewaySettings(endpoints=[e.url for e in engines], port=free_port(), scrape_interval_s=0.05,
                        admin_token=ADMIN_TOKEN)
    gw = Gateway(s, build_router("llmd-token-load", [dead], dead))
    srv = ServerThread(build_app(gw), s.port).start()
    try:
        wl = make_workload(seed=1, n_conversations=4, turns=2, concurrency=2)
        results = asyncio.run(drive(srv.url, wl, "llmd-token-load", 60))
        records = fetch_records(srv.url, ADMIN_TOKEN)
    finally:
        srv.stop()
    assert len(results) == wl.requests == 8 and all(r.ok for r in results)
    # turn 2 of each conversation extends turn 1's prompt with the engine's actual answer
    prompts = [req["prompt"] for e in engines for req in e.state.received]
    firsts = [p for p in prompts if p.count("User:") == 1]
    seconds = [p for p in prompts if p.count("User:") == 2]
    assert len(firsts) == len(seconds) == 4
    assert all(any(p2.startswith(p1 + "tok0 tok1") for p1 in firsts) for p2 in seconds)
    summ = summarize("llmd-token-load", results, records, wl, 1.0)
    assert summ["ok"] == 8 and summ["slo_attainment"] == 1.0
    assert summ["gateway_prefix_hit_rate"] > 0.3  # second turns and shared system prompts hit
    assert summ["ttft_all_n"] == 0 and summ["fallbacks"] == 8  # prediction server down
    info = {"workload": {"conversations": 4, "turns": 2, "concurrency": 2, "ttft_slo_ms": wl.ttft_slo_ms,
                         "tpot_slo_ms": wl.tpot_slo_ms, "requests": 8, "seed": 1},
            "engine": {"binary": "/c/0.3.36-avx2/bin/llama-server", "model": "fake", "slots": 4, "threads": 1,
                       "ctx": 4096},
            "summaries": {"llmd-token-load": summ}}
    path = write_report(tmp_path, info, {"llmd-token-load": records}, {})
    text = path.read_text()
    assert "| llmd-token-load | 8 (8) |" in text
    assert (tmp_path / "policies.png").stat().st_size > 1000 and (tmp_path / "predictions.png").exists()


def test_rounds_are_pooled_per_policy():
    wl = make_workload(n_conversations=1)

    def res(ttft):
        return Result("p", 0, 0, 200, True, ttft_ms=ttft, tpot_ms=10.0, e2e_ms=ttft + 100, tokens=11)

    def rec(ttft):
        return {"ok": True, "ttft_ms": ttft, "predicted_ttft_ms": 150.0, "tpot_ms": 10.0, "predicted_tpot_ms": 12.0,
                "model_version": "v1", "prefix_match_blocks": 1, "prefix_total_blocks": 2, "fallback": False}

    results = {"a #1": [res(100.0)], "b #1": [res(5000.0)], "b #2": [res(5000.0)], "a #2": [res(300.0)]}
    records = {k: [rec(r[0].ttft_ms)] for k, r in results.items()}
    summaries = {k: {**summarize(k.split()[0], results[k], records[k], wl, 10.0), "engine_speed": [{}],
                     "loadavg_1m": [1.0, 2.0], "data_status": {"stored_rows": i}} for i, k in enumerate(results)}
    pooled, pooled_recs = pool_rounds(["a", "b"], summaries, records, results, wl)
    assert set(pooled) == {"a", "b"} and pooled["a"]["requests"] == 2 and pooled["a"]["wall_s"] == 20.0
    assert pooled["a"]["ttft_p50_ms"] == pytest.approx(200.0)
    assert pooled["a"]["ttft_all_coverage"] == 0.5 and len(pooled_recs["b"]) == 2
    assert pooled["a"]["data_status"] == {"stored_rows": 3}  # the policy's last phase
