"""The real-engine run's statistics: latency percentiles, SLO attainment, prefix reuse, the
accuracy of the gateway's predictions and the engines' speed, per phase and pooled over rounds."""
from __future__ import annotations

import math
from collections.abc import Iterable

from features.scoring import pinball_loss

from .driver import Result
from .workload import Workload

QUANTILE = 0.9


def pct(xs: Iterable[float | None], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation) of the values that are not None."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def pinball(actual: list[float], pred: list[float], q: float = QUANTILE) -> float | None:
    return pinball_loss(actual, pred, q) if actual else None


def accuracy(records: list[dict]) -> dict:
    """Coverage (share of actuals <= prediction) and pinball loss of the predictions the
    gateway made for the endpoint that served each request, against the measured outcome,
    overall and split by the model that predicted (the built-in prior or a learned bundle)."""
    out: dict = {}
    for tgt in ("ttft", "tpot"):
        groups: dict[str, list[tuple[float, float]]] = {"all": [], "learned": [], "prior": []}
        for r in records:
            a, p = r.get(f"{tgt}_ms"), r.get(f"predicted_{tgt}_ms")
            if not r["ok"] or a is None or p is None:
                continue
            groups["all"].append((a, p))
            groups["prior" if r["model_version"].startswith("prior") else "learned"].append((a, p))
        for source, sel in groups.items():
            out[f"{tgt}_{source}_n"] = len(sel)
            out[f"{tgt}_{source}_coverage"] = (sum(a <= p for a, p in sel) / len(sel)) if sel else None
            out[f"{tgt}_{source}_pinball_ms"] = pinball([a for a, _ in sel], [p for _, p in sel])
    return out


def summarize(policy: str, results: list[Result], records: list[dict], wl: Workload, wall_s: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_ms for r in ok]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    met = [r for r in ok if r.ttft_ms is not None and r.ttft_ms <= wl.ttft_slo_ms
           and (r.tpot_ms is None or r.tpot_ms <= wl.tpot_slo_ms)]
    cache = [(r.cache_n, r.prompt_n) for r in ok if r.cache_n is not None and r.prompt_n is not None]
    reused = sum(c for c, _ in cache)
    total = sum(c + p for c, p in cache)
    gw_hit = sum(r["prefix_match_blocks"] for r in records)
    gw_tot = sum(r["prefix_total_blocks"] for r in records)
    per_ep: dict[str, int] = {}
    for r in ok:
        per_ep[r.endpoint] = per_ep.get(r.endpoint, 0) + 1
    s = {"policy": policy, "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok),
         "wall_s": wall_s, "ttft_p50_ms": pct(ttft, .5), "ttft_p90_ms": pct(ttft, .9),
         "tpot_p50_ms": pct(tpot, .5), "tpot_p90_ms": pct(tpot, .9),
         "e2e_p50_ms": pct([r.e2e_ms for r in ok], .5),
         "slo_attainment": len(met) / len(results) if results else None,
         "engine_prefix_hit_rate": reused / total if total else None,
         "gateway_prefix_hit_rate": gw_hit / gw_tot if gw_tot else None,
         "per_endpoint": per_ep,
         "model_versions": sorted({r["model_version"] for r in records if r["model_version"]}),
         "fallbacks": sum(1 for r in records if r["fallback"])}
    s.update(accuracy(records))
    return s


def engine_speed(metrics_text: str) -> dict:
    """Prefill tokens/s and decode ms/token over the phase, from llama-server's counters."""
    v: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("llamacpp:") and " " in line:
            k, _, x = line.partition(" ")
            try:
                v[k] = float(x)
            except ValueError:
                pass
    pt, ps = v.get("llamacpp:prompt_tokens_total", 0), v.get("llamacpp:prompt_seconds_total", 0)
    dt, ds = v.get("llamacpp:tokens_predicted_total", 0), v.get("llamacpp:tokens_predicted_seconds_total", 0)
    return {"prompt_tokens": pt, "prefill_tok_per_s": pt / ps if ps else None,
            "decode_ms_per_token": 1000 * ds / dt if dt else None,
            "prompt_tokens_cached": v.get("llamacpp:prompt_tokens_cached_total")}



def pool_rounds(policies, summaries, records, results, wl) -> tuple[dict, dict]:
    """Per policy, one summary over all its rounds (phase keys ``"<policy> #<round>"``);
    alternating the order of the rounds evens out drift in the machine's load."""
    pooled, pooled_records = {}, {}
    for policy in policies:
        keys = [k for k in summaries if k.startswith(policy + " #")]
        recs = [r for k in keys for r in records[k]]
        agg = summarize(policy, [r for k in keys for r in results[k]], recs, wl,
                        sum(summaries[k]["wall_s"] for k in keys))
        agg["engine_speed"] = [e for k in keys for e in summaries[k].get("engine_speed", [])]
        agg["loadavg_1m"] = [x for k in keys for x in summaries[k].get("loadavg_1m", [])]
        agg["data_status"] = summaries[keys[-1]].get("data_status")
        pooled[policy], pooled_records[policy] = agg, recs
    return pooled, pooled_records
