"""The what-if picture as a self-contained SVG: TTFT and TPOT side by side, lines against one
grid field, or heatmaps over two, the model version in the title. No plotting library: the
picture is a few dozen shapes."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 960, 460
PANEL_W, PANEL_H = 380, 300          # plotting area of one panel
LEFT, TOP, GAP = 80, 92, 100         # first panel's corner, space between the panels
TARGETS = (("ttft_ms", "TTFT (ms)", "#1f77b4"), ("tpot_ms", "TPOT (ms)", "#d62728"))
#: a perceptually ordered scale (dark blue -> teal -> yellow), interpolated linearly
SCALE = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
         (1.0, (253, 231, 37)))


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    count = math.ceil((hi - first) / step - 1e-9)
    return [round(first + i * step, 10) for i in range(count + 1)]


def fmt(v: float) -> str:
    """A tick or cell value: few digits, no trailing zeros."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}".rstrip("0").rstrip(".")


def colour(t: float) -> str:
    t = min(1.0, max(0.0, t))
    for (a, ca), (b, cb) in zip(SCALE, SCALE[1:]):
        if t <= b:
            u = (t - a) / (b - a)
            r, g, bl = (round(x + (y - x) * u) for x, y in zip(ca, cb))
            return f"rgb({r},{g},{bl})"
    return "rgb(253,231,37)"


def _text(x: float, y: float, s: str, size: int = 12, anchor: str = "middle", **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(s)}</text>")


def _positions(values: Sequence[Any], x0: float, width: float) -> list[float]:
    """x of each grid value: to scale when all are numbers, else evenly spaced."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and len(set(values)) > 1:
        lo, hi = min(values), max(values)
        return [x0 + (v - lo) / (hi - lo) * width for v in values]
    if len(values) == 1:
        return [x0 + width / 2]
    return [x0 + i / (len(values) - 1) * width for i in range(len(values))]


def _line_panel(x0: float, field: str, values: list[Any], ys: list[float], label: str, stroke: str) -> list[str]:
    ticks = nice_ticks(0.0, max(ys) * 1.05 if ys and max(ys) > 0 else 1.0)
    top = ticks[-1] or 1.0
    ypix = [TOP + PANEL_H - y / top * PANEL_H for y in ys]
    xpix = _positions(values, x0 + 20, PANEL_W - 40)
    out = [f'<rect x="{x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="white" stroke="#888"/>']
    for t in ticks:
        y = TOP + PANEL_H - t / top * PANEL_H
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(_text(x0 - 6, y + 4, fmt(t), 11, "end"))
    for v, x in zip(values, xpix):
        out.append(f'<line x1="{x:.1f}" y1="{TOP + PANEL_H}" x2="{x:.1f}" y2="{TOP + PANEL_H + 5}" stroke="#444"/>')
        out.append(_text(x, TOP + PANEL_H + 18, str(v), 11))
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xpix, ypix))
    out.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="2.5"/>')
    for x, y, v in zip(xpix, ypix, ys):
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{stroke}"/>')
        out.append(_text(x, y - 9, fmt(v), 10, fill="#333"))
    out.append(_text(x0 + PANEL_W / 2, TOP - 10, label, 14, font_weight="bold"))
    out.append(_text(x0 + PANEL_W / 2, TOP + PANEL_H + 40, field, 12))
    out.append(_text(x0 - 50, TOP + PANEL_H / 2, label, 12,
                     transform=f"rotate(-90 {x0 - 50} {TOP + PANEL_H / 2:.1f})"))
    return out


def _heat_panel(x0: float, fields: list[str], xs: list[Any], ys: list[Any], z: dict[tuple[Any, Any], float],
                label: str) -> list[str]:
    lo, hi = min(z.values()), max(z.values())
    cw, ch = PANEL_W / len(xs), PANEL_H / len(ys)
    out = []
    for i, xv in enumerate(xs):
        for j, yv in enumerate(ys):
            v = z[(xv, yv)]
            t = (v - lo) / (hi - lo) if hi > lo else 0.5
            x, y = x0 + i * cw, TOP + PANEL_H - (j + 1) * ch   # the first y value at the bottom
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{ch:.1f}" fill="{colour(t)}" '
                       f'stroke="white"><title>{escape(f"{fields[0]}={xv}, {fields[1]}={yv}: {v:.2f}")}</title></rect>')
            if cw >= 28 and ch >= 14:
                out.append(_text(x + cw / 2, y + ch / 2 + 4, fmt(v), 11 if cw >= 40 else 9,
                                 fill="black" if t > 0.55 else "white"))
    for i, xv in enumerate(xs):
        out.append(_text(x0 + (i + 0.5) * cw, TOP + PANEL_H + 16, str(xv), 11))
    for j, yv in enumerate(ys):
        out.append(_text(x0 - 6, TOP + PANEL_H - (j + 0.5) * ch + 4, str(yv), 11, "end"))
    out.append(_text(x0 + PANEL_W / 2, TOP - 10, f"{label}: {fmt(lo)} (dark) to {fmt(hi)} (light)", 14,
                     font_weight="bold"))
    out.append(_text(x0 + PANEL_W / 2, TOP + PANEL_H + 40, fields[0], 12))
    out.append(_text(x0 - 56, TOP + PANEL_H / 2, fields[1], 12,
                     transform=f"rotate(-90 {x0 - 56} {TOP + PANEL_H / 2:.1f})"))
    return out


def _unique(values: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def whatif_svg(answer: dict) -> str:
    """An answer of ``POST /v1/whatif`` with one or two grid fields, as an SVG document."""
    fields = list(answer.get("grid_fields") or [])
    points = answer["points"]
    if not 1 <= len(fields) <= 2:
        raise ValueError(f"a picture needs one or two grid fields, got {len(fields)}")
    title = f"What-if: TTFT and TPOT against {' and '.join(fields)}"
    model = (f"model {answer['model_version']} ({answer['model_source']}, "
             f"{answer.get('objective_type', '')} {answer.get('quantile', '')})")
    body: list[str] = []
    for k, (key, label, stroke) in enumerate(TARGETS):
        x0 = LEFT + k * (PANEL_W + GAP)
        if len(fields) == 1:
            body += _line_panel(x0, fields[0], [p["values"][fields[0]] for p in points],
                                [float(p[key]) for p in points], label, stroke)
        else:
            xs = _unique([p["values"][fields[0]] for p in points])
            ys = _unique([p["values"][fields[1]] for p in points])
            z = {(p["values"][fields[0]], p["values"][fields[1]]): float(p[key]) for p in points}
            body += _heat_panel(x0, fields, xs, ys, z, label)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">')
    return "\n".join([head, f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
                      _text(WIDTH / 2, 26, title, 16, font_weight="bold"), _text(WIDTH / 2, 46, model, 13),
                      *body, "</svg>", ""])
