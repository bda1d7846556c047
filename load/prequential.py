"""Prequential replay through real servers (docs/evaluation.md §1, online protocol).

``python -m load.prequential TRACE.jsonl [--rate 50] [--before 60] [--after 60] [--factor 1.5]
[--out DIR]`` starts a real training server and a real prediction server (subprocesses on
127.0.0.1, fresh data directory, the prediction server polling the training server for
bundles) and replays the trace's training entries in time order at ``--rate`` entries/s.
Each entry is first predicted by the prediction server (``POST /predict/bulk/strict``),
then sent to the training server with the prediction it got (``predicted_ttft_ms``,
``predicted_tpot_ms``, ``model_version``) and scored against its actual: what routing
sees, cold start and drift included. After ``--before`` seconds the simulated servers
become ``--factor`` × slower: every later actual latency is multiplied by the factor
(the features are replayed unchanged); the run stops ``--after`` seconds later.

Reports (stdout and ``DIR/prequential.json``, plot ``DIR/prequential-coverage.png``):
time from the 100th sample to the first prediction served by a learned model; coverage of
the predictions made before that (the prior); coverage per 10 s window and target; after
the step, the traffic time until the 10 s coverage is first back within ±3 points of the
quantile and until it stays there for good, the share of later windows inside the band,
and the coverage of the last 10 s. From the first learned prediction on: the share of 10 s
windows whose coverage is within ±5 points of the quantile, and the lowest and highest.

A trace that drifts by itself (the ramp of ``load.record_traces``: load rising from 0.5 to 1.4
of capacity) is replayed without a step: ``--factor 1 --after 0 --before`` its length at the
rate (``--before 0``: the whole trace once). The plot then shows, with the coverage, the queue
of each replayed entry and the largest queue seen so far: coverage as load passes the range
every model was trained on.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from load.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = Path("/tmp/traces/sim-sessions.jsonl")
WINDOW_S = 10.0
BAND = 3.0
#: band of the learned-model windows (evaluation: every 10 s window within 90 ± 5)
LEARNED_BAND = 5.0



def _start(module: str, args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], env={**os.environ, **env}, cwd=REPO,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(client, url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered")
        try:
            client.get(url, timeout=1.0)
            return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError(url)


def load_entries(path: Path) -> list[dict]:
    """Training entries of a trace in time order (file order when there are no timestamps)."""
    from training_server.evaluate import read_trace

    read_trace(path)  # validates every line, names the bad one
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if all(e.get("timestamp") for e in entries):
        entries.sort(key=lambda e: str(e["timestamp"]))
    return entries


_ROW_KEYS = ("kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
             "num_tokens_generated", "prefix_cache_score", "pod_type", "prefill_tokens_in_flight",
             "decode_tokens_in_flight", "encoder_input_size", "encoder_matched_size")


def replay(entries: list[dict], *, rate: float, before: float, after: float, factor: float, out: Path,
           quantile: float = 0.9, sync_interval: float = 0.5, retrain_interval: float = 0.5,
           log=print) -> dict:
    """Run the replay against fresh servers; returns the records and the summary."""
    import httpx

    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="prequential-"))
    tport = free_ports(2)
    pport = tport + 1
    tenv = {"LATENCY_LOG_LEVEL": "info", "LATENCY_RETRAINING_INTERVAL_SEC": str(retrain_interval),
            "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100", "LATENCY_QUANTILE_ALPHA": str(quantile),
            "OMP_NUM_THREADS": "1"}
    penv = {"LATENCY_LOG_LEVEL": "warning", "LATENCY_QUANTILE_ALPHA": str(quantile), "OMP_NUM_THREADS": "1"}
    training = _start("training_server", ["--port", str(tport), "--data-dir", str(data_dir)], tenv,
                      out / "training-server.log")
    turl, purl = f"http://127.0.0.1:{tport}", f"http://127.0.0.1:{pport}"
    prediction = _start("prediction_server", ["--port", str(pport), "--training-server-url", turl,
                                              "--sync-interval", str(sync_interval)], penv,
                        out / "prediction-server.log")
    total = int(round(rate * (before + after)))
    step_at = int(round(rate * before))
    rec: list[tuple] = []  # (traffic s, index, target 0/1, actual, predicted, learned 0/1)
    queue: list[float] = []  # num_request_waiting of each replayed entry
    try:
        with httpx.Client(timeout=10.0, trust_env=False) as c:
            _wait(c, turl + "/healthz", training)
            _wait(c, purl + "/healthz", prediction)
            pending: list[dict] = []
            t0 = time.monotonic()
            last_flush = t0
            for i in range(total):
                due = t0 + i / rate
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                e = dict(entries[i % len(entries)])
                if i >= step_at:
                    for k in ("actual_ttft_ms", "actual_tpot_ms"):
                        e[k] = float(e.get(k) or 0.0) * factor
                e.pop("timestamp", None)  # arrival time is now
                row = {k: e[k] for k in _ROW_KEYS if k in e}
                queue.append(float(e.get("num_request_waiting") or 0.0))
                r = c.post(purl + "/predict/bulk/strict", json={"requests": [row]})
                r.raise_for_status()
                p = r.json()["predictions"][0]
                learned = 1 if p["model_source"] == "learned" else 0
                for ti, (a, pk) in enumerate((("actual_ttft_ms", "ttft_ms"), ("actual_tpot_ms", "tpot_ms"))):
                    if float(e.get(a) or 0) > 0:
                        rec.append((i / rate, i, ti, float(e[a]), float(p[pk]), learned))
                        e["predicted_" + a[len("actual_"):]] = float(p[pk])
                e["model_version"] = p["model_version"]
                pending.append(e)
                if time.monotonic() - last_flush >= 0.2 or i == total - 1:
                    c.post(turl + "/add_training_data_bulk", json={"entries": pending}).raise_for_status()
                    pending, last_flush = [], time.monotonic()
                if i and i % int(rate * 10) == 0:
                    log(f"  {i / rate:5.0f} s traffic, {i} entries, served {p['model_version']} ({p['model_source']})")
            wall = time.monotonic() - t0
    finally:
        _stop(prediction)
        _stop(training)
    a = np.array(rec, dtype=np.float64).reshape(-1, 6)
    summary = summarize(a, rate=rate, step_s=before, quantile=quantile)
    summary.update(rate=rate, before_s=before, after_s=after, factor=factor, entries=total,
                   wall_s=round(wall, 1), sync_interval_s=sync_interval, retrain_interval_s=retrain_interval)
    plot(a, summary, out / "prequential-coverage.png", quantile, queue=np.array(queue), rate=rate)
    (out / "prequential.json").write_text(json.dumps(summary, indent=2))
    return summary


def windowed_coverage(a: np.ndarray, target: int, window: float = WINDOW_S) -> tuple[np.ndarray, np.ndarray]:
    """(window end times, coverage %) over trailing windows of ``window`` s, every second."""
    m = a[:, 2] == target
    t, hit = a[m, 0], (a[m, 3] <= a[m, 4]).astype(np.float64)
    ends = np.arange(window, t.max() + 1.0, 1.0) if len(t) else np.array([])
    cov = np.array([hit[(t > e - window) & (t <= e)].mean() * 100.0 if ((t > e - window) & (t <= e)).any()
                    else np.nan for e in ends])
    return ends, cov


def summarize(a: np.ndarray, *, rate: float, step_s: float, quantile: float) -> dict:
    q = quantile * 100.0
    out: dict = {"quantile": quantile}
    learned = a[a[:, 5] == 1]
    t100 = 99 / rate
    out["first_learned_prediction_s"] = float(learned[:, 0].min()) if len(learned) else None
    out["learned_after_100th_sample_s"] = (round(float(learned[:, 0].min()) - t100, 2) if len(learned) else None)
    prior = a[a[:, 5] == 0]
    out["prior"] = {name: {"n": int((prior[:, 2] == ti).sum()),
                           "coverage": float((prior[prior[:, 2] == ti, 3] <= prior[prior[:, 2] == ti, 4]).mean()
                                             * 100.0) if (prior[:, 2] == ti).any() else None}
                    for ti, name in enumerate(("ttft", "tpot"))}
    for ti, name in enumerate(("ttft", "tpot")):
        ends, cov = windowed_coverage(a, ti)
        if not len(ends):
            continue
        fl = out["first_learned_prediction_s"]
        after = (ends - WINDOW_S >= fl) & np.isfinite(cov) if fl is not None else np.zeros(len(ends), dtype=bool)
        learned_windows = {"windows": int(after.sum()),
                           f"share_within_{LEARNED_BAND:g}_points": (
                               float(np.mean(np.abs(cov[after] - q) <= LEARNED_BAND) * 100.0) if after.any() else None),
                           "min_coverage": float(cov[after].min()) if after.any() else None,
                           "max_coverage": float(cov[after].max()) if after.any() else None}
        pre = (ends <= step_s) & (ends > step_s - 20.0)
        post = ends >= step_s + WINDOW_S  # windows wholly after the step
        inside = np.abs(cov - q) <= BAND
        back = first = None
        if post.any():
            ins = np.flatnonzero(post & inside)
            first = round(float(ends[ins[0]] - step_s), 1) if len(ins) else None
            idx = np.flatnonzero(post)
            for j in idx:  # first window after which every later window stays inside the band
                if inside[j:].all():
                    back = round(float(ends[j] - step_s), 1)
                    break
        out[name] = {"coverage_before_step_last_20s": float(np.nanmean(cov[pre])) if pre.any() else None,
                     "coverage_last_10s": float(cov[-1]),
                     "min_coverage_after_step": float(np.nanmin(cov[ends > step_s])) if (ends > step_s).any()
                     else None,
                     "first_within_3_points_after_s": first,
                     "back_within_3_points_after_s": back,
                     "share_of_windows_within_3_points_after_recovery": (
                         float(inside[np.flatnonzero(post & inside)[0]:].mean() * 100.0)
                         if first is not None else None),
                     "overall_coverage": float((a[a[:, 2] == ti, 3] <= a[a[:, 2] == ti, 4]).mean() * 100.0),
                     "after_first_learned": learned_windows}
    return out


def plot(a: np.ndarray, summary: dict, path: Path, quantile: float, queue: np.ndarray | None = None,
         rate: float = 1.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for ti, name in enumerate(("ttft", "tpot")):
        ends, cov = windowed_coverage(a, ti)
        ax.plot(ends, cov, label=f"{name} coverage ({WINDOW_S:g} s window)")
    q = quantile * 100.0
    ax.axhspan(q - BAND, q + BAND, color="green", alpha=0.15, label=f"target {q:g} ± {BAND:g}")
    if summary["factor"] != 1.0:
        ax.axvline(summary["before_s"], color="r", ls="--", label=f"step: x{summary['factor']:g} slower")
    fl = summary.get("first_learned_prediction_s")
    if fl is not None:
        ax.axvline(fl, color="k", ls=":", label="first learned prediction")
    ax.set_xlabel("traffic time (s)")
    ax.set_ylabel("live coverage (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower left", fontsize=8)
    if queue is not None and len(queue) and queue.max() > 0:
        ax2 = ax.twinx()
        t = np.arange(len(queue)) / rate
        ax2.plot(t, queue, color="grey", lw=0.5, alpha=0.5, label="queue (waiting requests)")
        ax2.plot(t, np.maximum.accumulate(queue), color="k", lw=1, label="largest queue seen so far")
        ax2.set_ylabel("waiting requests")
        ax2.legend(loc="lower right", fontsize=8)
    ax.set_title("prequential replay through real servers: live coverage over time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load.prequential", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE),
                   help="JSONL training entries (default: the sessions trace of load.record_traces)")
    p.add_argument("--rate", type=float, default=50.0, help="entries per second")
    p.add_argument("--before", type=float, default=60.0,
                   help="seconds of traffic before the step (0: the whole trace once, at --rate)")
    p.add_argument("--after", type=float, default=60.0, help="seconds of traffic after the step")
    p.add_argument("--factor", type=float, default=1.5, help="latency factor after the step")
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument("--sync-interval", type=float, default=0.5, help="prediction server bundle poll interval")
    p.add_argument("--retrain-interval", type=float, default=0.5, help="training server worker interval")
    p.add_argument("--out", default="prequential-out")
    args = p.parse_args(argv)
    if args.rate <= 0 or args.before < 0 or args.after < 0 or args.factor <= 0:
        p.error("--rate and --factor must be > 0, --before and --after >= 0")
    entries = load_entries(Path(args.trace))
    if args.before == 0:
        args.before = len(entries) / args.rate
    s = replay(entries, rate=args.rate, before=args.before, after=args.after, factor=args.factor, out=Path(args.out),
               quantile=args.quantile, sync_interval=args.sync_interval, retrain_interval=args.retrain_interval)
    print(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
