"""``encode-filter`` (B4.7): the endpoints that can encode."""
from __future__ import annotations

from epp_client.framework.protocols import Filter
from epp_client.framework.registry import plugin
from epp_client.plugins.filter.role import ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE, RoleFilter


@plugin("encode-filter", Filter)
class EncodeFilter(RoleFilter):
    """``encode-filter``: encode, encode-prefill, encode-prefill-decode."""

    ROLES = frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE})
