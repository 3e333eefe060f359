"""The report's HTML primitives: escaping, numbers, tables, embedded figures and the page itself. Every piece
of text that came from a file goes through :func:`esc`; figures are PNGs embedded as base64 data URIs, so a
report has no scripts, no external links and no external styles."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from smallinit.report import figures


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def num(x: Any, digits: int = 4) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        return esc(x)
    x = float(x)
    if not math.isfinite(x):
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.{digits}f}".rstrip("0").rstrip(".")


def or_dash(v: Any) -> Any:
    """A value a file may lack, as a table shows it."""
    return "–" if v is None else v


ZOOM = 1.5  # figures are drawn at this many times figures.DPI: a one-panel figure ≈ 680 px, not ≈ 450


def img(fig: Figure, alt: str) -> str:
    """A figure at a width a person reads: drawn at ZOOM × figures.DPI and shown at its own pixel size, or
    shrunk to the text column when wider."""
    data = base64.b64encode(figures.png(fig, dpi=round(figures.DPI * ZOOM))).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table of numbers and names, every row shown: no box that scrolls hides a row or a column, on screen
    or in print (a cell wraps rather than widen the table past the page; a config key in a header breaks after
    its dots and underscores, so many setting columns fit beside the run names)."""
    head = "".join(f"<th>{esc(h).replace('.', '.<wbr>').replace('_', '_<wbr>')}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{num(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def prose_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table of sentences, already marked up: its cells wrap, so a reader sees every column at any width."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


VISIBLE_SPACE = str.maketrans({"\n": "⏎", "\r": "␍", "\t": "⇥", " ": "␠"})


def token_text(text: str, spaces: bool = True) -> str:
    """Decoded corpus text with its whitespace drawn (⏎ newline, ⇥ tab, and ␠ space if ``spaces``), escaped:
    a token that is a newline or a space would otherwise show as an empty cell."""
    shown = text.translate(
        VISIBLE_SPACE if spaces else {k: v for k, v in VISIBLE_SPACE.items() if k != ord(" ")}
    )
    return esc(shown)


def verdict_badge(label: str) -> str:
    """A verdict as a coloured badge; any label string works (the class is the label, spaces as dashes)."""
    return f'<span class="v v-{esc("-".join(label.split()))}">{esc(label)}</span>'


def h2(text: str) -> str:
    return f"<h2>{esc(text)}</h2>"


def p(text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<p{c}>{esc(text)}</p>"


def note(text: str) -> str:
    return p(text, "note")


def details(summary: str, body: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<details{c}><summary>{esc(summary)}</summary>{body}</details>"


PAGE_WIDTH_PX = 1150  # the text column; a figure wider than this is shown scaled down to it (figures.SMALL)
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:PAGE_WIDTHpx;margin:24px auto;
padding:0 16px;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:2em}
table{border-collapse:collapse;margin:8px 0;font-size:.88em;max-width:100%}td,th{border:1px solid #ddd;
padding:3px 7px;text-align:left;vertical-align:top}td{overflow-wrap:anywhere}th{background:#f3f3f3}
img{max-width:100%;height:auto;display:block;margin:8px 0}
.v{padding:1px 7px;border-radius:8px;font-weight:600;white-space:nowrap;background:#eee}
.v-agree{background:#d4f4d2}.v-disagree{background:#f9d0d0}.v-not-testable-here{background:#e3e9f3}
pre{background:#f7f7f7;padding:8px;white-space:pre-wrap;font-size:.8em}details{margin:8px 0}
summary{cursor:pointer;color:#245}.note{color:#555;font-size:.9em}
.caveat{background:#fff8e1;border-left:3px solid #d9a400;padding:4px 8px;font-size:.9em}
code.tok{background:#fff3c4;padding:0 2px;white-space:pre-wrap}
@media print{body{max-width:none}h2{break-after:avoid}img,tr{break-inside:avoid}}
""".replace("PAGE_WIDTH", str(PAGE_WIDTH_PX))


def page(title: str, parts: Sequence[str]) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>" + "\n".join(parts) + "</body></html>\n"
    )
