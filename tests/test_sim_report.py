"""The simulated benchmark's report: one unit per table column, readable plots whose every
point is inside its panel and visible (no legend over the data, no overlapping tick labels)."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from load.sim.report import COLUMNS, KEYS, figures, table, write_plots, write_report

LOADS = ("0.5", "1.0", "1.2")
POLICIES = ("random", "least-queue", "predicted")


def _metrics(rng: np.random.Generator, ttft_p90: float) -> dict:
    m = {k: float(rng.uniform(0.2, 0.9)) for k in KEYS}
    m.update(ttft_p50_ms=ttft_p90 / 6, ttft_p90_ms=ttft_p90, ttft_p99_ms=ttft_p90 * 1.4,
             tpot_p50_ms=21.4, tpot_p90_ms=38.25, tpot_p99_ms=151.0,
             e2e_p50_ms=ttft_p90 * 2, e2e_p90_ms=ttft_p90 * 3, shed=0)
    return m


@pytest.fixture(scope="module")
def run():
    """Results like a real run's: TTFT p90 from 1.6 s to minutes (one policy far above the
    others at the lowest load, where a legend used to sit), TPOT within one decade."""
    rng = np.random.default_rng(0)
    results, raw = {}, {}
    for i, load in enumerate(LOADS):
        results[load] = {}
        for j, pol in enumerate(POLICIES):
            p90 = 1654.0 * (3 ** i) * (1 + j) if not (pol == "predicted" and i == 0) else 380_000.0
            results[load][pol] = _metrics(rng, p90)
            raw[(load, pol)] = {"ttft": rng.lognormal(np.log(p90 / 4), 1.2, 400),
                                "tpot": rng.lognormal(np.log(40), 0.45, 400).clip(15, 160),
                                "e2e": rng.lognormal(np.log(p90), 0.8, 400)}
    return results, raw


def _cells(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of every policy table in a report (one table per load)."""
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines() if ln.startswith("| ")]
    head = next(r for r in split if r[0] == "policy")
    return head, [r for r in split if r[0] in POLICIES]


def test_every_latency_column_has_one_unit_named_in_its_header(run, tmp_path):
    results, _ = run
    sc = SimpleNamespace(name="synthetic", description="test", scrape_interval_s=0.05, scrape_delay_s=0.0,
                         cluster_desc=lambda: "2 x test")
    report = write_report(tmp_path, sc, 1, results, {"requests": 400, "capacity_rps": 1.0, "slo": []}, []).read_text()
    head, rows = _cells(report)
    assert len(rows) == len(LOADS) * len(POLICIES)
    for col, name in enumerate(head[1:], start=1):
        if not name.startswith(("TTFT", "TPOT", "E2E")):
            continue
        unit = re.search(r"\((s|ms)\)$", name)
        assert unit, f"column {name!r} does not state its unit"
        values = [r[col] for r in rows]
        # plain numbers only: no cell carries its own unit, so all share the header's
        assert all(re.fullmatch(r"\d+(\.\d+)?", v) for v in values), (name, values)
        decimals = {len(v.partition(".")[2]) for v in values}
        assert len(decimals) == 1, (name, values)  # one format per column
    # the values are the metrics in the stated unit: TTFT 1654 ms is 1.654 s
    ttft90 = head.index("TTFT p90 (s)")
    assert rows[0][ttft90] == "1.654"
    assert float(rows[1][ttft90]) == pytest.approx(2 * 1654 / 1000, abs=1e-3)
    assert float(rows[0][head.index("TPOT p90 (ms)")]) == pytest.approx(38.25, abs=0.05)


def test_table_header_and_columns_agree():
    head = table({"p": {k: 1.0 for k in KEYS}}).splitlines()[0]
    assert all(label in head for label, _, _ in COLUMNS)


def _display_boxes(fig):
    """Lay the figure out as when it is saved; the renderer to measure its parts with."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_every_plotted_point_is_inside_its_axes(run):
    results, raw = run
    for name, fig in figures(results, raw):
        for ax in fig.axes:
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            pts = [ln.get_xydata() for ln in ax.get_lines()] + [c.get_offsets() for c in ax.collections]
            for p in pts:
                p = np.asarray(p, dtype=float).reshape(-1, 2)
                p = p[np.isfinite(p).all(axis=1)]
                assert len(p)
                inside = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)
                assert inside.all(), (name, ax.get_title(), p[~inside][:3], (x0, x1, y0, y1))


def test_no_legend_covers_a_panel(run):
    results, raw = run
    for name, fig in figures(results, raw):
        r = _display_boxes(fig)
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        assert legends, name
        for leg in legends:
            lb = leg.get_window_extent(r)
            for ax in fig.axes:
                assert not lb.overlaps(ax.get_window_extent(r)), (name, ax.get_title())


def test_tick_labels_do_not_overlap(run):
    results, raw = run
    for name, fig in figures(results, raw):
        r = _display_boxes(fig)
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                labels = [t for t in axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True)
                          if t.get_visible() and t.get_text()]
                boxes = [t.get_window_extent(r) for t in labels]
                for i in range(len(boxes)):
                    for j in range(i + 1, len(boxes)):
                        assert not boxes[i].overlaps(boxes[j]), (name, ax.get_title(), labels[i].get_text(),
                                                                 labels[j].get_text())
                assert len(labels) >= 2, (name, ax.get_title(), axis.axis_name)


def test_plots_are_written(run, tmp_path):
    results, raw = run
    files = write_plots(tmp_path, results, raw)
    assert files == ["latency_vs_load.png", "slo_vs_load.png", "ttft_cdf.png", "tpot_cdf.png"]
    assert all((tmp_path / f).stat().st_size > 1000 for f in files)
