"""epp_client.profiles: the well-known configs are YAML files, loaded by name or by path."""
from __future__ import annotations

import pytest
import yaml

from epp_client.profiles import PROFILES_DIR, RECOMMENDED_CONFIG, WELL_KNOWN_CONFIGS, config_text, profile_text


def test_names_give_the_shipped_yaml_files_and_paths_are_read():
    assert config_text("predicted-latency-recommended") == RECOMMENDED_CONFIG
    assert RECOMMENDED_CONFIG == (PROFILES_DIR / "predicted-latency-recommended.yaml").read_text()
    for text in WELL_KNOWN_CONFIGS.values():
        assert yaml.safe_load(text)["plugins"]
    assert yaml.safe_load(profile_text("helm-reference"))["plugins"]
    path = PROFILES_DIR / "helm-reference.yaml"
    assert config_text(str(path)) == path.read_text()


def test_an_unknown_name_is_an_unreadable_path():
    with pytest.raises(OSError):
        config_text("no-such-profile")
