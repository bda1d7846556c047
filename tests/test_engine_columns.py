"""``DecodingView.over_counts``: the SLO counts of a decision's candidates from the producer's
columns equal the twin's per-request count (``_all_decoding``'s: over at the end of the run with
the request and not at the end of the run without it, at least 0), to the last bit of every
comparison; slots skipped (SLO +inf) and endpoints not judged count nothing."""
from __future__ import annotations

import math
import random

import numpy as np

from epp_client.engine.columns import DecodingView


def _count(slots, t, steps, t0, steps0) -> int:
    """The twin's count over one endpoint's requests: (decode time, tokens after the first, SLO)."""
    harm = _flips(slots, t, steps, t0, steps0)
    return harm if harm > 0 else 0


def _flips(slots, t, steps, t0, steps0) -> int:
    """Over with the request less over without it (the count before it is floored at 0)."""
    harm = 0
    for d, k, slo in slots:
        if slo > 0:
            if (d + t) / (k + steps) > slo:
                harm += 1
            if (d + t0) / (k + steps0) > slo:
                harm -= 1
    return harm


def test_the_counts_from_the_columns_are_the_per_request_counts():
    rng = random.Random(3)
    clamped = 0
    for _ in range(300):
        size = rng.randint(1, 12)
        slots = [(rng.choice((0.0, rng.uniform(0.0, 3_000.0))), rng.randint(0, 400),
                  rng.choice((math.inf, 10.0, 20.0, 50.0)), rng.randrange(size)) for _ in range(rng.randint(0, 80))]
        view = DecodingView({f"e{i}": i for i in range(size)}, size, [0] * size, [1] * size, [0.0] * size,
                            np.array([s[0] for s in slots], dtype=np.float64),
                            np.array([s[1] for s in slots], dtype=np.int64),
                            np.array([s[2] for s in slots], dtype=np.float64),
                            np.array([s[3] for s in slots], dtype=np.int64))
        judged = []
        for i in rng.sample(range(size), rng.randint(0, size)):
            t = rng.uniform(1.0, 2_000.0)
            steps = rng.randint(1, 60)
            judged.append((i, (0.0, 0.0, t, steps, t + rng.uniform(-30.0, 300.0), rng.randint(1, steps + 20))))
        want = [_count([(d, k, slo) for d, k, slo, e in slots if e == i and slo < math.inf], *runs[2:])
                for i, runs in judged]
        got = view.over_counts(judged)
        assert got == want and all(type(h) is int for h in got)
        # the queued requests' part (their flips, either sign) joins the slots' before the floor at 0
        extra = [rng.randint(-3, 3) for _ in judged]
        flips = [_flips([(d, k, slo) for d, k, slo, e in slots if e == i and slo < math.inf], *runs[2:])
                 for i, runs in judged]
        assert view.over_counts(judged, extra) == [max(0, f + x) for f, x in zip(flips, extra)]
        clamped += sum(_flips([(d, k, slo) for d, k, slo, e in slots if e == i], *runs[2:]) < 0 for i, runs in judged)
    assert clamped > 100     # counts floored at 0 were compared
