"""The soak (``python -m load.gateway_soak``) in a few seconds: stub engine processes with
injected failures and a kill, the gateway as a process; it must find no violation."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_a_short_soak_finds_the_gateway_healed(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "load.gateway_soak", "--minutes", "0.05", "--requests", "300",
                           "--concurrency", "8", "--engines", "2", "--restart-every", "2", "--error-rate", "0.05",
                           "--die-rate", "0.05", "--hang-rate", "0.01", "--ejection-max-s", "2",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    summary = json.loads(out[: out.rindex("}") + 1])
    assert proc.returncode == 0, (summary["violations"], proc.stderr[-2000:])
    assert summary["violation_count"] == 0 and summary["requests"] > 20
    kinds = summary["by_kind_status"]
    assert kinds.get("oversized-header 431", 0) + kinds.get("bad-body 400", 0) > 0   # hostile requests were sent
    assert all(e["healthy"] and e["inflight_requests"] == 0 for e in summary["endpoints"])


def test_the_soak_refuses_bad_bounds():
    proc = subprocess.run([sys.executable, "-m", "load.gateway_soak", "--minutes", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--minutes" in proc.stderr
