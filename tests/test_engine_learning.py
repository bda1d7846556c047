"""Learning the engine twin's step model, piece by piece: the twin's TTFT is linear in its step
coefficients over the step sums the EPP reports (epp_client.engine.features), the wire fields
that carry them (features.schema), the store's engine columns (an older store opens and gets
them), the robust fit per class and endpoint (training_server.engine_fit), the manifest section
(features.bundle.validate_engine), the EPP's per-endpoint step models (epp_client.engine.learned)
and the decode-harm filter's report at dispatch through the producer's TTFT entry."""
from __future__ import annotations

import math
import random
import sqlite3

import numpy as np
import pytest

from epp_client.engine.features import step_features, twin_ttft
from epp_client.engine.learned import StepModels, engine_class
from epp_client.engine.twin import Running, StepModel, placement
from epp_client.framework.loader import build_scheduler
from epp_client.training import ListSink
from epp_client.types import Endpoint, InferenceRequest
from features.bundle import BundleError
from features.manifest import Manifest
from features.schema import (
    COL,
    ENGINE_COEFFICIENTS,
    ENGINE_FEATURE_FIELDS,
    RAW_COLUMNS,
    FieldError,
    TrainingEntry,
    parse_training_entry,
)
from training_server.engine_fit import fit_engine
from training_server.store import SampleStore, entries_to_rows

SUMS = [f.name for f in ENGINE_FEATURE_FIELDS]


def random_state(rng: random.Random) -> tuple[int, tuple[Running, ...], int, int]:
    budget = rng.choice([256, 512, 2048, 8192])
    running = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.7:   # decoding
            tokens, ctx = rng.randint(1, 500), rng.randint(10, 5000)
            running.append(Running(rng.uniform(0, 20000), tokens, rng.choice([0.0, 50.0]), ctx + tokens))
        else:                    # still to prefill, maybe under way at the head of the queue
            p = rng.randint(1, 9000)
            running.append(Running(0.0, 0, rng.choice([0.0, 50.0]), p + rng.randint(0, 3000), p,
                                   rng.choice([0.0, rng.uniform(0, 500)])))
    prompt = rng.randint(1, 20000)
    return budget, tuple(running), prompt, rng.randint(0, prompt)


def test_the_twins_ttft_is_the_coefficients_over_its_step_sums():
    """c . F / speed is the twin's own TTFT (placement) for random states and random step models:
    the sums the EPP reports and the twin it routes with can never drift apart."""
    rng = random.Random(7)
    checked = 0
    for _ in range(600):
        m = StepModel(rng.uniform(0.5, 10), rng.uniform(0, 0.2), rng.uniform(0, 3e-4), rng.uniform(0, 15),
                      rng.uniform(0, 1e-5), rng.uniform(0.3, 3))     # fixed >= 0.5 ms: the 0.1 ms floor never binds
        budget, running, prompt, cached = random_state(rng)
        f = step_features(m, budget, running, prompt, cached)
        o = placement(m, budget, running, prompt, cached)
        assert f is not None and math.isfinite(o.ttft_ms)
        assert twin_ttft(m, f) == pytest.approx(o.ttft_ms, rel=1e-9)
        assert f[0] >= 1 and f[3] <= f[0] and min(f) >= 0
        checked += 1
    assert checked == 600


def test_no_first_token_within_max_steps_gives_no_sums():
    m = StepModel()
    running = tuple(Running(0.0, 5, 0.0, 100) for _ in range(64))   # 64 decodes fill a 64-token budget
    assert step_features(m, 64, running, 1000, 0, max_steps=50) is None
    assert placement(m, 64, running, 1000, 0, max_steps=50).ttft_ms == math.inf


# ---- the wire ----------------------------------------------------------------------------------
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
])
def test_a_bad_engine_field_is_refused_naming_it(field, value, msg):
    bad = dict(ENGINE, **{field: value})
    if value is None:
        del bad[field]
    with pytest.raises(FieldError) as err:
        parse_training_entry(wire_entry(**bad), ("entries", 4))
    assert err.value.loc == ("entries", 4, field) and msg in err.value.msg


# ---- the store ---------------------------------------------------------------------------------
def store_entry(i: int, engine: dict | None) -> TrainingEntry:
    raw = [0.0] * len(RAW_COLUMNS)
    raw[COL["input_token_length"]] = 100 + i
    return parse_training_entry({**{k: raw[COL[k]] for k in ("kv_cache_percentage", "input_token_length",
                                                             "num_request_waiting", "num_request_running",
                                                             "num_tokens_generated", "prefix_cache_score")},
                                 "actual_ttft_ms": 50.0 + i, "actual_tpot_ms": 0.0, **(engine or {})})


def test_a_store_from_before_the_engine_columns_opens_keeps_its_rows_and_stores_them(tmp_path):
    path = tmp_path / "samples.sqlite3"
    cols = ", ".join(f"{c} REAL NOT NULL" for c in RAW_COLUMNS)
    with sqlite3.connect(path) as c:   # the table as stores were created before the engine columns
        c.executescript(f"""CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols},
            actual_ttft_ms REAL NOT NULL, actual_tpot_ms REAL NOT NULL, ts REAL NOT NULL,
            predicted_ttft_ms REAL NOT NULL DEFAULT 0, predicted_tpot_ms REAL NOT NULL DEFAULT 0,
            model_version TEXT NOT NULL DEFAULT '', stratum INTEGER NOT NULL);
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);""")
        c.execute(f"INSERT INTO samples ({', '.join(RAW_COLUMNS)}, actual_ttft_ms, actual_tpot_ms, ts, stratum) "
                  f"VALUES ({', '.join('0' for _ in RAW_COLUMNS)}, 42, 0, 1e9, 0)")
    store = SampleStore(path, max_rows=1000, queue_size=1000, test_ratio=0.1).open()
    try:
        assert store.rows == 1
        store.submit(entries_to_rows([store_entry(i, ENGINE if i % 2 else None) for i in range(6)])).result(10)
        rows = store.read_engine_rows(100)
        assert rows.endpoints == ["pod-a"] * 3 and rows.classes == ["llama|a100"] * 3
        assert rows.features.tolist() == [[3.0, 900.0, 4000.0, 3.0, 1.2e5]] * 3
        assert rows.ttft_ms.tolist() == [51.0, 53.0, 55.0] and list(rows.ids) == sorted(rows.ids)
        assert store.engine_rows_after(int(rows.ids[0])) == 2
        assert store.rows == 7
    finally:
        store.close()
    reopened = SampleStore(path, max_rows=1000, queue_size=1000, test_ratio=0.1).open()   # migrated once
    try:
        assert reopened.rows == 7 and len(reopened.read_engine_rows(2).ids) == 2
    finally:
        reopened.close()


# ---- the fit -----------------------------------------------------------------------------------
TRUE = np.array([3.0, 0.06, 7e-5, 8.0, 3e-6])
SPEEDS = {"a0": 0.5, "a1": 0.55, "a2": 1.0, "a3": 1.1, "a4": 0.95, "a5": 1.05}


def synthetic_rows(n: int, seed: int = 0, outliers: float = 0.05):
    rng = np.random.default_rng(seed)
    eps = rng.choice(list(SPEEDS), n)
    steps = rng.integers(1, 60, n).astype(float)
    tok = steps * rng.uniform(10, 2048, n)
    f = np.c_[steps, tok, steps * rng.uniform(0, 5e5, n), np.minimum(steps, rng.integers(0, 60, n)),
              rng.uniform(0, 1, n) * tok ** 2 / 2]
    y = f @ TRUE / np.array([SPEEDS[e] for e in eps]) * rng.lognormal(0, 0.03, n)
    slow, fast = rng.random(n) < outliers, rng.random(n) < outliers
    y[slow] *= rng.uniform(3, 10, slow.sum())     # e.g. preempted requests: far slower than the twin says
    y[fast] *= rng.uniform(0.02, 0.1, fast.sum())  # e.g. a prompt far shorter than the router estimated
    return eps, f, y


def test_the_fit_recovers_coefficients_and_speeds_through_outliers():
    eps, f, y = synthetic_rows(3000)
    section = fit_engine(["llama|a100"] * len(y), eps, f, y)
    assert section is not None
    c = section["classes"]["llama|a100"]
    g = math.exp(np.mean(np.log(list(SPEEDS.values()))))   # the speeds are relative to their geometric mean
    for name, true in zip(ENGINE_COEFFICIENTS, TRUE):
        assert c["coefficients"][name] * g == pytest.approx(true, rel=0.1), name
    for e, s in SPEEDS.items():
        assert c["endpoints"][e]["speed"] == pytest.approx(s / g, rel=0.02), e
    assert c["n_train"] + c["n_heldout"] == 3000 and c["n_heldout"] == 300
    assert c["heldout_error"] < 0.05
    assert sum(e["n"] for e in c["endpoints"].values()) == c["n_train"]


def test_the_fit_without_trimming_is_pulled_off_by_the_outliers():
    eps, f, y = synthetic_rows(3000)
    g = math.exp(np.mean(np.log(list(SPEEDS.values()))))

    def worst(fit: dict) -> float:   # the coefficients not confounded with another (per step, per decode step)
        return max(abs(fit["coefficients"][k] * g / t - 1) for k, t in zip(ENGINE_COEFFICIENTS, TRUE)
                   if k not in ("fixed_ms", "decode_ms"))

    robust = fit_engine(["k"] * len(y), eps, f, y)["classes"]["k"]
    plain = fit_engine(["k"] * len(y), eps, f, y, trim=0.0)["classes"]["k"]
    assert worst(robust) < 0.05 and worst(plain) > 0.2
    assert robust["heldout_error"] < plain["heldout_error"]


def test_minimum_rows_per_class_and_per_endpoint():
    eps, f, y = synthetic_rows(400)
    classes = ["big"] * 360 + ["small"] * 40
    eps = np.array(["lonely"] * 10 + list(eps[10:]))     # 10 rows in class big: too few for its own speed
    section = fit_engine(classes, eps, f, y, min_class_rows=50, min_endpoint_rows=20)
    assert set(section["classes"]) == {"big"}
    assert "lonely" not in section["classes"]["big"]["endpoints"] and "a0" in section["classes"]["big"]["endpoints"]
    assert fit_engine(["small"] * 40, eps[:40], f[:40], y[:40]) is None


# ---- the manifest --------------------------------------------------------------------------------
def prior_manifest() -> dict:
    from features.loaded import LoadedBundle

    m = LoadedBundle.builtin_prior(0.9).manifest.to_json()
    return {**m, "version": "v000001-20261201T000000Z"}


def test_the_manifest_carries_a_valid_engine_section_and_refuses_a_bad_number():
    eps, f, y = synthetic_rows(500)
    section = fit_engine(["k"] * len(y), eps, f, y)
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


# ---- the EPP -----------------------------------------------------------------------------------------
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


CONFIG = """
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: decode-harm-filter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: decode-harm-filter
  - pluginRef: max-score-picker
"""


class FixedPredictor:
    def predict_bulk(self, rows):
        from epp_client.predictor import BulkPrediction

        return BulkPrediction([100.0] * len(rows), [20.0] * len(rows), "v1", "learned")

    async def apredict_bulk(self, rows):
        return self.predict_bulk(rows)


def test_the_ttft_entry_carries_the_twins_view_at_dispatch():
    """Through a real scheduler: the decode-harm filter computes the step sums on the picked
    endpoint at dispatch (with requests already running there), the producer sends them with the
    TTFT entry (the TPOT entry has none), and c . F / speed is the twin's TTFT it reports."""
    sink = ListSink()
    clock = [0.0]
    sched = build_scheduler(CONFIG, predictor=FixedPredictor(), sink=sink, clock=lambda: clock[0],
                            wall_clock=lambda: 1e9 + clock[0])
    eps = [Endpoint(name="pod-a", labels={"llm-d.ai/accelerator": "a100"})]
    for i in range(3):
        req = InferenceRequest(request_id=f"r{i}", input_tokens=800 + 100 * i, streaming=True,
                               headers={"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "50"})
        res = sched.schedule(req, eps, now=clock[0])
        assert res.ok
        sched.pre_request(req, res, now=clock[0])
        assert req.engine_view is None          # consumed by the producer
        clock[0] += 0.01
    for i in range(3):
        sched.on_first_chunk(f"r{i}", now=clock[0] + 0.2, tokens=1)
        sched.on_chunk(f"r{i}", now=clock[0] + 0.3, tokens=1)
        sched.on_complete(f"r{i}", now=clock[0] + 0.4)
    ttft = [e for e in sink.entries if e["actual_ttft_ms"] > 0]
    tpot = [e for e in sink.entries if e["actual_tpot_ms"] > 0]
    assert len(ttft) == 3 and tpot and not any("engine_steps" in e for e in tpot)
    for e in ttft:
        parsed = parse_training_entry(e).engine
        assert parsed is not None and parsed.endpoint == "pod-a" and parsed.engine_class == "-|a100"
        assert e["engine_ttft_ms"] == pytest.approx(twin_ttft(StepModel(), parsed.features), rel=1e-12)
    # the third request queued behind two prefills it was dispatched after: more steps, more tokens
    assert ttft[2]["engine_step_tokens"] > ttft[0]["engine_step_tokens"]
