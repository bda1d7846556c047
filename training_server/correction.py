"""Online adaptive correction of the served models (adaptive conformal inference).

Every cycle, the live (actual, predicted) pairs that arrived since the last cycle from any
recent learned version (:class:`training_server.feedback.LiveFeedback`) move a per-target
*live factor* (:func:`training_server.calibration.aci_update`, ``ACI_STEP`` per pair in log
units): up on a miss, down on a hit, so that misses settle at 1 - quantile. Each pair is
judged as if predicted with the factor of the moment: the correction remembers the level
(log live factor) of every version it served lately, so a pair predicted before the last
correction reached the prediction servers is rescaled by what changed since, instead of
asking for that correction again (the loop spans seconds, and overshot without it). When
the factor has moved more than ``ACI_REPUBLISH`` since it was last published, the worker
republishes the served models at once with their calibration scaled by the change
(:meth:`LiveCorrection.recalibrated_manifest`): no training, a new version the prediction
servers pick up at their next poll. A drift the features cannot see (e.g. slower GPUs) is
thus corrected within a few hundred live pairs, and noise moves the factor by a few percent.

When the factor has moved more than ``DRIFT_LOG`` from where the last retrain left it, that
is a drift (:meth:`LiveCorrection.drifted`; the worker then weights recent rows more and
retrains early). A retrained model may have partly absorbed such a drift, so while live
pairs keep the correction up to date (``LEVEL_MIN_FEEDBACK`` pairs seen, the last within
``FEEDBACK_FRESH_S`` on the correction's clock) a retrain is handed over by level, not by
copying the factor: the candidate is scaled to the served model's level on the most recent
``LEVEL_ROWS`` stored rows per target (:func:`training_server.calibration.level_factor`), and
the live factor goes on from there. Without live pairs (an EPP that sends no predictions)
every retrained model keeps its own conformal calibration.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import numpy as np

from features.manifest import Manifest
from features.matrix import TARGETS

from . import calibration, trainer
from .feedback import LiveFeedback

#: adaptive-conformal step per live pair (log units): a x1.5 slowdown is corrected within a
#: few hundred pairs (about 13 s of traffic at 25 pairs/s), noise moves the factor by a few %
ACI_STEP = 0.02
#: largest move of the live factor in one cycle (log units): the pairs of one cycle were all
#: predicted with an older factor, so a long cycle (a retrain) must not add them all up
ACI_MAX_MOVE = 0.2
#: the live factor is republished when it has moved this much (log units) since last published
ACI_REPUBLISH = 0.02
#: a live factor this far (log units) from where the last retrain left it is a drift
DRIFT_LOG = 0.1
#: most recent stored rows per target that hand the live correction over to a retrained model
LEVEL_ROWS = 500
#: the live correction governs the level (a retrain is handed over by level) once this many
#: live pairs of a target were seen, the last within FEEDBACK_FRESH_S; without live pairs
#: (an EPP that reports no predictions) a retrained model keeps its own conformal level
LEVEL_MIN_FEEDBACK = 100
FEEDBACK_FRESH_S = 120.0
#: versions whose level the correction remembers (pairs of older ones are judged as predicted)
LEVEL_VERSIONS = 64


def recent_rows(ts, target: str, n: int) -> np.ndarray:
    """Raw rows of the ``n`` newest stored samples (train and test) that have ``target``."""
    parts = [(s.ids, s.raw, s.ttft if target == "ttft" else s.tpot) for s in (ts.train, ts.test)]
    ids = np.concatenate([p[0] for p in parts])
    raw = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    m = y > 0
    ids, raw = ids[m], raw[m]
    return raw[np.argsort(ids)[-n:]]


class LiveCorrection:
    """Per target: the live factor published with the served bundle, the adaptive one (log
    units, moved by every live pair) and the one the last retrain left (log units).
    ``clock`` (seconds, any origin) dates the live pairs for the hand-over's freshness."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.live_factor: dict[str, float] = {}
        self._aci: dict[str, float] = {}
        self._retrain_log: dict[str, float] = {}
        #: live pairs used per target, and when the last ones were (on ``clock``)
        self.pairs_seen = {t: 0 for t in TARGETS}
        self._seen_at = {t: -math.inf for t in TARGETS}
        #: per version served lately, per target: the log live factor its predictions carry, on
        #: the scale of the current one (a retrain's hand-over re-bases the older entries)
        self._levels: OrderedDict[str, dict[str, float]] = OrderedDict()
        self._version: str | None = None

    def _remember(self, version: str | None) -> None:
        if version is None:
            return
        self._levels[version] = {t: math.log(self.live_factor[t]) for t in TARGETS}
        self._levels.move_to_end(version)
        while len(self._levels) > LEVEL_VERSIONS:
            self._levels.popitem(last=False)
        self._version = version

    def sync(self, manifest: Manifest | None, version: str | None = None) -> None:
        """Take the live factors of a newly served (retrained or loaded) bundle's manifest.
        A retrained bundle starts at the level of the one served before it (the hand-over
        matched them), so the remembered levels move with its new factors."""
        prev = self._levels.get(self._version) if self._version is not None else None
        for t in TARGETS:
            cal = None if manifest is None else manifest.calibration_of(t)
            f = 1.0 if cal is None else cal.live
            self.live_factor[t] = f
            self._aci[t] = self._retrain_log[t] = math.log(f)
            if prev is not None:
                shift = math.log(f) - prev[t]
                for lv in self._levels.values():
                    lv[t] += shift
        self._remember(version)

    def update(self, feedback: LiveFeedback, served) -> dict[str, float]:
        """Move the adaptive factors by the pairs waiting in ``feedback`` (drained even when
        unused); the change, per target whose factor moved more than ``ACI_REPUBLISH`` from
        the published one (an empty dict: nothing to republish)."""
        targets = served.manifest.learned_targets if served.source == "learned" else ()
        changed: dict[str, float] = {}
        for t in TARGETS:
            actual, predicted, versions = feedback.take(t)
            if t not in targets or not len(actual):
                continue
            self.pairs_seen[t] += len(actual)
            self._seen_at[t] = self.clock()
            here = math.log(self.live_factor[t])  # unknown versions: judged as predicted
            known = self._levels
            levels = np.array([known[v][t] if v is not None and v in known else here for v in versions])
            self._aci[t] = calibration.aci_update(self._aci[t], actual, predicted, served.quantile,
                                                  ACI_STEP, ACI_MAX_MOVE, levels=levels)
            step = self._aci[t] - math.log(self.live_factor[t])
            if abs(step) > ACI_REPUBLISH:
                changed[t] = math.exp(step)
        return changed

    def recalibrated_manifest(self, served, changed: Mapping[str, float]) -> Manifest:
        """The served manifest with the calibration of ``changed`` targets scaled."""
        cal = {t: c.to_json() for t, c in (served.manifest.calibration or {}).items()}
        for t, f in changed.items():
            cal[t] = calibration.scale_spec(cal.get(t), f)
        return served.manifest.updated(calibration=cal, recalibrated={
            "from": served.version, "factors": dict(changed),
            "live_factor": {t: math.exp(self._aci[t]) for t in changed}})

    def published(self, changed: Mapping[str, float], version: str | None = None) -> list[str]:
        """The recalibrated manifest (``version``) is served: its factors are the published
        ones. Returns the targets whose factor is now a drift (``DRIFT_LOG`` from the last
        retrain's)."""
        for t in changed:
            self.live_factor[t] = math.exp(self._aci[t])
        self._remember(version)
        return [t for t in changed if abs(self._aci[t] - self._retrain_log.get(t, 0.0)) > DRIFT_LOG]

    def governs_level(self, target: str) -> bool:
        """Live pairs keep the correction of ``target`` up to date (enough, and fresh)."""
        return (self.pairs_seen[target] >= LEVEL_MIN_FEEDBACK
                and self.clock() - self._seen_at[target] <= FEEDBACK_FRESH_S)

    def hand_over(self, result: trainer.TrainResult, ts, served) -> None:
        """Carry the live correction over to the candidate's models. While live pairs keep it
        up to date, by level: the candidate is scaled to the served model's level on the most
        recent stored rows (a drift it has partly absorbed is not counted twice); otherwise the
        live factor is applied as it is (1 when no live pair was ever seen)."""
        base = None
        for t in result.targets:
            if t not in result.calibration:
                continue
            f = self.live_factor.get(t, 1.0)
            if self.governs_level(t) and served.source == "learned" and served.has_model(t):
                raw = recent_rows(ts, t, LEVEL_ROWS)
                if len(raw):
                    base = base or trainer.loaded_bundle(result)
                    i = TARGETS.index(t)
                    f = calibration.level_factor(served.predict(raw)[i], base.predict(raw)[i])
            if f != 1.0:
                result.calibration[t] = calibration.scale_spec(result.calibration[t], f)
