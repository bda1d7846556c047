"""plugins/filter/encode.py: ``encode-filter`` keeps the endpoints whose upstream role can encode (B4.7)."""
from __future__ import annotations

from epp_client import Endpoint, InferenceRequest
from epp_client.plugins import EncodeFilter
from support.pd import ROLE, ROLES


def test_encode_filter_accepts_exactly_the_upstream_roles():
    eps = [Endpoint(name=str(r), labels={} if r is None else {ROLE: r}) for r in ROLES]
    assert [e.name for e in EncodeFilter().filter(InferenceRequest(), eps)] == [
        "encode", "encode-prefill", "encode-prefill-decode"]
    assert EncodeFilter.from_config(None).filter(InferenceRequest(), []) == []
