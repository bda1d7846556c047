"""plugins/filter/prefill.py: ``prefill-filter`` keeps the endpoints whose upstream role can prefill (B4.7)."""
from __future__ import annotations

from epp_client import Endpoint, InferenceRequest
from epp_client.plugins import PrefillFilter
from support.pd import ROLE, ROLES


def test_prefill_filter_accepts_exactly_the_upstream_roles():
    eps = [Endpoint(name=str(r), labels={} if r is None else {ROLE: r}) for r in ROLES]
    assert [e.name for e in PrefillFilter().filter(InferenceRequest(), eps)] == [
        "prefill", "prefill-decode", "encode-prefill", "encode-prefill-decode", "both"]
    assert PrefillFilter.from_config(None).filter(InferenceRequest(), []) == []
