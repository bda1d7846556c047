"""Training-server settings: defaults, parsing, validation naming the variable, CLI exit code."""
from pathlib import Path

import pytest

from training_server.__main__ import main
from training_server.settings import Settings, SettingsError


def test_defaults_match_the_documented_table():
    s = Settings.from_env({})
    assert (s.host, s.port, s.data_dir) == ("127.0.0.1", 8000, Path("./latency-data"))
    assert (s.model_type, s.objective_type, s.quantile_alpha) == ("xgboost", "quantile", 0.9)
    assert (s.retraining_interval_sec, s.min_samples_for_retrain) == (2.0, 100)
    assert (s.max_training_data_size_per_bucket, s.test_train_ratio) == (5000, 0.1)
    assert (s.max_stored_samples, s.max_body_bytes, s.ingest_queue_size) == (1_000_000, 16 * 1024 * 1024, 100_000)
    assert s.max_inflight_bytes == 16 * 1024 * 1024  # one body of the largest size at a time
    assert (s.api_token, s.bundles_keep, s.publish_tolerance, s.log_level, s.seed_bundle) == (None, 5, 0.02, "info", None)
    assert s.store_path == Path("./latency-data/samples.sqlite3")
    # the README's table is generated from these declarations: tests/test_settings.py


def test_environment_parsing_and_overrides(tmp_path):
    env = {"LATENCY_TRAINING_PORT": "9001", "LATENCY_MODEL_TYPE": "LightGBM", "LATENCY_QUANTILE_ALPHA": "0.95",
           "LATENCY_API_TOKEN": "s3cret-token", "LATENCY_SEED_BUNDLE": str(tmp_path), "LATENCY_LOG_LEVEL": "DEBUG"}
    s = Settings.from_env(env, port="9002", data_dir=str(tmp_path))
    assert s.port == 9002  # override wins over the environment
    assert s.model_type == "lightgbm" and s.quantile_alpha == 0.95 and s.log_level == "debug"
    assert s.api_token == "s3cret-token" and s.seed_bundle == tmp_path and s.data_dir == tmp_path
    assert Settings.from_env(env, port=None).port == 9001  # None means "flag not given"
    with pytest.raises(Exception):
        s.port = 1  # frozen


@pytest.mark.parametrize("env,value", [
    ("LATENCY_TRAINING_PORT", "http"), ("LATENCY_TRAINING_PORT", "70000"), ("LATENCY_TRAINING_PORT", "0"),
    ("LATENCY_MODEL_TYPE", "catboost"), ("LATENCY_OBJECTIVE_TYPE", "median"),
    ("LATENCY_QUANTILE_ALPHA", "1"), ("LATENCY_QUANTILE_ALPHA", "nan"), ("LATENCY_QUANTILE_ALPHA", "x"),
    ("LATENCY_RETRAINING_INTERVAL_SEC", "0"), ("LATENCY_MIN_SAMPLES_FOR_RETRAIN", "-3"),
    ("LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET", "1.5"), ("LATENCY_TEST_TRAIN_RATIO", "0"),
    ("LATENCY_TEST_TRAIN_RATIO", "0.9"), ("LATENCY_MAX_STORED_SAMPLES", "10"), ("LATENCY_MAX_BODY_BYTES", "1"),
    ("LATENCY_INGEST_QUEUE_SIZE", "0"), ("LATENCY_MAX_INFLIGHT_BYTES", "12k"), ("LATENCY_MAX_INFLIGHT_BYTES", "100"), ("LATENCY_API_TOKEN", "short"), ("LATENCY_BUNDLES_KEEP", "0"),
    ("LATENCY_PUBLISH_TOLERANCE", "-0.1"), ("LATENCY_LOG_LEVEL", "verbose"),
    ("LATENCY_SEED_BUNDLE", "/nonexistent/bundle"), ("LATENCY_TRAINING_HOST", "bad host"),
])
def test_bad_values_name_the_variable(env, value):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({env: value})
    assert e.value.env == env and env in str(e.value)


def test_the_inflight_budget_must_hold_a_body_of_the_largest_size():
    assert Settings.from_env({"LATENCY_MAX_BODY_BYTES": "4096", "LATENCY_MAX_INFLIGHT_BYTES": "4096"}
                             ).max_inflight_bytes == 4096
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"LATENCY_MAX_BODY_BYTES": "33554432"})  # over the default budget
    assert e.value.env == "LATENCY_MAX_INFLIGHT_BYTES" and "LATENCY_MAX_BODY_BYTES" in str(e.value)


def test_cli_exits_2_naming_the_bad_setting(monkeypatch, capsys):
    monkeypatch.setenv("LATENCY_OBJECTIVE_TYPE", "nope")
    assert main(["--port", "8123"]) == 2
    assert "LATENCY_OBJECTIVE_TYPE" in capsys.readouterr().err
    monkeypatch.delenv("LATENCY_OBJECTIVE_TYPE")
    assert main(["--port", "not-a-port"]) == 2
    err = capsys.readouterr().err   # the flag the user passed is named, not its variable
    assert "bad setting --port: must be an integer" in err and "LATENCY_TRAINING_PORT" not in err


def test_data_dir_that_is_a_file_is_refused_at_start_up(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    for bad in (a_file, a_file / "below"):
        with pytest.raises(SettingsError) as e:
            Settings.from_env({"LATENCY_DATA_DIR": str(bad)})
        assert e.value.env == "LATENCY_DATA_DIR" and "not a directory" in str(e.value)
    # a directory still to be created is fine
    assert Settings.from_env({"LATENCY_DATA_DIR": str(tmp_path / "new" / "dir")}).data_dir == tmp_path / "new" / "dir"
    monkeypatch.setenv("LATENCY_DATA_DIR", str(a_file))
    assert main(["--port", "8123"]) == 2
    err = capsys.readouterr().err
    assert "LATENCY_DATA_DIR" in err and str(a_file) in err and "Traceback" not in err
