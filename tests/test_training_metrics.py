"""The training server's Prometheus exposition: the served bundle (one series, replaced on a
swap), held-out scores per regime, store and queue gauges, the live window per target."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from training_server.metrics import TrainingMetrics


def _samples(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_the_exposition_carries_the_served_bundle_scores_and_live_window():
    m = TrainingMetrics()
    m.set_served("v1", "prior", 0.0)
    m.set_served("v2", "learned", 0.0)
    m.set_heldout({"ttft": {"n": 10, "pinball": 4.5, "coverage": 88.0,
                            "by_regime": {"queued_highkv": {"n": 3, "pinball": 9.0, "coverage": 70.0},
                                          "idle_lowkv": {"n": 0}}}})
    m.accepted.inc(5)
    got = _samples(m.render(store_rows=42, queue_depth=3,
                            live={"tpot": {"n": 7, "pinball": 1.25, "coverage": 90.0}}))
    served = {k: v for k, v in got.items() if k[0] == "latency_training_served_bundle"}
    assert served == {("latency_training_served_bundle", (("source", "learned"), ("version", "v2"))): 1.0}
    assert got[("latency_training_heldout_pinball_ms", (("regime", "all"), ("target", "ttft")))] == 4.5
    assert got[("latency_training_heldout_coverage_percent", (("regime", "queued_highkv"), ("target", "ttft")))] == 70.0
    assert not any(k[0].startswith("latency_training_heldout") and ("regime", "idle_lowkv") in k[1] for k in got)
    assert got[("latency_training_store_rows", ())] == 42 and got[("latency_training_ingest_queue_depth", ())] == 3
    assert got[("latency_training_live_samples", (("target", "tpot"),))] == 7
    assert got[("latency_training_live_samples", (("target", "ttft"),))] == 0
    assert got[("latency_training_live_pinball_ms", (("target", "tpot"),))] == 1.25
    assert got[("latency_training_entries_accepted_total", ())] == 5
    assert got[("latency_training_bundle_age_seconds", ())] > 1e9       # loaded at the epoch
