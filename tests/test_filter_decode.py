"""plugins/filter/decode.py: ``decode-filter`` keeps the endpoints whose upstream role can decode,
and unlabelled ones (B4.7)."""
from __future__ import annotations

from epp_client import Endpoint, InferenceRequest
from epp_client.plugins import DecodeFilter
from support.pd import ROLE, ROLES


def test_decode_filter_accepts_exactly_the_upstream_roles():
    eps = [Endpoint(name=str(r), labels={} if r is None else {ROLE: r}) for r in ROLES]
    assert [e.name for e in DecodeFilter().filter(InferenceRequest(), eps)] == [
        "decode", "prefill-decode", "encode-prefill-decode", "both", "None"]
    assert DecodeFilter.from_config(None).filter(InferenceRequest(), []) == []
