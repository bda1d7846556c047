"""A short multi-turn chat workload with shared prefixes, the same for every policy.

Conversations start from one of a few long shared system prompts; each turn appends the
user's question and the model's actual answer, so turn k+1's prompt extends turn k's
(prefix reuse within a conversation) and conversations with the same system prompt share
their first blocks (reuse across conversations). A closed loop of ``concurrency``
conversations with think times between turns; all randomness from one seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

_WORDS = ("routing latency cache prefix token model server request queue batch decode prefill "
          "gateway endpoint predict quantile sample train stream budget memory kernel thread slot "
          "context window policy score filter admit picker metric scrape histogram percentile "
          "throughput capacity cluster replica shard session turn answer question summary detail "
          "river mountain forest garden harbor library market village winter summer bridge castle "
          "engine signal planet orbit crystal lantern compass journey harvest festival").split()


def _text(rng: random.Random, n_words: int) -> str:
    out, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(_WORDS))
        if len(line) >= rng.randint(8, 16):
            out.append(" ".join(line).capitalize() + ".")
            line = []
    if line:
        out.append(" ".join(line).capitalize() + ".")
    return " ".join(out)


@dataclass
class Turn:
    question: str
    max_tokens: int
    think_s: float


@dataclass
class Conversation:
    cid: int
    system_id: int
    system: str
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Workload:
    conversations: list[Conversation]
    concurrency: int
    ttft_slo_ms: float
    tpot_slo_ms: float

    @property
    def requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def make_workload(seed: int = 7, n_conversations: int = 16, turns: int = 4, n_systems: int = 3,
                  system_words: int = 160, concurrency: int = 4, ttft_slo_ms: float = 2000.0,
                  tpot_slo_ms: float = 120.0) -> Workload:
    rng = random.Random(seed)
    systems = [f"System {i}: you are a helpful assistant for team {i}. " + _text(rng, system_words)
               for i in range(n_systems)]
    convs = []
    for c in range(n_conversations):
        sid = rng.randrange(n_systems)
        conv = Conversation(c, sid, systems[sid])
        for _ in range(turns):
            conv.turns.append(Turn(_text(rng, rng.randint(12, 30)), rng.randint(16, 40), rng.uniform(0.2, 1.2)))
        convs.append(conv)
    return Workload(convs, concurrency, ttft_slo_ms, tpot_slo_ms)


def prompt_for(conv: Conversation, history: list[tuple[str, str]], question: str) -> str:
    parts = [conv.system, "\n"]
    for q, a in history:
        parts.append(f"\nUser: {q}\nAssistant:{a}\n")
    parts.append(f"\nUser: {question}\nAssistant:")
    return "".join(parts)
