"""epp_client.settings: the predictor's and the reporter's environment variables, parsed and refused by name."""
from __future__ import annotations

import pytest

from epp_client.predictor import PredictorClient
from epp_client.training import TrainingReporter


def test_from_env(monkeypatch):
    monkeypatch.setenv("PREDICTION_SERVER_URL", " http://127.0.0.1:9001 , http://127.0.0.1:9002")
    monkeypatch.setenv("LATENCY_MAX_BULK_SIZE", "")  # blank: the default
    monkeypatch.setenv("LATENCY_COALESCE_WINDOW_MS", "2")
    c = PredictorClient.from_env()
    assert [s.url for s in c.servers] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert c.max_bulk_size == 100 and c.coalesce_window_s == 0.002 and c.deadline_s == 0.05
    assert PredictorClient.from_env(deadline_ms=7).deadline_s == 0.007  # a keyword wins
    monkeypatch.setenv("TRAINING_SERVER_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("LATENCY_MAX_SAMPLE_SIZE", "10000")
    r = TrainingReporter.from_env(autostart=False)
    assert r.addr.port == 9000 and r.max_sample_size == 10000 and r.flush_interval_s == 1.0


@pytest.mark.parametrize("env,value", [
    ("LATENCY_MAX_BULK_SIZE", "500"), ("LATENCY_MAX_BULK_SIZE", "0"), ("LATENCY_COALESCE_WINDOW_MS", "-1"),
    ("LATENCY_COALESCE_WINDOW_MS", "1ms"), ("LATENCY_MAX_COALESCED_ROWS", "-5"),
    ("LATENCY_MAX_CONCURRENT_DISPATCHES", "0"), ("LATENCY_PREDICTION_DEADLINE_MS", "fast"),
    ("PREDICTION_SERVER_URL", "localhost:8001"), ("PREDICTION_SERVER_URL", "http://a:1,ftp://b"),
])
def test_predictor_from_env_refuses_a_bad_value_naming_the_variable(monkeypatch, env, value):
    """Invalid values used to fall back to the default silently; now start-up stops."""
    from epp_client.settings import SettingsError

    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as e:
        PredictorClient.from_env()
    assert e.value.env == env and f"{env}: " in str(e.value) and value.split(",")[-1] in str(e.value)


@pytest.mark.parametrize("env,value", [
    ("TRAINING_SERVER_URL", "trainer:8000"), ("LATENCY_MAX_SAMPLE_SIZE", "0"), ("LATENCY_MAX_SAMPLE_SIZE", "many"),
    ("LATENCY_FLUSH_INTERVAL_SEC", "-1"), ("LATENCY_FLUSH_INTERVAL_SEC", "0.5"), ("LATENCY_HTTP_TIMEOUT_SEC", "0"),
])
def test_reporter_from_env_refuses_a_bad_value_naming_the_variable(monkeypatch, env, value):
    from epp_client.settings import SettingsError

    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as e:
        TrainingReporter.from_env(autostart=False)
    assert e.value.env == env and f"{env}: " in str(e.value) and value in str(e.value)


def test_from_env_reports_every_bad_variable_at_once(monkeypatch):
    from epp_client.settings import SettingsError

    monkeypatch.setenv("LATENCY_MAX_SAMPLE_SIZE", "0")
    monkeypatch.setenv("LATENCY_HTTP_TIMEOUT_SEC", "soon")
    with pytest.raises(SettingsError) as e:
        TrainingReporter.from_env(autostart=False)
    assert [env for env, _ in e.value.problems] == ["LATENCY_MAX_SAMPLE_SIZE", "LATENCY_HTTP_TIMEOUT_SEC"]
