"""load.bench_epp: the scheduling-overhead benchmark runs any config, and with --inflight the
requests stay running so the plugins that read them (the decode-harm-filter) do their work."""
from __future__ import annotations

import json
import random

from epp_client.framework.loader import build_scheduler
from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
from epp_client.profiles import config_text
from epp_client.training import ListSink
from load import bench_epp


def test_inflight_requests_stay_running_and_reach_the_harm_filter(monkeypatch):
    sched = build_scheduler(config_text("predicted-latency-recommended"), predictor=bench_epp.StubPredictor(),
                            sink=ListSink(10), rng=random.Random(1))
    seen = []
    assess = DecodeHarmFilter.assess

    def spy(self, request, endpoints):
        seen.append(sum(len(e.prediction.running_decodes()) for e in endpoints if e.prediction is not None))
        return assess(self, request, endpoints)

    monkeypatch.setattr(DecodeHarmFilter, "assess", spy)
    workload = [(eps, {**h, "x-llm-d-slo-tpot-ms": "50"}, t, 0) for eps, h, t, _ in bench_epp.make_workload(600, 4)]
    r = bench_epp.run_sync(sched, workload, warmup=100, inflight=64)
    assert r["n"] == 500
    assert seen and max(seen) > 0                     # running requests were there to judge
    assert sum(len(sched.producer.running.requests(f"pod{i // 2}-rank-{i % 2}")) for i in range(4)) == 64
    seen.clear()
    sched2 = build_scheduler(config_text("predicted-latency-recommended"), predictor=bench_epp.StubPredictor(),
                             sink=ListSink(10), rng=random.Random(1))
    bench_epp.run_sync(sched2, workload, warmup=100)  # completed at once: nothing running
    assert max(seen) == 0


def test_cli_takes_a_config_and_inflight(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_epp.main(["--mode", "stub", "--requests", "600", "--endpoints", "4", "--config",
                           "predicted-latency-recommended", "--inflight", "16", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["config"] == "predicted-latency-recommended" and res["inflight"] == 16
    assert set(res["results"]) == {"stub_sync", "stub_async"}
    assert "stub_sync" in capsys.readouterr().out


def test_prefilling_requests_reach_the_harm_filter_before_their_first_chunk(monkeypatch):
    """--prefilling K: the last K requests dispatched have no first chunk yet, so the twin judges
    endpoints with prompts still prefilling (its general path), as on a real pool."""
    sched = build_scheduler(config_text("predicted-latency-recommended"), predictor=bench_epp.StubPredictor(),
                            sink=ListSink(10), rng=random.Random(1))
    prefilling = []
    assess = DecodeHarmFilter.assess

    def spy(self, request, endpoints):
        prefilling.append(sum(1 for e in endpoints if e.prediction is not None
                              for r in e.prediction.running_decodes() if r.prefill > 0))
        return assess(self, request, endpoints)

    monkeypatch.setattr(DecodeHarmFilter, "assess", spy)
    workload = [(eps, {**h, "x-llm-d-slo-tpot-ms": "50"}, t, 0) for eps, h, t, _ in bench_epp.make_workload(600, 4)]
    bench_epp.run_sync(sched, workload, warmup=100, inflight=64, prefilling=8)
    assert max(prefilling) == 8
    assert sum(len(sched.producer.running.requests(f"pod{i // 2}-rank-{i % 2}")) for i in range(4)) == 64 + 8
