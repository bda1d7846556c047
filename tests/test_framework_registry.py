"""epp_client.framework.registry: registration and discovery of plugin types, roles, the parameter reference in docs."""
from __future__ import annotations

import random
import re
import sys
import textwrap
from pathlib import Path

import pytest

from epp_client import ConfigError, Endpoint, EndpointMetrics, InferenceRequest
from epp_client.framework.loader import build_scheduler
from epp_client.framework.params import Plugin
from epp_client.framework.protocols import Filter, Scorer
from epp_client.framework.registry import discover, plugin, reference, role_of
from epp_client.plugins import (
    DisaggProfileHandler,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"

TYPES = {
    "always-disagg-pd-decider", "decode-filter", "disagg-profile-handler", "encode-filter", "inflight-load-producer",
    "kv-cache-utilization-scorer", "latency-scorer", "latency-slo-admitter", "lora-affinity-scorer",
    "max-score-picker", "predicted-latency-producer", "predicted-pd-decider", "prefill-filter",
    "prefix-based-pd-decider", "prefix-cache-affinity-filter", "prefix-cache-scorer", "probabilistic-admitter",
    "queue-scorer", "random-picker", "slo-headroom-tier-filter", "weighted-random-picker",
}


def test_discovery_finds_every_plugin_type_and_each_satisfies_its_role():
    found = discover()
    assert TYPES <= set(found)
    for name, cls in found.items():
        assert cls.TYPE == name
        role = role_of(cls)
        assert role is not None and isinstance(cls(), role), name


def _write_package(tmp_path: Path, monkeypatch, name: str, modules: dict[str, str]) -> str:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod, text in modules.items():
        (pkg / f"{mod}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    return name


SCORER_MODULE = """
    from epp_client.framework.params import Plugin, param, within
    from epp_client.framework.protocols import Scorer
    from epp_client.framework.registry import plugin

    @plugin("constant-scorer", Scorer)
    class ConstantScorer(Plugin):
        level: float = param("level", default=0.5, check=within(0.0, 1.0), doc="the score of endpoint b")

        def score(self, request, endpoints):
            return {e.name: self.level if e.name == "b" else 0.0 for e in endpoints}
"""


def test_a_new_plugin_is_one_module(tmp_path, monkeypatch):
    pkg = _write_package(tmp_path, monkeypatch, "extra_plugins_one", {"constant": SCORER_MODULE})
    found = discover(packages=("epp_client.plugins", pkg))
    cls = found["constant-scorer"]
    assert role_of(cls) is Scorer and TYPES <= set(found)
    cfg = """
    plugins:
    - type: constant-scorer
      parameters: {level: 0.25}
    - type: max-score-picker
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: constant-scorer, weight: 2}, {pluginRef: max-score-picker}]
    """
    sched = build_scheduler(cfg, rng=random.Random(1), plugin_types=found)
    (scorer, weight), = sched.profiles[0].scorers
    assert isinstance(scorer, cls) and scorer.level == 0.25 and weight == 2.0
    eps = [Endpoint(name="a", metrics=EndpointMetrics()), Endpoint(name="b", metrics=EndpointMetrics())]
    res = sched.schedule(InferenceRequest(request_id="r"), eps)
    assert [e.name for e in res.picked] == ["b"] and res.scores == {"a": 0.0, "b": 0.5}
    with pytest.raises(ConfigError) as e:
        build_scheduler("plugins: [{type: constant-scorer, parameters: {level: 2}}]", plugin_types=found)
    assert e.value.param == "plugins[0].parameters.level" and "2" in e.value.msg
    # without the extra package the type is unknown
    with pytest.raises(ConfigError, match="unknown plugin type 'constant-scorer'"):
        build_scheduler("plugins: [{type: constant-scorer}]")


def test_a_type_registered_twice_is_refused(tmp_path, monkeypatch):
    pkg = _write_package(tmp_path, monkeypatch, "extra_plugins_dup",
                         {"one": SCORER_MODULE, "two": SCORER_MODULE})
    with pytest.raises(TypeError, match="'constant-scorer' is registered twice"):
        discover(packages=(pkg,), modules=())


def test_registration_checks_the_role():
    with pytest.raises(TypeError, match="'half-filter', a Filter, but has no filter"):
        @plugin("half-filter", Filter)
        class HalfFilter(Plugin):
            def score(self, request, endpoints):
                return {}

    with pytest.raises(TypeError, match="role must be one of"):
        plugin("odd", dict)


def test_the_doc_lists_the_declared_parameters():
    text = DOC.read_text()
    m = re.search(r"<!-- parameter-reference:begin -->\n(.*?)<!-- parameter-reference:end -->", text, re.S)
    assert m, "docs/plugins.md lost its parameter reference markers"
    assert m.group(1) == reference(), (
        "docs/plugins.md B6 differs from the declarations; regenerate it with "
        "python -c 'from epp_client.framework.registry import reference; print(reference(), end=\"\")'")
    assert "`disagg-profile-handler` | ProfileHandler | (structured)" in m.group(1)
    assert DisaggProfileHandler.__doc__
