"""epp_client.metrics: the Prometheus collector exposes the scheduler's and the predictor's counters."""
from __future__ import annotations

from epp_client import InferenceRequest
from support.scheduling import cluster, prior_predictor, ref


def test_prometheus_collector_exposes_the_counters():
    from prometheus_client import CollectorRegistry, generate_latest

    from epp_client.metrics import EppCollector

    pred = prior_predictor()
    s = ref(predictor=pred)
    for i in range(5):
        r = InferenceRequest(request_id=f"m{i}", input_tokens=100)
        res = s.schedule(r, cluster())
        s.pre_request(r, res)
    registry = CollectorRegistry()
    registry.register(EppCollector(scheduler=s, predictor=pred))
    text = generate_latest(registry).decode()
    assert "epp_prediction_calls_total 5.0" in text and "epp_prediction_successes_total 5.0" in text
    assert 'epp_producer_events_total{event="predictions"} 5.0' in text
    assert sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("epp_inflight_requests{")) == 5
