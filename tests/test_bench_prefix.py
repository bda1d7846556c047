"""``bench_epp --mode prefix``: every cell present, and the cache hit each cell asks for is
the hit the prefix index actually finds on the picked endpoint (no timing assertions)."""
from __future__ import annotations

import json

from load import bench_epp
from load.bench_prefix import HIT_RATES, PROMPT_TOKENS, run_cell


def test_cells_reach_the_requested_hit_rate():
    for hit in HIT_RATES:
        r = run_cell(1024, hit, 120, 16, bench_epp._Recorder)
        assert r["n"] == 120 and r["blocks"] == 16
        assert abs(r["mean_hit"] - hit) <= 0.07, (hit, r["mean_hit"])


def test_cli_writes_the_table_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("load.bench_prefix.PROMPT_TOKENS", (1024,))
    out = tmp_path / "p.json"
    assert bench_epp.main(["--mode", "prefix", "--requests", "100", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| 1k | 0% | 16 |" in text and "| 1k | 90% |" in text
    res = json.loads(out.read_text())
    assert res["endpoints"] == 16 and set(res["results"]) == {f"1k@{int(h * 100)}%" for h in HIT_RATES}
    assert PROMPT_TOKENS == (1024, 8192, 32768)


def test_steady_state_fill_leaves_every_lru_full_and_evicting():
    import random

    from epp_client.plugins import ApproxPrefixProducer
    from load.bench_prefix import fill_to_steady_state

    index = ApproxPrefixProducer(lru_capacity_per_endpoint=1000, max_prefix_blocks=64)
    names = ["a", "b", "c"]
    fill_to_steady_state(index, names, random.Random(0))
    assert [index.size(n) for n in names] == [1000, 1000, 1000]
    assert index.total_blocks >= 3 * 2 * 1000 - 3 * 64     # at least twice the capacity went in


def test_fresh_index_flag_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr("load.bench_prefix.PROMPT_TOKENS", (1024,))
    monkeypatch.setattr("load.bench_prefix.HIT_RATES", (0.0,))
    out = tmp_path / "p.json"
    assert bench_epp.main(["--mode", "prefix", "--requests", "100", "--fresh-index", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["steady_state"] is False and set(res["results"]) == {"1k@0%"}
