"""What a real EPP lives with, on by default in every simulated run (docs/evaluation.md §4.1).

:class:`Realism` holds the knobs; ``None`` in their place (``simulate --ideal``) is the
idealised world: one consistent snapshot of every server every scrape interval, exact step
times, identical servers of a preset, exact prompt token counts, no client deadlines, a free
drain after the last arrival.

Every random draw comes from its own generator seeded by (run seed, what it is for, server
index or request id), so a draw never depends on the order of events, on the routing policy
or on the worker process:

- scrapes: each server is scraped every ``scrape_interval_s`` at its own phase, and each
  scrape becomes visible to the router ``scrape_delay_s`` (uniform in the range) later;
- step times: each server has a persistent speed factor (uniform within ``±speed_jitter``),
  and each step's duration is multiplied by a log-normal factor of mean 1 and log-sd
  ``step_sigma`` (:class:`StepNoise`, the one place noise enters a step);
- prompt length: the router sees the gateway's estimate (``gateway.prompt``: UTF-8 bytes /
  ``BYTES_PER_TOKEN``) of a prompt, and hashes its prefix blocks over the same bytes; bytes per
  token is a property of the text (:meth:`Realism.segment_bytes`), so a prefix two prompts share
  has the same bytes in both; the engine runs the true token count;
- client deadlines: a request not finished ``deadline_s`` after its arrival is abandoned
  (the engine frees its slot and KV blocks); the run ends at the last arrival plus the
  deadline (no free drain).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from gateway.prompt import BYTES_PER_TOKEN

#: The gateway's first-byte timeout (gateway settings ``first_byte_timeout_s``): a client's deadline.
DEFAULT_DEADLINE_S = 120.0
#: The gateway's default metrics scrape interval.
DEFAULT_SCRAPE_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Realism:
    seed: int = 0
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    scrape_delay_s: tuple[float, float] = (0.05, 0.15)   # uniform range of a scrape's delivery delay
    step_sigma: float = 0.1              # log-sd of the per-step duration factor
    speed_jitter: float = 0.1            # persistent per-server speed factor in [1 - j, 1 + j]
    bytes_per_token_sigma: float = 0.25  # log-sd of a prompt's bytes per token around BYTES_PER_TOKEN
    deadline_s: float = DEFAULT_DEADLINE_S   # client deadline after arrival; 0: none (and a free drain)
    #: the per-text draws of :meth:`segment_bytes` made so far, by (what, key): each is a pure
    #: function of its seed, kept so that a text shared by many prompts seeds one generator
    _text_draws: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lo, hi = self.scrape_delay_s
        if self.scrape_interval_s <= 0 or lo < 0 or hi < lo:
            raise ValueError("realism: scrape_interval_s must be > 0 and 0 <= scrape delay low <= high")
        if self.step_sigma < 0 or not 0 <= self.speed_jitter < 1 or self.bytes_per_token_sigma < 0:
            raise ValueError("realism: step_sigma and bytes_per_token_sigma must be >= 0, speed_jitter in [0, 1)")
        if self.deadline_s < 0:
            raise ValueError(f"deadline: must be >= 0 seconds (0: none), got {self.deadline_s:g}")

    def rng(self, what: str, key: object) -> random.Random:
        """The generator of one kind of draw for one server or request (a str seed is hashed
        with SHA-512: the same in every process, whatever PYTHONHASHSEED)."""
        return random.Random(f"{what}:{self.seed}:{key}")

    # -- scrapes ------------------------------------------------------------------------------
    def scrape_phase(self, server: int) -> float:
        """When server ``server`` is first scraped, in [0, interval)."""
        return self.rng("scrape-phase", server).random() * self.scrape_interval_s

    def scrape_delays(self, server: int):
        """The delivery delays of server ``server``'s successive scrapes (an endless iterator)."""
        rng = self.rng("scrape-delay", server)
        lo, hi = self.scrape_delay_s
        while True:
            yield rng.uniform(lo, hi)

    # -- step times ---------------------------------------------------------------------------
    def step_noise(self, server: int) -> StepNoise:
        speed = self.rng("speed", server).uniform(1.0 - self.speed_jitter, 1.0 + self.speed_jitter)
        return StepNoise(speed, self.step_sigma, self.rng("step", server))

    # -- what the router is told ----------------------------------------------------------------
    def segment_bytes(self, segments: tuple) -> tuple[int, ...] | None:
        """The UTF-8 bytes of each ``(key, tokens)`` segment of a prompt (None: exact counts).

        Bytes per token is log-normal around ``BYTES_PER_TOKEN`` and belongs to the text, not to
        the request: it is drawn per segment key (the same text has the same bytes in every prompt
        that holds it, so a shared prefix hashes to the same blocks at the gateway) times a factor
        drawn per prompt family, the chain's first segment (a conversation's language or a
        document's kind holds across its turns); each with log-sd ``bytes_per_token_sigma / sqrt 2``,
        so a one-segment prompt's has ``bytes_per_token_sigma``."""
        sigma = self.bytes_per_token_sigma / math.sqrt(2.0)
        if sigma <= 0 or not segments:
            return None
        family = self._text_draw("bytes-per-token-family", segments[0][0], sigma)
        return tuple(max(1, round(n * BYTES_PER_TOKEN * math.exp(
            family + self._text_draw("bytes-per-token", key, sigma)))) for key, n in segments)

    def _text_draw(self, what: str, key: object, sigma: float) -> float:
        """The normal draw (mean 0, sd ``sigma``) of text ``key`` for ``what``: the first of its own
        generator (:meth:`rng`), made once per text."""
        draws = self._text_draws
        x = draws.get((what, key))
        if x is None:
            x = draws[(what, key)] = self.rng(what, key).gauss(0.0, sigma)
        return x

    @staticmethod
    def estimated_tokens(input_len: int, seg_bytes: tuple[int, ...] | None) -> int:
        """The gateway's token estimate of a prompt of ``input_len`` true tokens whose segments
        have ``seg_bytes`` bytes (:meth:`segment_bytes`; None: the true count)."""
        if seg_bytes is None:
            return input_len
        return -(-max(1, sum(seg_bytes)) // BYTES_PER_TOKEN)

    def describe(self) -> str:
        lo, hi = self.scrape_delay_s
        deadline = f"client deadline {self.deadline_s:g} s after arrival, no drain after the last arrival's " \
                   "deadline" if self.deadline_s > 0 else "no client deadline"
        return (f"realism on: metrics scraped every {self.scrape_interval_s * 1000:g} ms per server at its own "
                f"phase, delivered {lo * 1000:g}-{hi * 1000:g} ms late; step times x log-normal noise (sigma "
                f"{self.step_sigma:g}) x a per-server speed factor within ±{100 * self.speed_jitter:g}%; the router "
                f"sees the gateway's byte-based prompt estimate and hashes its prefix blocks over those bytes (bytes "
                f"per token log-normal, sigma {self.bytes_per_token_sigma:g}, per text: a shared prefix has the "
                f"same bytes in every prompt); {deadline}")


class StepNoise:
    """A server's step-time factor: ``1 / speed`` times a log-normal draw of mean 1 per step.
    Engine variants scale or reshape the step time before it; this multiplies the result."""

    __slots__ = ("speed", "sigma", "rng", "_mu")

    def __init__(self, speed: float, sigma: float, rng: random.Random | None) -> None:
        self.speed = speed
        self.sigma = sigma
        self.rng = rng
        self._mu = -sigma * sigma / 2.0     # mean of exp(N(mu, sigma)) is 1

    def __call__(self) -> float:
        if self.sigma <= 0 or self.rng is None:
            return 1.0 / self.speed
        return math.exp(self.rng.gauss(self._mu, self.sigma)) / self.speed

    def expected(self) -> StepNoise:
        """The mean factor with no draws (a forward probe of a cloned server: it must not
        consume, nor know, the world's future noise)."""
        return StepNoise(self.speed, 0.0, None)
