"""Inline SVG charts for the campaign report: line charts over time and horizontal bars.

Self-contained markup (no script, no external resource), so the report opens offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

#: Background of a highlighted bar row (a checklist item never exercised).
NEVER_COLOUR = "#fbe3e6"


def nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def ticks(hi: float, ticks: int = 5) -> tuple[list[float], float]:
    """Tick values from 0 to a rounded-up ``hi``, and that upper bound."""
    if hi <= 0:
        hi = 1.0
    step = nice_step(hi, ticks)
    top = step * math.ceil(hi / step - 1e-9)
    return [i * step for i in range(round(top / step) + 1)], top


def tick_text(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.3g}"


def svg_open(width: float, height: float) -> str:
    # Scales to the width of its box, keeping its proportions.
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'style="width:100%;max-width:{width}px;height:auto;display:block">'
    )


def empty_chart(width: int, height: int, text: str) -> str:
    return (
        svg_open(width, height)
        + f'<rect x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" fill="#fafbfc" stroke="#d8dce3"/>'
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#5a6375" font-size="13">'
        f"{html.escape(str(text), quote=True)}</text>"
        "</svg>"
    )


def line_chart(
    series: Sequence[tuple[str, str, Sequence[tuple[float, float]], float]],
    *,
    width: int,
    height: int,
    y_label: str,
    step: bool = False,
) -> str:
    """Lines (``step``: a staircase) over campaign time, x from 0 to the last point."""
    points = [p for _, _, pts, _ in series for p in pts]
    if not points:
        return empty_chart(width, height, "no timeline was recorded")
    left, right, top, bottom = 56, 28, 10, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    div, unit = (1, "s") if max(x for x, _ in points) < 120 else (60, "min")
    if max(x for x, _ in points) >= 7200:
        div, unit = 3600, "h"
    # The x axis ends at the last point (the end of the campaign), not at a rounded value.
    x_hi = max(x for x, _ in points) or 1.0
    x_ticks = [t * div for t in ticks(x_hi / div)[0] if t * div <= x_hi * (1 + 1e-9)]
    y_ticks, y_hi = ticks(max(y for _, y in points), 4)

    def px(x: float) -> float:
        return left + plot_w * x / x_hi

    def py(y: float) -> float:
        return top + plot_h * (1 - y / y_hi)

    out = [svg_open(width, height)]
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#d8dce3"/>')
    for y in y_ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eceff3"/>')
        out.append(
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="11" fill="#5a6375">'
            f"{tick_text(y)}</text>"
        )
    for x in x_ticks:
        out.append(
            f'<text x="{px(x):.1f}" y="{top + plot_h + 15}" text-anchor="middle" font-size="11" fill="#5a6375">'
            f"{tick_text(x / div) + ' ' + unit if x else '0'}</text>"
        )
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle" font-size="11" fill="#5a6375">'
        "time since the campaign started</text>"
    )
    out.append(
        f'<text x="12" y="{top + plot_h / 2}" font-size="11" fill="#5a6375" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + plot_h / 2})">{html.escape(str(y_label), quote=True)}</text>'
    )
    for name, colour, pts, stroke in series:
        if not pts:
            continue
        coords = []
        for i, (x, y) in enumerate(pts):
            if step and i:
                coords.append(f"{px(x):.1f},{py(pts[i - 1][1]):.1f}")
            coords.append(f"{px(x):.1f},{py(y):.1f}")
        out.append(f"<g><title>{html.escape(str(name), quote=True)}</title>")
        if len(pts) == 1:
            out.append(f'<circle cx="{coords[0].split(",")[0]}" cy="{coords[0].split(",")[1]}" r="4" fill="{colour}"/>')
        else:
            out.append(
                f'<polyline points="{" ".join(coords)}" fill="none" stroke="{colour}" stroke-width="{stroke}" '
                'stroke-linejoin="round"/>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


#: The widest a character of the charts' 12 px sans-serif labels gets, in pixels (upper bound
#: for lower-case and digits; a label cut by it fits its column in any browser).
_CHAR_PX = 7.0


def bar_chart(
    bars: Sequence[tuple[str, float, str, str, bool]],
    *,
    width: int,
    label_width: int,
    log: bool = False,
    empty: str,
) -> str:
    """Horizontal bars: (label, value, colour, text after the bar, highlighted row)."""
    if not bars:
        return empty_chart(width, 60, empty)
    row, gap = 22, 4
    text_w = 150
    bar_w = width - label_width - text_w - 8
    height = len(bars) * (row + gap) + gap

    def scale(v: float) -> float:
        return math.log10(1 + v) if log else v

    hi = max((scale(max(v, 0.0)) for _, v, _, _, _ in bars), default=0.0) or 1.0
    out = [svg_open(width, height)]
    for i, (label, value, colour, text, highlight) in enumerate(bars):
        y = gap + i * (row + gap)
        if highlight:
            out.append(f'<rect x="0" y="{y - 2}" width="{width}" height="{row + 4}" fill="{NEVER_COLOUR}"/>')
        label_colour = "#b3261e" if highlight else "#1d2330"
        # A label longer than its column is cut at its end (the whole label in its tooltip),
        # never at its start, which the SVG's left edge would clip.
        shown = label if len(label) <= (room := int((label_width - 12) / _CHAR_PX)) else label[: room - 1] + "…"
        out.append(
            f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end" font-size="12" fill="{label_colour}">'
            f"<title>{html.escape(str(label), quote=True)}</title>{html.escape(str(shown), quote=True)}</text>"
        )
        length = bar_w * scale(max(value, 0.0)) / hi
        if length > 0:
            out.append(f'<rect x="{label_width}" y="{y + 2}" width="{length:.1f}" height="{row - 4}" fill="{colour}"/>')
        out.append(
            f'<text x="{label_width + length + 6:.1f}" y="{y + 15}" font-size="12" fill="{label_colour}">'
            f"{html.escape(str(text), quote=True)}</text>"
        )
    out.append("</svg>")
    return "".join(out)
