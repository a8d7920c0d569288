"""The report of an exploration campaign: ``summary.json`` and one self-contained ``report.html``.

:func:`write_report` takes the campaign's summary (schema 1, built by the campaign code) and
writes both files atomically (temporary file, fsync, rename) into a directory it creates. The
JSON is the summary plus ``coverage``, the feature checklist of :mod:`fuzz.coverage`. The HTML
needs nothing but itself: no scripts, no fonts, no stylesheets from elsewhere; the plots are
inline SVG drawn here. Every text that comes from the summary is escaped, since signatures and
summaries quote exception messages, which may hold anything.

Failures that are likely one cause are grouped (:func:`causes`, ``causes`` in the JSON, the
"Likely causes" section of the page): the same known bug met through several properties or
signatures, and new failures with the same first failing check and the same shrunk features.

The renderer is tolerant: optional keys may be missing, a campaign may have run no case, the
timeline may hold one point or none. A summary that cannot be read at all (not a mapping) is a
caller's bug and raises TypeError. docs/report.md says how to read the page.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import secrets
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fuzz import known
from fuzz.coverage import AREAS, CHECKLIST, coverage
from fuzz.errors import ShardfuzzError
from fuzz.signature import Signature
from fuzz.svg import NEVER_COLOUR, bar_chart, line_chart

#: Colours of the plots (tests/test_report.py looks for them in a screenshot).
TOTAL_COLOUR = "#202a44"
FAILURE_COLOUR = "#d1495b"
COVERAGE_COLOUR = "#2a9d8f"
PROPERTY_COLOURS = ("#3a86ff", "#fb8500", "#8338ec", "#55a630", "#ff006e", "#8d6e63", "#00b4d8", "#6c757d")

_TOP_FEATURES = 40

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:1140px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}
h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 4px}
.card{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:10px 14px;margin:8px 0}
.facts{display:grid;grid-template-columns:repeat(6,1fr);gap:6px 16px}
.facts div{font-size:12px;color:#5a6375}.facts b{display:block;font-size:16px;color:#1d2330}
.verdict{font-size:15px;font-weight:600;margin:6px 0}.bad{color:#b3261e}.good{color:#1e7b34}.warn{color:#8a5a00}
table{border-collapse:collapse;width:100%;font-size:12.5px;background:#fff}
th,td{border-bottom:1px solid #e4e7ec;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#eef0f4}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.small{font-size:11.5px;color:#5a6375}.tag{padding:1px 6px;border-radius:8px;font-size:11px;font-weight:600}
.tag.new{background:#fde2e1;color:#b3261e}.tag.known{background:#e6eefc;color:#1d4fa0}
.next{font-size:11.5px;color:#5a6375;margin-top:3px}.next code{color:#1d2330}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.legend{font-size:12px;margin:2px 0 0}.legend span.sw{display:inline-block;width:12px;height:12px;
border-radius:2px;margin:0 4px 0 10px;vertical-align:-2px}
.never{background:__NEVER__;border:1px solid #e9a3ad;font-size:12.5px}
.never ul{columns:3;column-gap:36px;margin:4px 0 8px;padding-left:18px}svg text{font-family:inherit}
"""


def write_report(directory: Path, summary: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``summary.json`` (sorted keys, indent 1, with ``coverage`` added) and
    ``report.html`` into ``directory`` (created if needed); return their paths."""
    if not isinstance(summary, Mapping):
        raise TypeError(f"summary must be a mapping, got {type(summary).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = dict(summary)
    data["coverage"] = coverage(_mapping(summary.get("features")))
    data["causes"] = causes(_seq(summary.get("failures")))
    json_path, html_path = directory / "summary.json", directory / "report.html"
    _write_atomic(json_path, json.dumps(data, sort_keys=True, indent=1, default=str) + "\n")
    _write_atomic(html_path, render_html(data, base=directory))
    return json_path, html_path


def save_report(directory: Path, summary: Mapping[str, Any]) -> Path:
    """:func:`write_report` for the command line: returns the page's path; a directory that
    cannot be written raises :class:`ShardfuzzError` naming ``--report`` (exit 2)."""
    try:
        _, html_path = write_report(directory, summary)
    except OSError as e:
        raise ShardfuzzError(f"--report {directory}: cannot write the report: {e.strerror or e}") from None
    return html_path


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, ending in "..." if cut."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 0)]
    space = cut.rfind(" ")
    if space > limit // 2:  # a word boundary not too far back; else cut inside the (long) word
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "..."


_UPSTREAM = re.compile(r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#([0-9]+)")


def upstream_url(upstream: str | None) -> str | None:
    """The GitHub issue that an entry's ``upstream`` names (``pytorch/pytorch#154888`` ->
    ``https://github.com/pytorch/pytorch/issues/154888``), a URL as given, else None."""
    if not upstream:
        return None
    if upstream.startswith(("https://", "http://")):
        return upstream.split()[0]
    m = _UPSTREAM.search(upstream)
    return f"https://github.com/{m.group(1)}/issues/{m.group(2)}" if m else None


def next_commands(entry: str | os.PathLike[str]) -> list[str]:
    """What to run on a corpus entry next: replay it on a pool, write a standalone script."""
    quoted = shlex.quote(str(entry))
    return [f"python -m fuzz replay {quoted}", f"python -m fuzz repro {quoted} -o repro.py"]


def first_check(signature: str, details: Mapping[str, Any] | None = None) -> str:
    """The check a failure failed first, without the property it was met through: for a
    mismatch, ``mismatch:`` and the check that disagreed (``details["check"]``: ``loss``,
    ``param``, ``optimizer``, ...); for an exception or a crash, the exception type or signal
    and the frame; for a hang, the frame it waits in. A signature this module cannot read is
    its own check."""
    parsed = Signature.parse(signature)
    if parsed is None:
        return signature
    check = (details or {}).get("check")
    if parsed.kind == "mismatch":
        return f"mismatch:{check if isinstance(check, str) and check else parsed.check or parsed.where}"
    return f"{parsed.kind}:{parsed.check}@{parsed.where}" if parsed.check else f"{parsed.kind}@{parsed.where}"


def causes(failures: Sequence[Any]) -> list[dict[str, Any]]:
    """The summary's failures grouped by their likely cause, new causes first, then by hits.

    - A known failure belongs to its bug: the corpus entry's ``bug`` (a record of
      :mod:`fuzz.known`), else the known entry's own signature (``known_as``, else its
      signature). One torch bug met through several properties, variants or symptoms is one
      cause.
    - A new failure belongs with the new failures of the same first failing check
      (:func:`first_check`, the ``check`` key) and the same shrunk features (``features``): one
      fault seen through several signatures. Without those keys (an older summary), its
      signature is its cause.

    Each cause: ``id`` (1, 2, ... in this order), ``known``, ``bug``, ``title`` (the known bug's
    title, or the first failing check), ``upstream``, ``upstream_url``, ``check``, ``features``,
    ``signatures``, ``properties``, ``kinds``, ``hits``, ``first_seen``."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in failures:
        if not isinstance(f, Mapping) or not isinstance(f.get("signature"), str):
            continue
        sig = str(f["signature"])
        bug = f.get("bug") if isinstance(f.get("bug"), str) else None
        features = tuple(str(x) for x in _seq(f.get("features")))
        check = f.get("check") if isinstance(f.get("check"), str) else None
        if f.get("known"):
            key: tuple[Any, ...] = ("bug", bug) if bug else ("known", str(f.get("known_as") or sig))
        elif check and features:
            key = ("new", check, features)
        else:
            key = ("new", sig)
        g = groups.get(key)
        if g is None:
            record = known.BUGS.get(bug) if bug else None
            if record is not None:
                title = record.title
            elif f.get("known"):
                title = str(f.get("entry_summary") or f.get("known_as") or sig)
            else:
                title = check or sig
            g = groups[key] = {
                "known": bool(f.get("known")),
                "bug": bug,
                "title": title,
                "upstream": f.get("upstream"),
                "upstream_url": f.get("upstream_url"),
                "check": check,
                "features": list(features),
                "signatures": [],
                "properties": [],
                "kinds": [],
                "hits": 0,
                "first_seen": None,
            }
        g["signatures"].append(sig)
        for name, value in (("properties", f.get("property")), ("kinds", f.get("kind"))):
            if isinstance(value, str) and value not in g[name]:
                g[name].append(value)
        g["hits"] += int(_num(f.get("hits")))
        seen = f.get("first_seen")
        if isinstance(seen, (int, float)) and (g["first_seen"] is None or seen < g["first_seen"]):
            g["first_seen"] = seen
        if not g["upstream"] and f.get("upstream"):
            g["upstream"], g["upstream_url"] = f.get("upstream"), f.get("upstream_url")
    ordered = sorted(groups.values(), key=lambda g: (g["known"], -g["hits"], _num(g["first_seen"], math.inf)))
    return [{"id": i, **g} for i, g in enumerate(ordered, 1)]


def _write_atomic(path: Path, text: str) -> None:
    # os.open with mode 0o666 (not mkstemp's 0o600): a report is for reading, under the umask.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# Reading the summary defensively


def _num(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return float(value)


def _mapping(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _seq(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _environment(value: Any) -> str:
    """``environment_reruns`` of a summary: how many cases were run again, and why."""
    if not isinstance(value, Mapping) or not value:
        return "0"
    return ", ".join(f"{int(_num(n))} ({k})" for k, n in sorted(value.items()))


def _property_names(s: Mapping[str, Any]) -> list[str]:
    names = [str(n) for n in _seq(s.get("properties"))]
    for key in ("cases_per_property", "seconds_per_property", "weights"):
        names += [n for n in _mapping(s.get(key)) if n not in names]
    for point in _seq(s.get("timeline")):
        if isinstance(point, Mapping):
            names += [n for n in _mapping(point.get("per_property")) if n not in names]
    return names


# --------------------------------------------------------------------------------------------
# The page


def render_html(summary: Mapping[str, Any], *, base: Path | None = None) -> str:
    """The report page for ``summary`` (coverage is computed if the summary lacks it).

    ``base``: the directory the page is written to; links to corpus entries are relative to it
    (as given, relative to the current directory, without one)."""
    s = summary
    names = _property_names(s)
    colours = {n: PROPERTY_COLOURS[i % len(PROPERTY_COLOURS)] for i, n in enumerate(names)}
    cov = s.get("coverage")
    rows = cov if isinstance(cov, list) else coverage(_mapping(s.get("features")))
    title = f"shardfuzz campaign, seed {s.get('seed', '?')}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # Nothing may be fetched: the page must render the same offline, from any directory.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>{_e(title)}</title><style>{_CSS.replace('__NEVER__', NEVER_COLOUR)}</style></head><body><main>",
        _header(s, title),
        _properties_table(s, names, colours),
        _causes_table(s),
        _failures_table(s, base),
        _plots(s, names, colours),
        _coverage_section(rows),
        _torch_section(s),
        _features_table(s),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"


def _header(s: Mapping[str, Any], title: str) -> str:
    seconds, budget, cases = _num(s.get("seconds")), _num(s.get("budget")), int(_num(s.get("cases")))
    rate = f"{cases / seconds:.3g}" if seconds > 0 else "-"
    seeds = _seq(s.get("seeds"))  # a campaign of several pools: one seed each
    spent = _duration(seconds) + (f" of {_duration(budget)} ({100 * seconds / budget:.0f}%)" if budget > 0 else "")
    facts = [
        ("seed", s.get("seed", "-") if len(seeds) < 2 else f"{seeds[0]}..{seeds[-1]}"),
        ("backend", s.get("backend", "-")),
        ("world size", s.get("world_size", "-")),
        ("pools", s.get("pools", 1)),
        ("under the fixes of", ", ".join(str(b) for b in _seq(s.get("fixes"))) or "none"),
        ("started", s.get("started_at", "-")),
        ("elapsed / budget", spent),
        ("cases", cases),
        ("cases / s", rate),
        ("restarts", int(_num(s.get("restarts")))),
        ("ranks recycled", int(_num(s.get("recycled")))),
        ("cases re-run for the machine", _environment(s.get("environment_reruns"))),
        ("interrupted", "yes" if s.get("interrupted") else "no"),
        ("properties", len(_property_names(s))),
        ("schema", s.get("schema", "-")),
    ]
    grid = "".join(f"<div>{_e(k)}<b>{_e(v)}</b></div>" for k, v in facts)
    failures = [f for f in _seq(s.get("failures")) if isinstance(f, Mapping)]
    new = sum(1 for f in failures if not f.get("known"))
    known = len(failures) - new
    if new:
        verdict = f'<p class="verdict bad">{new} new distinct failure{"s" * (new != 1)}'
    else:
        verdict = '<p class="verdict good">no new failure'
    verdict += f", {known} known</p>" if known else "</p>"
    if s.get("interrupted"):
        verdict += '<p class="verdict warn">The campaign was interrupted: the figures cover the time it ran.</p>'
    return f'<h1>{_e(title)}</h1><div class="card">{verdict}<div class="facts">{grid}</div></div>'


def _properties_table(s: Mapping[str, Any], names: list[str], colours: dict[str, str]) -> str:
    cases, seconds, weights = (_mapping(s.get(k)) for k in ("cases_per_property", "seconds_per_property", "weights"))
    torch = _mapping(s.get("torch_coverage"))
    new_lines = _mapping(torch.get("new_lines_per_property")) if torch else None
    body = []
    for n in names:
        c, sec = int(_num(cases.get(n))), _num(seconds.get(n))
        per = f"{sec / c:.4f}" if c else "-"
        weight = f"{100 * _num(weights[n]):.0f}%" if n in weights else "-"
        swatch = f'<span style="display:inline-block;width:10px;height:10px;background:{colours[n]}"></span> '
        lines = "" if new_lines is None else f"<td class=n>{int(_num(new_lines.get(n)))}</td>"
        body.append(
            f"<tr><td>{swatch}<code>{_e(n)}</code></td><td class=n>{c}</td><td class=n>{sec:.1f}</td>"
            f"<td class=n>{per}</td><td class=n>{weight}</td>{lines}</tr>"
        )
    if not body:
        return ""
    head = (
        "<tr><th>property</th><th class=n>cases</th><th class=n>seconds</th><th class=n>s / case</th>"
        "<th class=n>scheduler share</th>" + ("" if new_lines is None else "<th class=n>new torch lines</th>") + "</tr>"
    )
    return f"<h2>Properties</h2><table>{head}{''.join(body)}</table>"


def _causes_table(s: Mapping[str, Any]) -> str:
    """Likely causes: one row per group of :func:`causes`, new ones first."""
    groups = causes(_seq(s.get("failures")))
    if not groups:
        return ""
    body = []
    for g in groups:
        tag = '<span class="tag known">known</span>' if g["known"] else '<span class="tag new">new</span>'
        if g["known"]:
            what = f"<b>{_e(shorten(str(g['title']), 300))}</b>"
            if g["bug"]:
                what += f" <span class=small>(<code>{_e(g['bug'])}</code>)</span>"
            if g["upstream"]:
                url = upstream_url(str(g["upstream"]))
                link = f'<a href="{_e(url)}">{_e(g["upstream"])}</a>' if url else _e(g["upstream"])
                what += f"<div class=small>upstream: {link}</div>"
        else:
            what = f"first failing check <code>{_e(g['check'] or g['title'])}</code>"
            if g["features"]:
                what += f"<div class=small>shrunk features: {_e(shorten(', '.join(g['features']), 400))}</div>"
        sigs = "".join(f"<div><code>{_e(x)}</code></div>" for x in g["signatures"])
        props = ", ".join(_e(x) for x in g["properties"])
        body.append(
            f"<tr><td class=n>#{g['id']}</td><td>{tag}</td><td>{what}</td><td>{sigs}</td><td>{props}</td>"
            f"<td class=n>{g['hits']}</td></tr>"
        )
    head = (
        "<tr><th class=n>cause</th><th>status</th><th>what</th><th>signatures</th><th>properties</th>"
        "<th class=n>hits</th></tr>"
    )
    new = sum(1 for g in groups if not g["known"])
    intro = (
        '<p class="small">Failures that are likely one cause: the same known bug met through several '
        "properties or signatures; new failures with the same first failing check and the same shrunk "
        "features. Start here; the failures below name their cause.</p>"
    )
    return f"<h2>Likely causes ({len(groups)}: {new} new)</h2>{intro}<table>{head}{''.join(body)}</table>"


def _failures_table(s: Mapping[str, Any], base: Path | None = None) -> str:
    failures = [f for f in _seq(s.get("failures")) if isinstance(f, Mapping)]
    fallback = _mapping(s.get("corpus_fallback"))
    note = ""
    if fallback:
        note = (
            f'<p class="verdict warn">Some entries could not be written to the corpus '
            f"({_e(fallback.get('reason', '?'))}); they were saved to <code>{_e(fallback.get('directory', '?'))}"
            "</code> instead.</p>"
        )
    if not failures:
        return f'<h2>Failures</h2>{note}<p class="card good">No failures.</p>'
    cause_of = {sig: g["id"] for g in causes(failures) for sig in g["signatures"]}
    failures.sort(
        key=lambda f: (
            bool(f.get("known")),
            cause_of.get(str(f.get("signature")), 0),
            -_num(f.get("hits")),
            _num(f.get("first_seen")),
        )
    )
    body = []
    for f in failures:
        tag = '<span class="tag known">known</span>' if f.get("known") else '<span class="tag new">new</span>'
        summary = str(f.get("summary") or "")
        about = [f"<div class=small><b>This run:</b> {_e(shorten(summary, 400))}</div>"]
        for note in _seq(f.get("unfinished")):
            about.append(f'<div class="small warn"><b>{_e(note)}</b></div>')
        about += _known_lines(f)
        upstream = f.get("upstream")
        if upstream:
            url = upstream_url(str(upstream))
            link = f'<a href="{_e(url)}">{_e(upstream)}</a>' if url else _e(upstream)
            about.append(f"<div class=small>upstream: {link}</div>")
        commands = [str(c) for c in _seq(f.get("commands"))]
        if commands:
            shown = " &nbsp;or&nbsp; ".join(f"<code>{_e(c)}</code>" for c in commands)
            about.append(f'<div class="next">next: {shown}</div>')
        first = f.get("first_seen")
        first_text = f"{_num(first):.1f}" if isinstance(first, (int, float)) else "-"
        entry = f.get("entry")
        if entry:
            where = f'<a href="{_e(_href(str(entry), base))}"><code>{_e(entry)}</code></a>'
            if f.get("entry_fallback"):
                where += "<div class=small>not in the corpus: saved to the fallback directory</div>"
        else:
            where = "<span class=small>not saved</span>"
        cause = cause_of.get(str(f.get("signature")))
        body.append(
            f"<tr><td><code>{_e(f.get('signature', '?'))}</code>{''.join(about)}</td>"
            f"<td class=n>{'#' + str(cause) if cause else '-'}</td>"
            f"<td>{_e(f.get('kind', '-'))}</td><td><code>{_e(f.get('property', '-'))}</code></td>"
            f"<td class=n>{int(_num(f.get('hits')))}</td><td>{tag}</td><td class=n>{first_text}</td>"
            f"<td>{where}</td></tr>"
        )
    head = (
        "<tr><th>signature</th><th class=n>cause</th><th>kind</th><th>property</th><th class=n>hits</th>"
        "<th>status</th><th class=n>first seen (s)</th><th>corpus entry</th></tr>"
    )
    return f"<h2>Failures ({len(failures)} distinct)</h2>{note}<table>{head}{''.join(body)}</table>"


def _known_lines(f: Mapping[str, Any]) -> list[str]:
    """For a failure counted as a known bug: which bug, and how this run's failure was matched to
    it. The corpus entry's own summary (its values, its run) is not shown as if it were this
    run's: only the bug's title, and for a bug met another way both signatures."""
    if not f.get("known"):
        return []
    bug = str(f.get("bug") or "")
    title = known.get(bug).title if bug in known.BUGS else str(f.get("entry_summary") or "")
    lines = [f"<div class=small><b>Known bug{f' {_e(bug)}' if bug else ''}:</b> {_e(shorten(title, 300))}</div>"]
    if f.get("known_as"):
        how = (
            f"met another way: this run's signature <code>{_e(f.get('signature'))}</code>, the corpus entry's "
            f"<code>{_e(f['known_as'])}</code> (the same exception and innermost torch frame, or a mismatch of the "
            "same API family in a case that meets the bug's condition)"
        )
    else:
        how = "matched by the corpus entry's signature"
    lines.append(f"<div class=small>{how}</div>")
    return lines


def _href(entry: str, base: Path | None) -> str:
    """A relative link from the page in ``base`` to the file ``entry`` (relative to the current
    directory, or absolute)."""
    target = entry
    if base is not None:
        target = os.path.relpath(os.path.abspath(entry), os.path.abspath(base))
    return urllib.parse.quote(Path(target).as_posix())


def _plots(s: Mapping[str, Any], names: list[str], colours: dict[str, str]) -> str:
    timeline = sorted(
        (p for p in _seq(s.get("timeline")) if isinstance(p, Mapping) and "t" in p), key=lambda p: _num(p.get("t"))
    )
    seconds = _num(s.get("seconds"))
    end = seconds if timeline and seconds > _num(timeline[-1].get("t")) else None
    total = [(_num(p.get("t")), _num(p.get("cases"))) for p in timeline]
    if end is not None:
        total.append((end, _num(s.get("cases"), total[-1][1])))
    series = [("all properties", TOTAL_COLOUR, total, 2.5)]
    final = _mapping(s.get("cases_per_property"))
    for n in names:
        pts = [(_num(p.get("t")), _num(_mapping(p.get("per_property")).get(n))) for p in timeline]
        if end is not None and n in final:
            pts.append((end, _num(final[n])))
        if any(y for _, y in pts):
            series.append((n, colours[n], pts, 1.5))
    first = s.get("first_case_s")
    startup = (
        f"<div class=small>The first case ended at {_num(first):.1f} s: until then the ranks were starting "
        "(importing torch, joining the process group), so the curve starts flat.</div>"
        if first is not None
        else ""
    )
    cases_plot = _figure(
        "Cases over time",
        line_chart(series, width=1090, height=280, y_label="cases"),
        (_legend(series) if total else "") + startup,
    )
    distinct = [(_num(p.get("t")), _num(p.get("distinct_failures"))) for p in timeline]
    firsts = sorted(_num(f.get("first_seen")) for f in _seq(s.get("failures")) if isinstance(f, Mapping))
    if not distinct and firsts:
        distinct = [(0.0, 0.0)] + [(t, float(i + 1)) for i, t in enumerate(firsts)]
    if distinct and seconds > distinct[-1][0]:
        distinct.append((seconds, distinct[-1][1]))
    fail_series = [("distinct failures", FAILURE_COLOUR, distinct, 2.0)]
    fail_plot = _figure(
        "Distinct failures over time", line_chart(fail_series, width=535, height=240, y_label="failures", step=True)
    )
    cases, secs = _mapping(s.get("cases_per_property")), _mapping(s.get("seconds_per_property"))
    bars = []
    for n in names:
        c = _num(cases.get(n))
        if c > 0:
            mean = _num(secs.get(n)) / c
            bars.append((n, mean, colours[n], f"{mean:.3g} s ({int(c)} cases)", False))
    time_plot = _figure(
        "Time per case by property (mean seconds)",
        bar_chart(bars, width=535, label_width=120, empty="no case ran"),
    )
    return f'<h2>Progress</h2>{cases_plot}<div class="grid">{fail_plot}{time_plot}</div>'


def _figure(title: str, svg: str, legend: str = "") -> str:
    return f'<div class="card"><h3>{_e(title)}</h3>{svg}{legend}</div>'


def _legend(series: Sequence[tuple[str, str, Any, float]]) -> str:
    items = "".join(f'<span class=sw style="background:{c}"></span>{_e(n)}' for n, c, _, _ in series)
    return f'<div class="legend">{items}</div>'


def _coverage_section(rows: list[Any]) -> str:
    rows = [r for r in rows if isinstance(r, Mapping)]
    never = [r for r in rows if not r.get("exercised")]
    missing = [r for r in never if not r.get("generated", True)]
    unreached = [r for r in never if r.get("generated", True)]
    out = [f"<h2>Feature coverage ({len(rows) - len(never)} of {len(rows)} checklist items exercised)</h2>"]
    if never:
        lists = []
        for what, group in (
            ("not generated by the suite yet", missing),
            ("generated by the strategies, not reached in this campaign", unreached),
        ):
            if group:
                items = "".join(
                    f"<li>{_e(r.get('label'))} <span class=small>({_e(r.get('area'))})</span></li>" for r in group
                )
                lists.append(f"<div><b>Never exercised: {_e(what)} ({len(group)})</b><ul>{items}</ul></div>")
        out.append(f'<div class="card never">{"".join(lists)}</div>')
    out.append(
        '<p class="small">Bars are on a logarithmic scale: the number is how many feature events of the '
        "campaign matched the item (a case may count more than once).</p>"
    )
    areas = list(AREAS) + sorted({str(r.get("area")) for r in rows} - set(AREAS))
    for area in areas:
        group = [r for r in rows if r.get("area") == area]
        if not group:
            continue
        done = sum(1 for r in group if r.get("exercised"))
        bars = []
        for r in group:
            count = int(_num(r.get("count")))
            if r.get("exercised"):
                text = str(count)
            else:
                text = "never exercised" + ("" if r.get("generated", True) else ": not generated yet")
            bars.append((str(r.get("label")), float(count), COVERAGE_COLOUR, text, not r.get("exercised")))
        chart = bar_chart(bars, width=1090, label_width=430, log=True, empty="")
        out.append(_figure(f"{area}: {done} of {len(group)} exercised", chart))
    return "".join(out)


def _torch_section(s: Mapping[str, Any]) -> str:
    """The torch lines the ranks reached (``torch_coverage``, from fuzz.torch_coverage): per
    package, over time, and per module with the functions never reached. Nothing where the
    campaign did not measure them."""
    t = _mapping(s.get("torch_coverage"))
    if not t:
        return ""
    total, reached = int(_num(t.get("lines"))), int(_num(t.get("reached")))
    percent = 100.0 * reached / total if total else 0.0
    out = [f"<h2>Torch coverage ({reached} of {total} lines reached, {percent:.1f}%)</h2>"]
    signal = t.get("signal")
    how = (
        "The scheduler gave more time to the properties still reaching new lines. "
        if signal
        else "Measured only: the scheduler did not follow new lines. "
        if signal is False
        else ""
    )
    out.append(
        '<p class="small">Lines of torch\'s distributed packages that a rank ran (coverage.py, merged over '
        f"every rank process: {int(_num(t.get('data_files')))} data files). {how}"
        "A line counts once, whichever property reached it; the properties table says which property's cases "
        "reached each line first. A function is never reached when none of its executable lines ran.</p>"
    )
    if t.get("foreign_files"):
        out.append(
            f'<p class="small warn">{int(_num(t.get("foreign_files")))} measured files are not files of the torch '
            "that read the data; they are left out.</p>"
        )
    rows = []
    for p in _seq(t.get("packages")):
        if isinstance(p, Mapping):
            rows.append(
                f"<tr><td><code>{_e(p.get('package'))}</code></td>"
                f"<td class=n>{int(_num(p.get('modules_reached')))} / {int(_num(p.get('modules')))}</td>"
                f"<td class=n>{int(_num(p.get('reached')))}</td><td class=n>{int(_num(p.get('lines')))}</td>"
                f"<td class=n>{_num(p.get('percent')):.1f}</td></tr>"
            )
    if rows:
        head = (
            "<tr><th>package</th><th class=n>modules reached</th><th class=n>lines reached</th>"
            "<th class=n>executable lines</th><th class=n>%</th></tr>"
        )
        out.append(f"<table>{head}{''.join(rows)}</table>")
    timeline = [p for p in _seq(s.get("timeline")) if isinstance(p, Mapping) and "torch_lines" in p]
    if timeline:
        pts = sorted((_num(p.get("t")), _num(p.get("torch_lines"))) for p in timeline)
        series = [("torch lines reached", COVERAGE_COLOUR, pts, 2.0)]
        out.append(
            _figure("Torch lines reached over time", line_chart(series, width=1090, height=220, y_label="lines"))
        )
    body = []
    for m in _seq(t.get("modules")):
        if not isinstance(m, Mapping):
            continue
        never = [str(x) for x in _seq(m.get("never_reached"))]
        lines, got = int(_num(m.get("lines"))), int(_num(m.get("reached")))
        pct = _num(m.get("percent"))
        bar = (
            f'<div style="background:#eceff3;width:90px;height:9px;display:inline-block;vertical-align:middle">'
            f'<div style="background:{COVERAGE_COLOUR};width:{min(max(pct, 0.0), 100.0) * 0.9:.0f}px;height:9px">'
            "</div></div>"
        )
        functions = f"{len(never)} of {int(_num(m.get('functions')))}"
        if never:
            names = ", ".join(f"<code>{_e(n)}</code>" for n in never)
            functions = f"<details><summary>{functions}</summary>{names}</details>"
        row_class = ' class="never"' if lines and not got else ""
        body.append(
            f"<tr{row_class}><td><code>{_e(m.get('module'))}</code></td><td class=n>{got}</td><td class=n>{lines}</td>"
            f"<td class=n>{pct:.1f} {bar}</td><td>{functions}</td></tr>"
        )
    if body:
        head = (
            "<tr><th>module</th><th class=n>reached</th><th class=n>lines</th><th class=n>%</th>"
            "<th>functions never reached</th></tr>"
        )
        out.append(f"<h3>Per module</h3><table>{head}{''.join(body)}</table>")
    return "".join(out)


def _features_table(s: Mapping[str, Any]) -> str:
    features = {n: int(_num(c)) for n, c in _mapping(s.get("features")).items()}
    per_prop = {p: _mapping(f) for p, f in _mapping(s.get("features_per_property")).items()}
    top = sorted(features.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP_FEATURES]
    if not top:
        return "<h2>Top features</h2><p class=card>No feature was recorded.</p>"
    body = []
    for name, count in top:
        by = sorted(
            ((p, int(_num(f.get(name)))) for p, f in per_prop.items() if _num(f.get(name)) > 0), key=lambda x: -x[1]
        )
        where = ", ".join(f"{p} {c}" for p, c in by)
        items = ", ".join(i.id for i in CHECKLIST if i.matches(name))
        body.append(
            f"<tr><td><code>{_e(name)}</code></td><td class=n>{count}</td><td>{_e(where)}</td>"
            f"<td class=small>{_e(items)}</td></tr>"
        )
    head = "<tr><th>feature</th><th class=n>count</th><th>by property</th><th>checklist items</th></tr>"
    shown = f"top {len(top)} of {len(features)}" if len(features) > len(top) else f"all {len(top)}"
    # Folded: a first reader wants the verdict and the failures; the features are for tuning.
    return (
        f"<h2>Top features ({shown})</h2><details><summary>show the table</summary>"
        f"<table>{head}{''.join(body)}</table></details>"
    )
