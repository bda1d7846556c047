"""``latency-predictor whatif``: ask a running prediction server "what if the queue doubles?".

    latency-predictor whatif URL [--row JSON | --row FIELD=VALUE ...] --grid FIELD=v1,v2,... [--grid FIELD2=...]
                             [--plot FILE.svg]

``URL`` is a prediction server (``latency-predictor up`` starts one on http://127.0.0.1:8001).
The row fields not in a grid come from ``--row`` (a JSON object, or FIELD=VALUE items; they
merge in order); every combination of the grids is predicted by ``POST /v1/whatif`` and printed
as a table. ``--plot`` draws TTFT and TPOT against the grid, lines for one field and a heatmap
for two, with the model version in the title (SVG, no plotting library needed).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

PROG = "latency-predictor whatif"


class UsageError(Exception):
    """A bad flag value; the message names the flag."""


def parse_value(text: str) -> Any:
    """A command-line value as JSON would type it: integer, number, true/false/null, else string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_row(items: Sequence[str]) -> dict[str, Any]:
    """``--row`` items (a JSON object or FIELD=VALUE) merged in order."""
    row: dict[str, Any] = {}
    for item in items:
        if item.lstrip().startswith("{"):
            try:
                obj = json.loads(item)
            except ValueError as e:
                raise UsageError(f"--row {item!r}: not a JSON object ({e})") from None
            if not isinstance(obj, dict):
                raise UsageError(f"--row {item!r}: not a JSON object")
            row.update(obj)
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"--row {item!r}: expected FIELD=VALUE or a JSON object")
        row[name.strip()] = parse_value(value.strip())
    return row


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``--grid FIELD=v1,v2,...`` items: one or two fields, each with at least one value."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        parts = [v.strip() for v in values.split(",")]
        if not sep or not name or not all(parts):
            raise UsageError(f"--grid {item!r}: expected FIELD=v1,v2,...")
        if name in grid:
            raise UsageError(f"--grid {name}: given twice")
        grid[name] = [parse_value(v) for v in parts]
    if not 1 <= len(grid) <= 2:
        raise UsageError(f"--grid: give one or two fields, got {len(grid)}")
    return grid


def request_whatif(url: str, row: dict[str, Any], grid: dict[str, list[Any]], timeout: float) -> dict:
    """``POST URL/v1/whatif``; raises UsageError with the server's field error on a 4xx and
    ConnectionError when the server cannot be reached or fails."""
    import httpx

    try:
        r = httpx.post(url.rstrip("/") + "/v1/whatif", json={"request": row, "grid": grid}, timeout=timeout)
    except httpx.HTTPError as e:
        raise ConnectionError(f"{url}: {e or type(e).__name__}") from None
    if 400 <= r.status_code < 500:
        raise UsageError(describe_error(r))
    if r.status_code != 200:
        raise ConnectionError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()


def describe_error(r) -> str:
    """A 4xx from the server in one line: the field it names (as the flag that set it) and why."""
    try:
        detail = r.json()["detail"][0]
        loc, msg = [str(x) for x in detail["loc"]], detail["msg"]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"HTTP {r.status_code}: {r.text[:200]}"
    where = {"request": "--row", "grid": "--grid"}.get(loc[1], "") if len(loc) > 1 else ""
    field = ".".join(loc[2:])
    return f"{where} {field}: {msg}".strip() if where else f"{'.'.join(loc)}: {msg}"


def format_table(answer: dict) -> str:
    """The points as a fixed-width table, the grid fields first."""
    fields = list(answer.get("grid_fields") or [])
    head = [*fields, "ttft_ms", "tpot_ms"]
    rows = [[str(p["values"][f]) for f in fields] + [f"{p['ttft_ms']:.2f}", f"{p['tpot_ms']:.2f}"]
            for p in answer["points"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [f"model {answer['model_version']} ({answer['model_source']}, "
             f"{answer.get('objective_type', '?')} {answer.get('quantile', '')})".rstrip(),
             "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    ap.add_argument("url", metavar="URL", help="prediction server, e.g. http://127.0.0.1:8001")
    ap.add_argument("--row", action="append", default=[], metavar="JSON|FIELD=VALUE",
                    help="row fields not in the grid: a JSON object or FIELD=VALUE; repeatable")
    ap.add_argument("--grid", action="append", default=[], metavar="FIELD=v1,v2,...",
                    help="a field and its values; one or two")
    ap.add_argument("--plot", metavar="FILE.svg", help="draw TTFT/TPOT against the grid into this SVG file")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds for the request (default 30)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.plot is not None and not args.plot.lower().endswith(".svg"):
            raise UsageError(f"--plot {args.plot}: the picture is SVG; name the file *.svg")
        answer = request_whatif(args.url, parse_row(args.row), parse_grid(args.grid), args.timeout)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except ConnectionError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    print(format_table(answer))
    if args.plot:
        from .svgplot import whatif_svg

        try:
            with open(args.plot, "w", encoding="utf-8") as f:
                f.write(whatif_svg(answer))
        except OSError as e:
            print(f"{PROG}: --plot {args.plot}: {e.strerror}", file=sys.stderr)
            return 2
        print(f"[whatif] wrote {args.plot}")
    return 0
