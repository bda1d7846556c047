"""``prefill-filter`` (B4.7): the endpoints that can prefill."""
from __future__ import annotations

from epp_client.framework.protocols import Filter
from epp_client.framework.registry import plugin
from epp_client.plugins.filter.role import (
    ROLE_BOTH,
    ROLE_ENCODE_PREFILL,
    ROLE_ENCODE_PREFILL_DECODE,
    ROLE_PREFILL,
    ROLE_PREFILL_DECODE,
    RoleFilter,
)


@plugin("prefill-filter", Filter)
class PrefillFilter(RoleFilter):
    """``prefill-filter``: prefill, encode-prefill, prefill-decode, both, encode-prefill-decode."""

    ROLES = frozenset({ROLE_PREFILL, ROLE_ENCODE_PREFILL, ROLE_PREFILL_DECODE, ROLE_BOTH,
                       ROLE_ENCODE_PREFILL_DECODE})
