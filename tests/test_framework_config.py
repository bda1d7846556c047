"""epp_client.framework.config: stage 1 of reading an EndpointPickerConfig (text, a well-known
name or a mapping -> a checked dict of its top-level sections)."""
from __future__ import annotations

import pytest

from epp_client.framework.config import load_config
from epp_client.types import ConfigError


def test_text_names_and_mappings_become_a_dict_of_sections():
    assert load_config(None) == {} and load_config("") == {}
    assert load_config("plugins: [{type: queue-scorer}]") == {"plugins": [{"type": "queue-scorer"}]}
    named = load_config("predicted-latency-slo")
    assert named["plugins"] and "schedulingProfiles" in named
    given = {"plugins": []}
    copy = load_config(given)
    assert copy == given and copy is not given


@pytest.mark.parametrize("config,param", [
    ("plugins: [unclosed", "config"), ("[1, 2]", "config"), ({"plugins": [], "color": "red"}, "color"),
])
def test_bad_documents_name_the_key(config, param):
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert e.value.param == param
