"""The decode-harm twin's step model per endpoint (epp_client.engine.learned): the learned section's
class coefficients and endpoint speed, or the prior; the class from the endpoint's labels."""
from __future__ import annotations

from epp_client.engine.learned import StepModels, engine_class
from epp_client.engine.twin import StepModel
from epp_client.types import Endpoint
from features.schema import ENGINE_COEFFICIENTS


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
