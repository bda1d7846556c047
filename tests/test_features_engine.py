"""The engine fields of a training entry (features.schema: optional, all five sums with the endpoint,
non-negative finite numbers, a FieldError naming the field otherwise) and the manifest's engine
section (features.bundle.validate_engine: a bad number rejects the bundle naming the key)."""
from __future__ import annotations

import pytest

from features.bundle import BundleError
from features.loaded import LoadedBundle
from features.manifest import Manifest
from features.schema import FieldError, parse_training_entry


def wire_entry(**engine) -> dict:
    e = {"kv_cache_percentage": 0.2, "input_token_length": 500, "num_request_waiting": 0,
         "num_request_running": 3, "num_tokens_generated": 0, "prefix_cache_score": 0.0,
         "actual_ttft_ms": 120.0, "actual_tpot_ms": 0.0}
    return {**e, **engine}


ENGINE = {"engine_endpoint": "pod-a", "engine_class": "llama|a100", "engine_steps": 3, "engine_step_tokens": 900,
          "engine_step_context": 4000.0, "engine_decode_steps": 3, "engine_prefill_pairs": 1.2e5,
          "engine_ttft_ms": 95.5}


def test_an_entry_without_engine_fields_parses_as_before():
    e = parse_training_entry(wire_entry())
    assert e.engine is None and e.actual_ttft_ms == 120.0


def test_the_engine_fields_parse_into_an_observation():
    o = parse_training_entry(wire_entry(**ENGINE)).engine
    assert o is not None and o.endpoint == "pod-a" and o.engine_class == "llama|a100"
    assert o.features == (3.0, 900.0, 4000.0, 3.0, 1.2e5) and o.twin_ttft_ms == 95.5
    no_class = {k: v for k, v in ENGINE.items() if k not in ("engine_class", "engine_ttft_ms")}
    o = parse_training_entry(wire_entry(**no_class)).engine
    assert o is not None and o.engine_class == "default" and o.twin_ttft_ms == 0.0


@pytest.mark.parametrize("field,value,msg", [
    ("engine_steps", -1, "out of range"),
    ("engine_prefill_pairs", float("nan"), "finite"),
    ("engine_step_context", float("inf"), "finite"),
    ("engine_decode_steps", "3", "must be a number"),
    ("engine_step_tokens", None, "field required"),
    ("engine_endpoint", None, "field required"),
    ("engine_endpoint", 7, "must be a string"),
    ("engine_class", "x" * 300, "longer than"),
    ("engine_ttft_ms", -5.0, "out of range"),
    ("engine_actual_ttft_ms", -1.0, "out of range"),
    ("engine_actual_ttft_ms", "700", "must be a number"),
])
def test_a_bad_engine_field_is_refused_naming_it(field, value, msg):
    bad = dict(ENGINE, **{field: value})
    if value is None:
        del bad[field]
    with pytest.raises(FieldError) as err:
        parse_training_entry(wire_entry(**bad), ("entries", 4))
    assert err.value.loc == ("entries", 4, field) and msg in err.value.msg



def prior_manifest() -> dict:
    m = LoadedBundle.builtin_prior(0.9).manifest.to_json()
    return {**m, "version": "v000001-20261201T000000Z"}


def test_the_manifest_carries_a_valid_engine_section_and_refuses_a_bad_number():
    section = {"rows": 500, "classes": {"k": {
        "coefficients": {"fixed_ms": 2.9, "per_token_ms": 0.065, "per_context_token_ms": 7e-5, "decode_ms": 8.1,
                         "per_prefill_pair_ms": 3.4e-6},
        "n_train": 450, "n_heldout": 50, "heldout_error": 0.04,
        "endpoints": {"a0": {"speed": 0.7, "n": 200}, "a1": {"speed": 1.4, "n": 250}}}}}
    m = Manifest.from_json({**prior_manifest(), "engine": section})
    assert m.to_json()["engine"] == section
    bad_cases = [
        (("classes", "k", "coefficients", "decode_ms"), -1.0, "engine.classes.k.coefficients.decode_ms"),
        (("classes", "k", "coefficients", "fixed_ms"), "3", "engine.classes.k.coefficients.fixed_ms"),
        (("classes", "k", "endpoints", "a0", "speed"), 0.0, "engine.classes.k.endpoints.a0.speed"),
        (("classes", "k", "endpoints", "a0", "speed"), float("inf"), "engine.classes.k.endpoints.a0.speed"),
        (("classes", "k", "n_train"), -3, "engine.classes.k.n_train"),
        (("classes", "k", "heldout_error"), True, "engine.classes.k.heldout_error"),
    ]
    for path, value, named in bad_cases:
        broken = Manifest.from_json({**prior_manifest(), "engine": section}).to_json()["engine"]
        node = broken
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        with pytest.raises(BundleError, match=named.replace(".", r"\.")):
            Manifest.from_json({**prior_manifest(), "engine": broken})
    missing = Manifest.from_json({**prior_manifest(), "engine": section}).to_json()["engine"]
    del missing["classes"]["k"]["coefficients"]["per_token_ms"]
    with pytest.raises(BundleError, match=r"engine\.classes\.k\.coefficients\.per_token_ms"):
        Manifest.from_json({**prior_manifest(), "engine": missing})
