"""``python -m load.bench_epp --mode prefix``: cost of the approximate prefix producer plus
the prefix-cache scorer per scheduling decision.

One decision = hash the prompt into chained blocks (``block_hashes``), match the blocks
against every endpoint's LRU (``ApproxPrefixProducer.produce``), score the endpoints with
``prefix-cache-scorer``, record the blocks for the picked endpoint
(``ApproxPrefixProducer.record``, the PreRequest step). Default config: the producer's defaults
(64-token blocks, at most 2048 blocks, an LRU of 31,250 blocks per endpoint) and the
scorer's defaults; 16 endpoints.

Prompts of 1k / 8k / 32k tokens (4 bytes per token, the ``estimate`` backend) at 0%, 10%,
50% and 90% cache hit: a prompt's first ``hit`` share of blocks is a prefix recorded
earlier on one endpoint (a shared document or conversation), the rest is new. The prompt
text is built outside the timed section. Before timing, every endpoint's LRU is filled
past its capacity (``fill_to_steady_state``: a gateway that has run for a while, every
insert evicting); ``--fresh-index`` times from an empty index instead, while the LRUs
still grow. The table also gives the p50 of the hashing step alone (wall clock), the part
that grows with the prompt.
"""
from __future__ import annotations

import random
import time

from epp_client import Endpoint, EndpointMetrics, InferenceRequest
from epp_client.plugins import ApproxPrefixProducer, PrefixCacheScorer
from gateway.prompt import BYTES_PER_TOKEN, block_hashes

PROMPT_TOKENS = (1024, 8192, 32768)
HIT_RATES = (0.0, 0.1, 0.5, 0.9)
N_SHARED = 32           # shared prefixes, each first recorded on one endpoint


def fill_to_steady_state(index: ApproxPrefixProducer, names: list[str], rng: random.Random) -> None:
    """Fill every endpoint's LRU past its capacity with random blocks: a random 2-4x the
    capacity each, so the endpoints sit at different points of their LRU's cycle (the
    generation being filled and the one being emptied), as in a gateway that has run for
    a while."""
    chunk = index.max_prefix_blocks
    for name in names:
        for _ in range(rng.randrange(2 * index.capacity, 4 * index.capacity) // chunk):
            index.record(name, [rng.getrandbits(63) for _ in range(chunk)])


def run_cell(tokens: int, hit: float, n: int, n_endpoints: int, rec_factory, seed: int = 1,
             steady: bool = True) -> dict:
    index = ApproxPrefixProducer()
    block, max_blocks = index.block_size_tokens, index.max_prefix_blocks
    scorer = PrefixCacheScorer()
    rng = random.Random(seed)
    size = tokens * BYTES_PER_TOKEN
    block_bytes = block * BYTES_PER_TOKEN
    shared = [(rng.randbytes(size), rng.randrange(n_endpoints)) for _ in range(N_SHARED)]
    names = [f"pod{i}" for i in range(n_endpoints)]
    endpoints = [Endpoint(name=nm, metrics=EndpointMetrics()) for nm in names]
    if steady:
        fill_to_steady_state(index, names, rng)
    for text, owner in shared:           # the shared prefixes' first visit
        index.record(names[owner], block_hashes(text, block, max_blocks))
    hit_bytes = int(round(hit * (size // block_bytes))) * block_bytes
    warm = min(n, 200)
    rec = rec_factory(warm)
    matched = 0
    hash_s: list[float] = []
    for i in range(n + warm):
        text, owner = shared[rng.randrange(N_SHARED)]
        prompt = text[:hit_bytes] + rng.randbytes(size - hit_bytes)
        req = InferenceRequest(request_id=str(i), input_tokens=tokens)
        started = rec.start()
        hashes = block_hashes(prompt, block, max_blocks)
        hashed = time.perf_counter()
        index.produce(hashes, endpoints)
        scores = scorer.score(req, endpoints)
        # max score; with nothing matched anywhere (0% hit) spread round-robin
        best = max(scores, key=scores.__getitem__) if hit > 0 else names[i % n_endpoints]
        index.record(best, hashes)
        rec.stop(i, started)          # the first ``warm`` decisions are not kept
        if i >= warm:
            hash_s.append(hashed - started[1])
            match = endpoints[names.index(best)].prefix_match
            if match is None:
                raise RuntimeError(f"{best}: no prefix match after produce()")   # produce() sets one on each
            matched += match.match_blocks
    out = rec.summary()
    hash_s.sort()
    out["hash_p50_ms"] = round(1000 * hash_s[len(hash_s) // 2], 4)
    out["blocks"] = size // block_bytes
    out["mean_hit"] = round(matched / max(1, n) / max(1, size // block_bytes), 3)
    return out


def bench_prefix(n: int, n_endpoints: int, rec_factory, steady: bool = True) -> dict:
    return {f"{t // 1024}k@{int(h * 100)}%": run_cell(t, h, n, n_endpoints, rec_factory, steady=steady)
            for t in PROMPT_TOKENS for h in HIT_RATES}


def table(results: dict) -> str:
    rows = ["| prompt | hit | blocks | wall p50 ms | wall p99 ms | CPU p50 ms | CPU p99 ms | CPU p99.9 ms "
            "| hashing p50 ms | measured hit |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        size, hit = key.split("@")
        rows.append(f"| {size} | {hit} | {r['blocks']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                    f"{r['cpu_p50_ms']:.3f} | {r['cpu_p99_ms']:.3f} | {r['cpu_p999_ms']:.3f} | "
                    f"{r['hash_p50_ms']:.3f} | "
                    f"{100 * r['mean_hit']:.0f}% |")
    return "\n".join(rows)
