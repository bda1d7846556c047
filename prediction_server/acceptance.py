"""Which bundle may replace the served one: lineage, version, learned or prior-only.

A bundle's lineage (manifest ``lineage``: ``{"id", "created_at"}``) names the store it
was trained from; versions count up within one lineage only. A training server restarted
on an empty data directory starts a new lineage at ``v000001``. The rule, in order:

1. nothing published is served yet (the built-in prior): accept;
2. a prior-only bundle never replaces a learned model, whatever its lineage or version;
3. same lineage (or neither has one): accept only a strictly higher version, never a
   downgrade;
4. different lineages: accept only a lineage created later than the served one. A bundle
   without a lineage (older training servers) ranks below every lineage, so a served
   legacy bundle is replaced by the first acceptable bundle that has one, and a huge
   version number in an old lineage no longer pins the fleet once a newer lineage appears.

Every lineage is validated when its manifest is (``features.bundle.validate_lineage``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from features.bundle import BundleError, validate_lineage, version_seq
from features.manifest import Manifest


@dataclass(frozen=True)
class Rank:
    """What the acceptance rule needs to know about one bundle."""

    version: str
    published: bool  # False only for the built-in prior
    learned: bool
    lineage_id: str | None
    lineage_created: float  # -inf without a lineage
    seq: int

    @classmethod
    def of(cls, manifest: Manifest, version: str, learned: bool) -> Rank:
        try:
            seq = version_seq(version)
        except BundleError:  # the built-in prior ("prior-default")
            return cls(version, False, learned, None, -math.inf, -1)
        lineage = manifest.lineage
        lid, created = validate_lineage(lineage.to_json()) if lineage is not None else (None, -math.inf)
        return cls(version, True, learned, lid, created, seq)

    @classmethod
    def of_manifest(cls, manifest: Manifest) -> Rank:
        """Rank of a manifest (learned when a target has a model file or a base alone)."""
        return cls.of(manifest, manifest.version, bool(manifest.learned_targets))

    def key(self) -> tuple[float, int]:
        """Sort key among candidates: newest lineage first, then highest version."""
        return self.lineage_created, self.seq


def refusal(served: Rank, candidate: Rank) -> str | None:
    """None when ``candidate`` may replace ``served``; otherwise why not (for logs)."""
    if not served.published:
        return None
    if served.learned and not candidate.learned:
        return f"{candidate.version} is prior-only and never replaces the learned model {served.version}"
    if candidate.lineage_id == served.lineage_id:
        if candidate.seq > served.seq:
            return None
        return f"{candidate.version} is not newer than the served {served.version} of the same lineage"
    if candidate.lineage_created > served.lineage_created:
        return None
    return (f"{candidate.version} comes from lineage {candidate.lineage_id or '(none)'}, older than the served "
            f"{served.version}'s lineage {served.lineage_id}")
