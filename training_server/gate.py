"""The retrain worker's publish gate (:mod:`training_server.worker`): per target, whether a
candidate's learned model is good enough to replace what is served, on the same held-out rows."""
from __future__ import annotations

from collections.abc import Collection, Mapping


def target_verdicts(candidate: Mapping[str, Mapping], served: Mapping[str, Mapping], *, served_is_prior: bool,
                    tolerance: float, learned: Collection[str] | None = None) -> dict[str, tuple[bool | None, str]]:
    """Per target of the candidate: (True = publish it, False = keep the served one,
    None = no held-out rows to compare on, or ``learned`` is given and the candidate has no
    learned model for it: its prior beating the served model is no reason to publish), with a
    reason. Scores are on the same rows."""
    out: dict[str, tuple[bool | None, str]] = {}
    for t, c in candidate.items():
        s = served.get(t)
        if learned is not None and t not in learned:
            out[t] = (None, f"{t}: not learned")
            continue
        if s is None or not s.get("n"):
            out[t] = (None, f"{t}: no held-out rows")
            continue
        limit = s["pinball"] if served_is_prior else s["pinball"] * (1.0 + tolerance)
        what = "prior" if served_is_prior else "served"
        ok = bool(c["pinball"] <= limit)
        out[t] = (ok, f"{t} {c['pinball']:.4g} {'<=' if ok else '>'} {limit:.4g} ({what} {s['pinball']:.4g})")
    return out


def publish_gate(candidate: Mapping[str, Mapping], served: Mapping[str, Mapping], *, served_is_prior: bool,
                 tolerance: float, learned: Collection[str] | None = None) -> tuple[bool, str]:
    """Publish when at least one compared target's learned candidate model is good enough (those
    that are not keep the served model; see RetrainWorker._compose)."""
    verdicts = target_verdicts(candidate, served, served_is_prior=served_is_prior, tolerance=tolerance,
                               learned=learned)
    reason = "; ".join(r for _, r in verdicts.values()) or "no targets"
    if not any(v is True for v, _ in verdicts.values()):
        if all(v is None for v, _ in verdicts.values()):
            return False, "no held-out rows to compare on"
        return False, reason
    return True, reason
