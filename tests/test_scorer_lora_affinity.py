"""lora-affinity-scorer: the metric-only rules and, with request history, every scoring rule, the lifecycle counts
(completion and abort), the reconcile, the scheduler's public lifecycle and config, and
``requestHistory: false`` identical to the metric-only scorer."""
from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest
from epp_client.framework.loader import build_scheduler
from epp_client.framework.profile import SchedulingProfile
from epp_client.framework.scheduler import Scheduler
from epp_client.plugins import LoraAffinityScorer, MaxScorePicker
from support.lora import ep


def req(adapter="sql", rid="r1"):
    return InferenceRequest(request_id=rid, target_model=adapter)


def hist_scorer(**kw):
    return LoraAffinityScorer(request_history=True, **kw)


# ------------------------------------------------------------------------ scoring rules
def test_history_rule_active_running_or_in_flight_scores_one_whatever_the_queue():
    s = hist_scorer()
    eps = [ep("scraped", running={"sql"}), ep("sent", running={"x"}),
           ep("active-and-waiting", running={"sql"}, waiting={"sql", "y"}),
           ep("sent-to-full", running={"a", "b", "c", "d"}, waiting={"e"})]
    s.pre_request(req(rid="a"), {"default": eps[1]})  # history count > 0 makes it active before any scrape
    s.pre_request(req(rid="b"), {"default": eps[3]})
    # vLLM reports an adapter as waiting whenever one of its requests is queued: that does
    # not take "active here" away (the first history rule did, and spread adapters out)
    assert s.score(req(), eps) == {"scraped": 1.0, "sent": 1.0, "active-and-waiting": 1.0, "sent-to-full": 1.0}


def test_history_rule_spare_slot_counts_history_as_running():
    s = hist_scorer()
    spare = ep("spare", running={"a"}, max_lora=3)            # |{a, b}| + 0 = 2 < 3
    full = ep("full", running={"a"}, max_lora=2)              # |{a, b}| + 0 = 2, not < 2
    s.pre_request(req("b", "1"), {"default": spare})
    s.pre_request(req("b", "2"), {"default": full})
    assert s.score(req("sql"), [spare, full]) == {"spare": 0.8, "full": 0.0}
    # the metric-only scorer sees 1 < 2 on "full": the history is what fills the slot
    assert LoraAffinityScorer().score(req("sql"), [full]) == {"full": 0.8}


def test_history_rule_waiting_counts_like_metric_only():
    s = hist_scorer()
    eps = [ep("both", running={"a", "b"}, waiting={"a"}, max_lora=4),      # 2 + 1 < 4: spare
           ep("double", running={"a", "b"}, waiting={"a", "b"}, max_lora=4),  # 2 + 2: an adapter both running and
           ep("waiting-here", running={"a", "b", "c"}, waiting={"sql"}),     # waiting takes two, as in llm-d
           ep("nomax", waiting={"sql"}, max_lora=0)]
    assert s.score(req(), eps) == {"both": 0.8, "double": 0.0, "waiting-here": 0.6, "nomax": 0.6}


def test_history_rule_recently_sent_adapter_with_a_spare_slot_scores_0_9():
    s = hist_scorer()
    warm, cold, full = ep("warm", running={"a"}), ep("cold", running={"a"}), ep("full", running={"a", "b", "c", "d"})
    for e in (warm, full):
        s.pre_request(req("sql", f"old-{e.name}"), {"default": e})
        s.on_complete(f"old-{e.name}")       # finished: no count, but probably still loaded there
    assert s.history.count("warm", "sql") == 0 and s.history.recent("warm", 4) == {"sql"}
    assert s.score(req(), [warm, cold, full]) == {"warm": 0.9, "cold": 0.8, "full": 0.0}
    for i, other in enumerate(("p", "q", "r", "s")):   # four other adapters sent since: evicted by now
        s.pre_request(req(other, f"n{i}"), {"default": warm})
        s.on_complete(f"n{i}")
    assert s.score(req(), [warm]) == {"warm": 0.8}


def test_history_rule_full_scores_zero_and_no_adapter_scores_one():
    s = hist_scorer()
    eps = [ep("full", running={"a", "b"}, max_lora=2), Endpoint(name="nometrics", metrics=None)]
    assert s.score(req(), eps) == {"full": 0.0, "nometrics": 0.0}
    assert s.score(req(""), eps) == {"full": 1.0, "nometrics": 1.0}


def test_history_on_without_history_scores_like_metric_only():
    """Nothing sent yet: the history rules reduce to llm-d's metric-only rules."""
    eps = _all_small_states()
    on, off = hist_scorer(), LoraAffinityScorer()
    for target in ("sql", "z"):
        assert on.score(req(target), eps) == off.score(req(target), eps)


# ------------------------------------------------------------------------ lifecycle counts
def test_scheduler_lifecycle_counts_dispatch_complete_and_abort():
    scorer = hist_scorer()
    picker = MaxScorePicker(rng=random.Random(1))
    sched = Scheduler(profiles=[SchedulingProfile("default", [], [(scorer, 1.0)], picker)])
    eps = [ep("a", max_lora=4), ep("b", max_lora=4)]
    r1 = req("sql", "r1")
    res = sched.schedule(r1, eps, now=0.0)
    sched.pre_request(r1, res, now=0.0)
    first = res.endpoint.name
    assert scorer.history.count(first, "sql") == 1
    # the next request for the adapter follows the history (1.0) although no scrape shows it
    r2 = req("sql", "r2")
    res2 = sched.schedule(r2, eps, now=0.1)
    assert res2.endpoint.name == first and res2.scores[first] == 1.0
    sched.pre_request(r2, res2, now=0.1)
    assert scorer.history.count(first, "sql") == 2
    sched.on_complete("r1", now=0.5)
    assert scorer.history.count(first, "sql") == 1
    sched.on_complete("r2", now=0.6, status=503, aborted=True)
    assert scorer.history.count(first, "sql") == 0
    sched.on_complete("r2", now=0.7, aborted=True)
    assert scorer.history.count(first, "sql") == 0


def test_async_schedule_uses_the_same_history():
    scorer = hist_scorer()
    sched = Scheduler(profiles=[SchedulingProfile("default", [], [(scorer, 1.0)], MaxScorePicker())])
    eps = [ep("a"), ep("b")]
    res = asyncio.run(sched.aschedule(req("sql", "x"), eps, now=0.0))
    sched.pre_request(req("sql", "x"), res)
    assert scorer.history.count(res.endpoint.name, "sql") == 1


# ------------------------------------------------------------------------ reconcile
def test_reconcile_runs_through_the_scheduler_interval():
    scorer = hist_scorer(reconcile_interval_seconds=0.5)
    sched = Scheduler(profiles=[SchedulingProfile("default", [], [(scorer, 1.0)], MaxScorePicker())])
    eps = [ep("a", max_lora=1)]
    r = req("sql", "stuck")
    sched.pre_request(r, sched.schedule(r, eps, now=0.0))
    assert scorer.score(req("sql", "n"), eps) == {"a": 1.0}
    for t in (0.5, 1.0):                      # two reconciles where the metrics never show "sql"
        sched.schedule(req("chat", f"q{t}"), eps, now=t)
    assert scorer.history.count("a", "sql") == 0 and scorer.history.reconciles == 2


# ------------------------------------------------------------------------ config
def test_from_config_parameters_and_validation():
    s = LoraAffinityScorer.from_config({"requestHistory": True, "reconcileIntervalSeconds": 2})
    assert s.request_history and s.reconcile_interval_seconds == 2.0 and s.history.interval_s == 2.0
    d = LoraAffinityScorer.from_config(None)
    assert (d.request_history, d.reconcile_interval_seconds, d.history) == (False, 1.0, None)
    for bad, name in (({"reconcileIntervalSeconds": 0}, "reconcileIntervalSeconds"),
                      ({"reconcileIntervalSeconds": -1}, "reconcileIntervalSeconds"),
                      ({"requestHistory": "yes"}, "requestHistory")):
        with pytest.raises(ConfigError, match=name):
            LoraAffinityScorer.from_config(bad)


def test_scheduler_from_config_wires_the_history():
    cfg = """
plugins:
- type: lora-affinity-scorer
  parameters: {requestHistory: true, reconcileIntervalSeconds: 1}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: lora-affinity-scorer
    weight: 2
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""
    sched = build_scheduler(cfg, rng=random.Random(3))
    scorer = sched.lifecycle_plugins[0]
    assert isinstance(scorer, LoraAffinityScorer) and scorer.request_history
    eps = [ep("a"), ep("b"), ep("c")]
    picks = []
    for i in range(3):
        r = req("sql", f"r{i}")
        res = sched.schedule(r, eps, now=0.01 * i)
        sched.pre_request(r, res)
        picks.append(res.endpoint.name)
    assert len(set(picks)) == 1 and scorer.history.count(picks[0], "sql") == 3
    for i in range(3):
        sched.on_complete(f"r{i}")
    assert scorer.history.count(picks[0], "sql") == 0


def test_request_history_false_is_the_metric_only_scorer():
    """Exhaustive over small adapter states: identical scores, and no lifecycle state."""
    eps = _all_small_states()
    off = LoraAffinityScorer.from_config({"requestHistory": False})
    sched = Scheduler(profiles=[SchedulingProfile("default", [], [(off, 1.0)], MaxScorePicker())])
    for target in ("sql", "z", ""):
        r = req(target, f"t{target}")
        sched.pre_request(r, sched.schedule(r, eps, now=0.0))
        got = off.score(req(target), eps)
        for e in eps:
            m = e.metrics
            if m is None:
                want = 0.0
            elif target in m.active_lora_adapters:
                want = 1.0
            elif len(m.active_lora_adapters) + len(m.waiting_lora_adapters) < m.max_active_lora:
                want = 0.8
            elif target in m.waiting_lora_adapters:
                want = 0.6
            else:
                want = 0.0
            assert got[e.name] == want, (target, e)
    assert off.history is None


def _all_small_states() -> list[Endpoint]:
    adapters = ("sql", "x", "y")
    subsets = [frozenset(c) for n in range(3) for c in itertools.combinations(adapters, n)]
    eps = [Endpoint(name=f"e{i}", metrics=EndpointMetrics(active_lora_adapters=a, waiting_lora_adapters=w,
                                                          max_active_lora=m))
           for i, (a, w, m) in enumerate(itertools.product(subsets, subsets, (0, 1, 2, 3)))]
    eps.append(Endpoint(name="none", metrics=None))
    return eps


@pytest.mark.parametrize("max_lora", [0, 4])
def test_metric_only_scorer_is_neutral_where_no_adapter_is_loaded(max_lora):
    """The recommended profile carries the metric-only scorer for every pool: where no server
    has an adapter loaded or waiting (no LoRA, or not yet), every endpoint scores alike, so a
    max-score pick is the one the other scorers make, for base-model requests and adapters."""
    scorer = LoraAffinityScorer()
    eps = [ep(f"e{i}", max_lora=max_lora) for i in range(5)]
    for target in ("", "meta-llama/Llama-3.1-8B", "sql"):
        assert len(set(scorer.score(req(target), eps).values())) == 1


def test_lora_affinity_scorer_order_of_rules():
    def lora(name, active=(), waiting=(), max_lora=0):
        return Endpoint(name=name, metrics=EndpointMetrics(active_lora_adapters=frozenset(active),
                                                           waiting_lora_adapters=frozenset(waiting),
                                                           max_active_lora=max_lora))
    req = InferenceRequest(target_model="sql")
    eps = [lora("active", active={"sql"}), lora("spare", active={"x"}, waiting={"sql"}, max_lora=4),
           lora("waiting", active={"x", "y"}, waiting={"sql"}, max_lora=3), lora("full", active={"x"}, max_lora=1),
           lora("nomax", waiting={"sql"}), Endpoint(name="nometrics", metrics=None)]
    assert LoraAffinityScorer().score(req, eps) == {"active": 1.0, "spare": 0.8, "waiting": 0.6, "full": 0.0,
                                                     "nomax": 0.6, "nometrics": 0.0}
    with pytest.raises(ConfigError):
        LoraAffinityScorer.from_config({"anything": 1})
