"""plugins/admitter/latency_slo.py: decision rules, defaults and parameters (docs/plugins.md)."""
from __future__ import annotations

from epp_client import (
    Admission,
    InferenceRequest,
    LatencyPrediction,
)
from epp_client.plugins import (
    LatencySloAdmitter,
)
from support.endpoints import ep, pred


# ------------------------------------------------------------------------ admitters
def test_latency_slo_admitter_rules():
    a = LatencySloAdmitter()
    slo = {"x-llm-d-slo-ttft-ms": "200"}
    shed = InferenceRequest(headers=slo, priority=-1)
    invalid = [ep("a", kv=0.5, running=2, pred=pred(-5, valid=False)), ep("b", kv=0.02, running=1, pred=pred(-5, valid=False))]
    d = a.admit(shed, invalid)
    assert d == Admission(False, "no valid endpoint available to serve the request", 429)  # A.2.2
    assert a.admit(None, invalid).admitted
    assert a.admit(InferenceRequest(headers=slo, priority=0), invalid).admitted  # not sheddable
    assert a.admit(InferenceRequest(priority=-1), invalid).admitted  # no SLO
    assert a.admit(InferenceRequest(headers={"x-slo-ttft-ms": "-3"}, priority=-1), invalid).admitted
    assert not a.admit(InferenceRequest(headers={"x-slo-tpot-ms": "20"}, priority=-1), invalid).admitted
    assert a.admit(shed, [ep("a", running=2), ep("b", running=1)]).admitted  # no predictions: fail-open
    assert a.admit(shed, invalid + [ep("cold", kv=0.0199, running=3)]).admitted  # cold: kv < 0.02
    assert a.admit(shed, invalid + [ep("idle", running=0)]).admitted  # idle by server metrics
    valid = LatencyPrediction(10, 1, 190, 0, True, True, 5)
    assert a.admit(shed, invalid + [ep("ok", running=9, pred=valid)]).admitted
