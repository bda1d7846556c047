"""``decode-filter`` (B4.7): the endpoints that can decode."""
from __future__ import annotations

from epp_client.framework.protocols import Filter
from epp_client.framework.registry import plugin
from epp_client.plugins.filter.role import (
    ROLE_BOTH,
    ROLE_DECODE,
    ROLE_ENCODE_PREFILL_DECODE,
    ROLE_PREFILL_DECODE,
    RoleFilter,
)


@plugin("decode-filter", Filter)
class DecodeFilter(RoleFilter):
    """``decode-filter``: decode, prefill-decode, both, encode-prefill-decode, or no label."""

    ROLES = frozenset({ROLE_DECODE, ROLE_PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE})
    ACCEPT_UNLABELLED = True
