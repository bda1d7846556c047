"""Rows of the recorded trace, a bundle directory and settings for the prediction-server tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from features.schema import row_from_raw
from load.demo_bundle import build_bundle, load_trace
from prediction_server.settings import Settings

#: a valid prediction row (wire-api §1.1)
ROW = {"kv_cache_percentage": 0.5, "input_token_length": 100, "num_request_waiting": 0,
       "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0}


def trace_rows(n: int, start: int = 0) -> list[dict]:
    raw, _, _ = load_trace()
    return [row_from_raw(raw[(start + i * 53) % len(raw)]) for i in range(n)]


def settings_for(bundle_dir: Path | None = None, **kw) -> Settings:
    return Settings.from_env({}, training_server_url="", bundle_dir=str(bundle_dir) if bundle_dir else None,
                             sync_interval_sec=0.2, **kw)


def xgb_bundle_root(factory: pytest.TempPathFactory) -> Path:
    """A bundle root holding one XGBoost bundle trained on the recorded trace."""
    root = factory.mktemp("xgb-bundles")
    build_bundle(root, 1, "xgboost")
    return root
