"""The API surface: what torch offers of the APIs under test, and how much of it the suite draws.

The items are read from the installed torch at run time, never from a hand list (:data:`SOURCES`
names where to look): the public methods of ``FSDPModule``; the parameters of ``fully_shard``,
``replicate``, ``checkpoint``, ``dcp.save`` / ``async_save`` / ``load``, ``FileSystemWriter``,
``FileSystemReader``, ``DefaultSavePlanner`` and ``DefaultLoadPlanner``; the fields of
``MixedPrecisionPolicy``, ``CPUOffloadPolicy`` and ``StateDictOptions``; the public functions
of ``torch.distributed.checkpoint.state_dict``; the names ``format_utils`` exports. Where a
function takes ``**kwargs``, its keyword arguments are the keys its source reads from them
(``kwargs.pop("use_reentrant", ...)``) and, for ``replicate``, the parameters of
``DistributedDataParallel``, which receives them.

:data:`fuzz.api_uses.USES` (a module of its own: it is data) says how the suite exercises each
item: the features (the names each property's ``features(case)`` records, counted in
``summary.json`` under ``features``) that show a case used it, given as checklist items of
:mod:`fuzz.coverage` and regular expressions, or why it is not drawn. An item torch has and
``USES`` does not know is ``unknown``; an entry of ``USES`` for an item this torch lacks (an
older or newer torch) is listed as stale. An unlisted name that starts with an underscore is ``private``.

torch is imported inside functions only: ``python -m fuzz`` starts without it. docs/api_surface.md
describes the table.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fuzz.api_uses import (
    DRAWN,
    DRAWN_STATUSES,
    EXCLUDED_STATUSES,
    EXERCISED,
    PRIVATE,
    STATUSES,
    UNKNOWN,
    USES,
    Use,
)

# --------------------------------------------------------------------------------------------
# Where the surface is read from


@dataclass(frozen=True)
class Source:
    """One place in torch the surface is read from.

    ``kind``: ``methods`` (public methods of a class), ``parameters`` (of a function or a
    class's constructor), ``fields`` (of a dataclass), ``functions`` (public functions defined
    in a module), ``exports`` (a module's ``__all__``). ``kwargs_to``: (module, name) of the
    callable a function hands its ``**kwargs`` to; its parameters become the function's."""

    group: str
    module: str
    attr: str = ""
    kind: str = "parameters"
    kwargs_to: tuple[str, str] | None = None


_FSDP = "torch.distributed.fsdp"
_COMPOSABLE = "torch.distributed._composable"
_DCP = "torch.distributed.checkpoint"
_SD = "torch.distributed.checkpoint.state_dict"

SOURCES: tuple[Source, ...] = (
    Source("FSDPModule", _FSDP, "FSDPModule", "methods"),
    Source("fully_shard", _FSDP, "fully_shard"),
    Source("replicate", _COMPOSABLE, "replicate", kwargs_to=("torch.nn.parallel", "DistributedDataParallel")),
    Source("checkpoint", _COMPOSABLE, "checkpoint"),
    Source("dcp.save", _DCP, "save"),
    Source("dcp.async_save", _DCP, "async_save"),
    Source("dcp.load", _DCP, "load"),
    Source("FileSystemWriter", _DCP, "FileSystemWriter"),
    Source("FileSystemReader", _DCP, "FileSystemReader"),
    Source("DefaultSavePlanner", _DCP, "DefaultSavePlanner"),
    Source("DefaultLoadPlanner", _DCP, "DefaultLoadPlanner"),
    Source("MixedPrecisionPolicy", _FSDP, "MixedPrecisionPolicy", "fields"),
    Source("CPUOffloadPolicy", _FSDP, "CPUOffloadPolicy", "fields"),
    Source("StateDictOptions", _SD, "StateDictOptions", "fields"),
    Source("state_dict", _SD, "", "functions"),
    Source("format_utils", "torch.distributed.checkpoint.format_utils", "", "exports"),
)


@dataclass(frozen=True)
class SurfaceItem:
    """One item of the surface: ``name`` as tables show it (``FSDPModule.reshard``,
    ``dcp.save(planner)``, ``MixedPrecisionPolicy.param_dtype``), its source's group, and its
    kind (method, parameter, keyword, field, function, class)."""

    name: str
    group: str
    kind: str


@dataclass(frozen=True)
class Surface:
    """The surface one torch offers: its items, and the sources it lacks (``problems``)."""

    torch_version: str
    items: tuple[SurfaceItem, ...]
    problems: tuple[str, ...] = ()


def _load(module: str, attr: str) -> Any:
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _methods(cls: Any) -> list[tuple[str, str]]:
    """Public methods of a class other than nn.Module's (FSDPModule's instances are modules too;
    nn.Module's own methods are not its surface)."""
    from torch import nn

    inherited = set(dir(nn.Module))
    return [
        (n, "method")
        for n in dir(cls)
        if not n.startswith("_") and n not in inherited and callable(getattr(cls, n, None))
    ]


def _keyword_reads(fn: Callable[..., Any], kwargs_name: str) -> list[str]:
    """The keys ``fn``'s source reads from its ``**kwargs`` (``kwargs.pop("x")``, ``.get``,
    ``kwargs["x"]``, ``"x" in kwargs``), in order of appearance; [] without source."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return []
    found: list[tuple[int, int, str]] = []

    def is_kwargs(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == kwargs_name

    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_kwargs(node.func.value):
            if node.func.attr in ("pop", "get", "setdefault") and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_kwargs(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Compare)
            and len(node.comparators) == 1
            and is_kwargs(node.comparators[0])
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
        ):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((key.lineno, key.col_offset, key.value))
    out: list[str] = []
    for _, _, name in sorted(found):
        if name not in out:
            out.append(name)
    return out


def _parameters(source: Source, obj: Any) -> list[tuple[str, str]]:
    sig = inspect.signature(obj)
    out: list[tuple[str, str]] = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if p.kind is not inspect.Parameter.VAR_KEYWORD:
            out.append((p.name, "parameter"))
            continue
        keywords = _keyword_reads(obj, p.name)
        if source.kwargs_to is not None:
            forwarded = inspect.signature(_load(*source.kwargs_to)).parameters.values()
            keywords += [
                q.name
                for q in forwarded
                if q.name not in ("self", "module")
                and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            ]
        if not keywords:
            out.append((f"**{p.name}", "keyword"))
        out += [(k, "keyword") for k in dict.fromkeys(keywords) if k not in {n for n, _ in out}]
    return out


def _read(source: Source) -> list[SurfaceItem]:
    obj = _load(source.module, source.attr)
    if source.kind == "methods":
        return [SurfaceItem(f"{source.group}.{n}", source.group, k) for n, k in _methods(obj)]
    if source.kind == "fields":
        return [SurfaceItem(f"{source.group}.{f.name}", source.group, "field") for f in dataclasses.fields(obj)]
    if source.kind == "functions":
        names = [
            n
            for n, v in vars(obj).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == obj.__name__
        ]
        return [SurfaceItem(f"{source.group}.{n}", source.group, "function") for n in sorted(names)]
    if source.kind == "exports":
        names = list(getattr(obj, "__all__", ()))
        return [
            SurfaceItem(
                f"{source.group}.{n}", source.group, "class" if inspect.isclass(getattr(obj, n)) else "function"
            )
            for n in names
            if hasattr(obj, n) and not n.startswith("_")
        ]
    return [SurfaceItem(f"{source.group}({n})", source.group, k) for n, k in _parameters(source, obj)]


def read_surface(sources: Iterable[Source] = SOURCES) -> Surface:
    """The surface of the installed torch. A source this torch lacks (or that cannot be read) is
    named in ``problems``; the others are read all the same."""
    try:
        import torch
    except ImportError as e:
        return Surface("none", (), (f"torch cannot be imported: {e}",))
    items: list[SurfaceItem] = []
    problems: list[str] = []
    for source in sources:
        where = f"{source.module}.{source.attr}" if source.attr else source.module
        try:
            items += _read(source)
        except (ImportError, AttributeError) as e:
            problems.append(f"{source.group}: {where} is not in this torch ({type(e).__name__}: {e})")
        except (TypeError, ValueError) as e:
            problems.append(f"{source.group}: {where} cannot be introspected ({type(e).__name__}: {e})")
    return Surface(str(torch.__version__), tuple(items), tuple(problems))


@lru_cache(maxsize=1)
def installed_surface() -> Surface:
    """:func:`read_surface` of the installed torch, read once per process."""
    return read_surface()


def _leaf_name(name: str) -> str:
    """``reshard`` of ``FSDPModule.reshard``, ``_extensions`` of ``FileSystemWriter(_extensions)``."""
    m = re.fullmatch(r"[^(]*\((.*)\)", name)
    return m.group(1) if m else name.rsplit(".", 1)[-1]


def _use_of(name: str, uses: Mapping[str, Use]) -> Use | None:
    if name in uses:
        return uses[name]
    if _leaf_name(name).startswith("_"):
        return Use(PRIVATE, note="its name starts with an underscore")
    return None


# --------------------------------------------------------------------------------------------
# The table


def _count(value: Any) -> int:
    """A feature count as fuzz.coverage reads it: not a number (a hand-edited summary) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return max(int(value), 0)


def api_coverage(
    features: Mapping[str, Any] | None = None,
    *,
    surface: Surface | None = None,
    uses: Mapping[str, Use] | None = None,
) -> dict[str, Any]:
    """The API-surface table, as JSON: ``torch`` (its version), ``rows`` (one per item, in
    the order torch gives them: ``name``, ``group``, ``kind``, ``status``, ``note``, ``bound``
    (see :class:`Use`), and for drawn items ``count`` and ``matched``, the feature names
    counted, most frequent first; ``count`` is None without ``features``), ``stale`` (entries of ``uses`` for items this
    torch lacks), ``problems`` (sources this torch lacks), ``statuses`` (items per status),
    ``drawn`` / ``total`` / ``share`` and ``drawable`` / ``drawable_share`` (the share among
    items that are not private, deprecated or accelerator-only), and ``groups`` (per group:
    ``drawn``, ``total``).

    ``features``: a campaign's feature counts (summary.json ``features``); None for the table
    without counts. ``surface`` and ``uses`` default to the installed torch and :data:`USES`."""
    surface = installed_surface() if surface is None else surface
    uses = USES if uses is None else uses
    counts = None if features is None else {str(n): _count(c) for n, c in features.items()}
    rows: list[dict[str, Any]] = []
    for item in surface.items:
        use = _use_of(item.name, uses)
        row: dict[str, Any] = {
            "name": item.name,
            "group": item.group,
            "kind": item.kind,
            "status": UNKNOWN if use is None else use.status,
            "note": "" if use is None else use.note,
            "bound": "" if use is None else use.bound,
        }
        if use is not None and use.status == DRAWN:
            if counts is None:
                row["count"], row["matched"] = None, []
            else:
                matched = sorted((n for n in counts if use.matches(n)), key=lambda n: (-counts[n], n))
                row["count"], row["matched"] = sum(counts[n] for n in matched), matched
        rows.append(row)
    names = {item.name for item in surface.items}
    total = len(rows)
    drawn = sum(r["status"] in DRAWN_STATUSES for r in rows)
    drawable = sum(r["status"] not in EXCLUDED_STATUSES for r in rows)
    groups: dict[str, dict[str, int]] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"drawn": 0, "total": 0})
        g["total"] += 1
        g["drawn"] += r["status"] in DRAWN_STATUSES
    return {
        "torch": surface.torch_version,
        "rows": rows,
        "stale": sorted(n for n in uses if n not in names) if surface.items else [],
        "problems": list(surface.problems),
        "statuses": {s: sum(r["status"] == s for r in rows) for s in STATUSES},
        "drawn": drawn,
        "total": total,
        "share": drawn / total if total else 0.0,
        "drawable": drawable,
        "drawable_share": drawn / drawable if drawable else 0.0,
        "groups": groups,
    }


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def summary_lines(table: Mapping[str, Any]) -> list[str]:
    """The shares and the counts per status, in words."""
    st = table["statuses"]
    lines = [
        f"drawn: {table['drawn']} of {table['total']} items ({_percent(table['share'])}): "
        f"{st[DRAWN]} shown by features, {st[EXERCISED]} exercised without a feature yet",
        f"drawn among the {table['drawable']} items that are not private, deprecated or accelerator-only: "
        f"{_percent(table['drawable_share'])}",
        "; ".join(f"{s}: {st[s]}" for s in STATUSES[2:]),
    ]
    if table["stale"]:
        lines.append(f"listed in fuzz.api_surface.USES but not in torch {table['torch']}: {', '.join(table['stale'])}")
    lines += [f"not read: {p}" for p in table["problems"]]
    return lines


def _count_text(row: Mapping[str, Any]) -> str:
    """A row's count as tables show it: ``-`` where there is none, ``<=N`` / ``>=N`` for bounds."""
    return "-" if row.get("count") is None else f"{row.get('bound', '')}{row['count']}"


def format_table(table: Mapping[str, Any]) -> str:
    """The table as text for the command line: item, status, count (``-`` without a
    campaign, or for items that are not drawn), note; then the shares per group and overall."""
    header = ("item", "status", "count", "note")
    body = [
        (
            r["name"],
            r["status"],
            _count_text(r),
            r["note"],
        )
        for r in table["rows"]
    ]
    widths = [max([len(header[i])] + [len(row[i]) for row in body]) for i in range(3)]
    lines = [f"API surface of torch {table['torch']} (read from torch at run time): {table['total']} items", ""]
    for row in (header, *body):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3])
    lines.append("")
    gw = max([len(g) for g in table["groups"]] + [5])
    for g, n in table["groups"].items():
        lines.append(f"{g.ljust(gw)}  {n['drawn']:3d} of {n['total']:3d} drawn")
    lines.append("")
    lines += summary_lines(table)
    return "\n".join(lines).rstrip() + "\n"


def html_section(table: Mapping[str, Any]) -> str:
    """The table as a section of the report page (fuzz.report's styles; every text escaped)."""

    def e(value: Any) -> str:
        return html.escape(str(value), quote=True)

    head = "<tr><th>item</th><th>status</th><th class=n>count</th><th>note</th></tr>"
    body = []
    for r in table["rows"]:
        cls = "" if r["status"] in DRAWN_STATUSES else ' class="never"'
        count = e(_count_text(r))
        body.append(
            f"<tr{cls}><td><code>{e(r['name'])}</code></td><td>{e(r['status'])}</td>"
            f"<td class=n>{count}</td><td class=small>{e(r['note'])}</td></tr>"
        )
    words = "".join(f"<div>{e(line)}</div>" for line in summary_lines(table))
    return (
        f"<h2>API surface of torch {e(table['torch'])} ({table['drawn']} of {table['total']} items drawn, "
        f"{_percent(table['share'])})</h2><div class=card>{words}</div><table>{head}{''.join(body)}</table>"
    )


#: The keys of a table from :func:`api_coverage` that the renderers read.
_TABLE_KEYS = frozenset(
    (
        "torch",
        "rows",
        "stale",
        "problems",
        "statuses",
        "drawn",
        "total",
        "share",
        "drawable",
        "drawable_share",
        "groups",
    )
)


def report_section(summary: Mapping[str, Any]) -> str:
    """The report page's section for a campaign ``summary``: its ``api_surface`` table where it
    holds one (summary.json written with it), else the table computed from its ``features``
    against the installed torch."""
    table = summary.get("api_surface")
    if not (isinstance(table, Mapping) and set(table) >= _TABLE_KEYS):
        raw = summary.get("features")
        table = api_coverage(raw if isinstance(raw, Mapping) else {})
    return html_section(table)
