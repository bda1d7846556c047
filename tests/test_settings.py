"""The declarative settings (features/settings.py): parsing rules, every bad value reported
at once by variable, keyword overrides, and the README tables generated from the
declarations of both servers, the gateway and the EPP clients."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from epp_client.settings import PredictorSettings, ReporterSettings
from features.settings import (
    EnvSettings,
    SettingsError,
    boolean,
    http_url,
    integer,
    number,
    optional,
    setting,
    text,
    token,
    url_list,
)
from prediction_server.settings import Settings as PredictionSettings
from training_server.settings import Settings as TrainingSettings

README = Path(__file__).resolve().parents[1] / "README.md"
DECLARED = [TrainingSettings, PredictionSettings, GatewaySettings, PredictorSettings, ReporterSettings]


@dataclass(frozen=True)
class Demo(EnvSettings):
    size: int = setting("DEMO_SIZE", 4, integer(1, 10), "a size")
    ratio: float = setting("DEMO_RATIO", 0.5, number(0.0, 1.0, hi_open=True), "a ratio")
    on: bool = setting("DEMO_ON", False, boolean, "a switch")
    url: str | None = setting("DEMO_URL", None, optional(http_url), "a URL")
    tag: str = setting(None, "x", text)

    def check(self) -> None:
        if self.on and self.url is None:
            raise SettingsError("DEMO_URL", "is required when DEMO_ON is true")


def test_every_bad_value_is_reported_at_once_by_variable_and_value():
    with pytest.raises(SettingsError) as e:
        Demo.from_env({"DEMO_SIZE": "11", "DEMO_RATIO": "one", "DEMO_ON": "yes"})
    assert [env for env, _ in e.value.problems] == ["DEMO_SIZE", "DEMO_RATIO"]
    assert str(e.value) == "DEMO_SIZE: must be >= 1 and <= 10, got 11; DEMO_RATIO: must be a number, got 'one'"
    assert (e.value.env, e.value.msg) == ("DEMO_SIZE", "must be >= 1 and <= 10, got 11")
    assert isinstance(e.value, ValueError)


def test_rules_across_fields_run_once_every_field_parsed():
    with pytest.raises(SettingsError, match="^DEMO_URL: is required when DEMO_ON is true$"):
        Demo.from_env({"DEMO_ON": "true"})
    d = Demo.from_env({"DEMO_ON": "on", "DEMO_URL": "http://h:1/"})
    assert (d.on, d.url) == (True, "http://h:1")


def test_overrides_win_none_means_not_given_and_construction_validates():
    d = Demo.from_env({"DEMO_SIZE": "7"}, size=None, ratio="0.25")
    assert (d.size, d.ratio, d.on, d.url, d.tag) == (7, 0.25, False, None, "x")
    assert Demo.from_env({"DEMO_SIZE": "bad"}, size=3).size == 3  # the variable is not read when overridden
    with pytest.raises(TypeError, match="unknown settings"):
        Demo.from_env({}, colour="red")
    with pytest.raises(SettingsError, match="^DEMO_SIZE: "):
        Demo(size=0)
    with pytest.raises(SettingsError, match="^tag: "):  # no variable: named by its attribute
        Demo(tag=3)
    with pytest.raises(SettingsError, match="^DEMO_RATIO: "):
        Demo().replace(ratio=1.0)
    assert Demo().replace(ratio="0.75").ratio == 0.75


def test_blank_variables_are_values_unless_the_class_says_otherwise():
    with pytest.raises(SettingsError, match="DEMO_SIZE: must be an integer, got ' '"):
        Demo.from_env({"DEMO_SIZE": " "})

    @dataclass(frozen=True)
    class Lenient(Demo):
        blank_is_unset = True

    assert Lenient.from_env({"DEMO_SIZE": " "}).size == 4


@pytest.mark.parametrize("parse,good,bad", [
    (integer(0, 5), [("3", 3), (" +5 ", 5), (0, 0)], ["1.5", "12k", True, 2.0, "", "6", "-1"]),
    (integer(1), [("99999999999", 99999999999)], ["0", None]),
    (number(0.0, 1.0, lo_open=True), [("1", 1.0), (0.5, 0.5)], ["0", "nan", "inf", "x", False, "1.01"]),
    (number(0.0, lo_open=True), [("1e9", 1e9)], ["inf", "-inf", "0"]),
    (boolean, [("TRUE", True), ("off", False), ("", False), (True, True)], ["maybe", 1, None]),
    (http_url, [(" https://h:8/ ", "https://h:8")], ["ftp://h", "localhost:8000", "http://", "http://h:99999"]),
    (url_list(min_items=1, unique=True), [("http://a:1, ,http://b:2", ["http://a:1", "http://b:2"])],
     ["", "http://a:1,http://a:1/", "http://a:1,b"]),
    (token, [("", None), (None, None), ("12345678", "12345678")], ["short", " padded-token ", "tab\tinside-it"]),
])
def test_parsers(parse, good, bad):
    for raw, want in good:
        got = parse(raw)
        assert got == want and type(got) is type(want), raw
    for raw in bad:
        with pytest.raises(ValueError):
            parse(raw)


def test_number_message_names_the_interval():
    with pytest.raises(ValueError, match=r"must be in \(0, 1\), got '1'"):
        number(0.0, 1.0, lo_open=True, hi_open=True)("1")
    with pytest.raises(ValueError, match=r"must be in \(0, inf\), got 0"):
        number(0.0, lo_open=True)(0)
    assert math.isclose(number(0.0)("1e-3"), 0.001)


def _readme_tables() -> list[str]:
    text = README.read_text()
    return re.findall(r"^\| variable \| default \| meaning \|\n(?:\|.*\|\n)+", text, flags=re.M)


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_readme_table_is_generated_from_the_declaration(cls):
    """Fix a failure by pasting ``cls.doc_table()`` over the README's table."""
    tables = [t.rstrip("\n") for t in _readme_tables()]
    assert cls.doc_table() in tables, f"README.md is out of date; its table should read:\n{cls.doc_table()}"


def test_readme_has_no_other_variable_table():
    assert len(_readme_tables()) == len(DECLARED)


def test_every_variable_is_declared_with_help_and_each_class_has_distinct_names():
    for cls in DECLARED:
        names = list(cls.env_names().values())
        assert len(names) == len(set(names)), cls
        assert all(f"| `{n}` |" in cls.doc_table() for n in names)
        assert "|  |" not in cls.doc_table(), f"{cls.__name__}: a variable without help text"
    # the defaults are valid: each class builds from an empty environment (the gateway needs endpoints)
    for cls in (TrainingSettings, PredictionSettings, PredictorSettings, ReporterSettings):
        assert cls.from_env({}) == cls()
    assert GatewaySettings.from_env({"LATENCY_GATEWAY_ENDPOINTS": "http://e:1"}).endpoints == ["http://e:1"]


def test_the_gateway_prefix_settings_are_the_prefix_plugins_parameters():
    """Declared once (approx-prefix-cache-producer): the gateway's defaults and bounds are the
    plugin's, so a change there shows here."""
    from epp_client.plugins.producer.approx_prefix import ApproxPrefixProducer

    plugin = ApproxPrefixProducer()
    s = GatewaySettings(endpoints=["http://127.0.0.1:9"])
    assert (s.block_size_tokens, s.max_prefix_blocks, s.lru_capacity_per_endpoint) == (
        plugin.block_size_tokens, plugin.max_prefix_blocks, plugin.lru_capacity_per_endpoint) == (64, 2048, 31250)
    env = {"LATENCY_GATEWAY_ENDPOINTS": "http://127.0.0.1:9", "LATENCY_GATEWAY_BLOCK_SIZE_TOKENS": "32"}
    assert GatewaySettings.from_env(env).block_size_tokens == 32
    for bad, msg in (("0", "must be > 0"), ("x", "must be an integer")):
        with pytest.raises(SettingsError, match=f"LATENCY_GATEWAY_BLOCK_SIZE_TOKENS: {msg}"):
            GatewaySettings.from_env(dict(env, LATENCY_GATEWAY_BLOCK_SIZE_TOKENS=bad))
    with pytest.raises(SettingsError, match="max_prefix_blocks"):
        GatewaySettings(endpoints=["http://127.0.0.1:9"], max_prefix_blocks=0)


def test_gateway_priorities_and_objectives_take_integers_only():
    assert GatewaySettings.from_env({"LATENCY_GATEWAY_ENDPOINTS": "http://127.0.0.1:9",
                                     "LATENCY_GATEWAY_PRIORITIES": "3, -1"}).priorities == [-1, 3]
    assert GatewaySettings(endpoints=["http://127.0.0.1:9"], objectives={"batch": -1}).objectives == {"batch": -1}
    for bad in ({"objectives": {"batch": True}}, {"objectives": ["batch"]}, {"priorities": "1,x"}):
        with pytest.raises(SettingsError, match="integer"):
            GatewaySettings(endpoints=["http://127.0.0.1:9"], **bad)
