"""Role filters (B4.7): keep the endpoints whose ``llm-d.ai/role`` label names a role
that can run the stage. Unlike the predicted-latency filters these may return an empty
list (no endpoint of that role): the profile then fails, as upstream.
"""
from __future__ import annotations

from typing import ClassVar

from epp_client.framework.params import Plugin
from epp_client.types import Endpoint, InferenceRequest

ROLE_LABEL = "llm-d.ai/role"

#: Upstream role label values.
ROLE_DECODE = "decode"
ROLE_PREFILL = "prefill"
ROLE_ENCODE = "encode"
ROLE_PREFILL_DECODE = "prefill-decode"
ROLE_ENCODE_PREFILL = "encode-prefill"
ROLE_ENCODE_PREFILL_DECODE = "encode-prefill-decode"
ROLE_BOTH = "both"  # deprecated alias of prefill-decode


class RoleFilter(Plugin):
    ROLES: ClassVar[frozenset[str]] = frozenset()
    ACCEPT_UNLABELLED: ClassVar[bool] = False

    def accepts(self, e: Endpoint) -> bool:
        role = e.labels.get(ROLE_LABEL)
        if role is None:
            return self.ACCEPT_UNLABELLED
        return role in self.ROLES

    def filter(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return [e for e in endpoints if self.accepts(e)]
