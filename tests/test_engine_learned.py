"""The decode-harm twin's step model per endpoint (epp_client.engine.learned): the learned section's
class coefficients and endpoint speed, or the prior; the class from the endpoint's labels."""
from __future__ import annotations

import pytest

from epp_client.engine.learned import StepModels, engine_class
from epp_client.engine.twin import StepModel
from epp_client.types import Endpoint
from features.schema import ENGINE_COEFFICIENTS, ENGINE_FEATURE_FIELDS
from support.engine import HARM_CONFIG, FixedPredictor


def test_step_models_take_a_learned_section_and_keep_the_prior_otherwise():
    prior = StepModel(speed=0.8)
    section = {"rows": 100, "classes": {"default": {
        "coefficients": dict(zip(ENGINE_COEFFICIENTS, (1.0, 0.1, 1e-4, 2.0, 1e-6))), "n_train": 90,
        "n_heldout": 10, "endpoints": {"pod-a": {"speed": 0.5, "n": 40}}}}}
    served: list = [None]
    models = StepModels(prior, lambda: served[0])
    models.refresh()
    assert models.for_endpoint("default", "pod-a") is prior          # nothing learned yet: the prior
    served[0] = ("v1", section)
    models.refresh()
    a, b = models.for_endpoint("default", "pod-a"), models.for_endpoint("default", "pod-b")
    assert (a.fixed_ms, a.per_token_ms, a.decode_ms, a.speed) == (1.0, 0.1, 2.0, 0.5)
    assert b.speed == 1.0 and b.fixed_ms == 1.0                      # the class's coefficients at speed 1
    assert models.for_endpoint("other|h100", "pod-c") is prior       # a class not learned: the prior
    assert models.for_endpoint("default", "pod-a") is a              # one object per endpoint (decode cache key)
    bad = {"rows": 1, "classes": {"default": {"coefficients": {"fixed_ms": -1.0}}}}
    served[0] = ("v2", bad)
    models.refresh()                                                  # refused: the last good one stays
    assert models.for_endpoint("default", "pod-a") is a


def test_the_class_comes_from_the_endpoints_labels():
    e = Endpoint(name="p", labels={"llm-d.ai/model": "llama-8b", "llm-d.ai/accelerator": "a100"})
    assert engine_class(e, "llm-d.ai/model", "llm-d.ai/accelerator") == "llama-8b|a100"
    assert engine_class(Endpoint(name="q"), "llm-d.ai/model", "llm-d.ai/accelerator") == "default"
    assert engine_class(Endpoint(name="r", labels={"shape": "h100"}), "m", "shape") == "-|h100"


#: pod-b four times slower than pod-a
SECTION = {"rows": 100, "classes": {"default": {
    "coefficients": dict(zip(ENGINE_COEFFICIENTS, (3.0, 0.07, 8e-5, 9.0, 3.5e-6))), "n_train": 90,
    "n_heldout": 10, "endpoints": {"pod-a": {"speed": 2.0, "n": 45}, "pod-b": {"speed": 0.5, "n": 45}}}}}


@pytest.mark.parametrize("learn", [True, False])
def test_the_filter_steps_each_endpoint_with_its_learned_model(learn):
    """Through a real scheduler, both endpoints running decodes (the twin's all-candidates path over
    the producer's columns): each candidate's outcome is the twin's with that endpoint's learned
    step model, not the prior's; learnEngine: false keeps the prior."""
    from epp_client.engine.features import step_features, twin_ttft
    from epp_client.engine.twin import placement
    from epp_client.framework.loader import build_scheduler
    from epp_client.plugins.filter.decode_harm import DecodeHarmFilter
    from epp_client.training import ListSink
    from epp_client.types import InferenceRequest

    config = HARM_CONFIG.replace("- type: decode-harm-filter\n", "- type: decode-harm-filter\n  parameters: "
                            f"{{learnEngine: {'true' if learn else 'false'}}}\n")
    clock = [0.0]
    sink = ListSink()
    sched = build_scheduler(config, predictor=FixedPredictor(SECTION), sink=sink, clock=lambda: clock[0])
    f = next(x for p in sched.profiles for x in p.filters if isinstance(x, DecodeHarmFilter))
    eps = [Endpoint(name="pod-a"), Endpoint(name="pod-b")]
    for i, e in enumerate(eps * 2):       # two requests decoding on each endpoint
        req = InferenceRequest(request_id=f"r{i}", input_tokens=500, streaming=True)
        res = sched.schedule(req, [e], now=clock[0])
        sched.pre_request(req, res, now=clock[0])
        sched.on_first_chunk(req.request_id, now=clock[0] + 0.1, tokens=1)
    clock[0] += 0.5
    req = InferenceRequest(request_id="new", input_tokens=3000, streaming=True)
    res = sched.schedule(req, eps, now=clock[0])
    cands = res.candidates
    assert all(c.prediction.decoding_columns is not None for c in cands)
    outcomes = {name: o for name, (_, o) in f.assess(req, cands).items()}
    for c in cands:
        model = f.step_models.for_endpoint("default", c.name)
        assert (model is not f.step_model) == learn
        assert outcomes[c.name] == placement(model, f.prefill_chunk_tokens, c.prediction.running_decodes(), 3000, 0)
    if learn:   # pod-b at a quarter of pod-a's speed: four times the TTFT
        assert outcomes["pod-b"].ttft_ms == pytest.approx(4 * outcomes["pod-a"].ttft_ms, rel=1e-9)
    # dispatched: the sums its TPOT entry carries (from the columns: every request there decodes)
    # are the twin's over the endpoint's running requests, with the endpoint's step model
    picked = res.endpoint
    model = f.step_models.for_endpoint("default", picked.name)
    want = step_features(model, f.prefill_chunk_tokens, picked.prediction.running_decodes(), 3000, 0)
    sched.pre_request(req, res, now=clock[0])
    sched.on_first_chunk("new", now=clock[0] + 1.0, tokens=1)
    sched.on_chunk("new", now=clock[0] + 1.1, tokens=1)
    sched.on_complete("new", now=clock[0] + 1.2)
    entry = [e for e in sink.entries if e.get("engine_endpoint")][-1]     # the new request's
    assert entry["engine_endpoint"] == picked.name and entry["engine_class"] == "default"
    assert tuple(entry[k.name] for k in ENGINE_FEATURE_FIELDS) == want
    assert entry["engine_ttft_ms"] == twin_ttft(model, want)
