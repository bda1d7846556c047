"""epp_client.plugins.filter.role: the shared base of the role filters keeps the endpoints whose
``llm-d.ai/role`` label is one of its roles (unlabelled ones only if it says so), in order."""
from __future__ import annotations

from typing import ClassVar

from epp_client import Endpoint, InferenceRequest
from epp_client.plugins.filter.role import ROLE_DECODE, ROLE_LABEL, ROLE_PREFILL, RoleFilter


def test_roles_and_unlabelled_endpoints():
    class DecodeOnly(RoleFilter):
        ROLES: ClassVar[frozenset[str]] = frozenset({ROLE_DECODE})

    class DecodeOrUnlabelled(DecodeOnly):
        ACCEPT_UNLABELLED: ClassVar[bool] = True

    eps = [Endpoint(name="p", labels={ROLE_LABEL: ROLE_PREFILL}), Endpoint(name="u"),
           Endpoint(name="d1", labels={ROLE_LABEL: ROLE_DECODE}), Endpoint(name="d2", labels={ROLE_LABEL: ROLE_DECODE})]
    assert [e.name for e in DecodeOnly().filter(InferenceRequest(), eps)] == ["d1", "d2"]
    assert [e.name for e in DecodeOrUnlabelled().filter(InferenceRequest(), eps)] == ["u", "d1", "d2"]
    assert RoleFilter().filter(InferenceRequest(), eps) == []
