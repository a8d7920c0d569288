"""A corpus entry as Markdown for an upstream issue: ``python -m fuzz repro ENTRY --issue``.

A maintainer reads it without shardfuzz: a title from the failure, the versions it was found
with, what was observed and what was expected, the command, the script (which needs only
torch), and the upstream issue from the known-bug registry (:mod:`fuzz.known`) where the entry
names its record.
"""

from __future__ import annotations

import re
from pathlib import Path

from fuzz import known
from fuzz.corpus import Entry
from fuzz.properties import get_property
from fuzz.repro.harness import is_plain
from fuzz.repro.reduce import header_fields
from fuzz.repro.script import code_lines, run_command, upstream_of
from fuzz.signature import Signature

#: Lines of a traceback quoted under "Observed".
TRACEBACK_LINES = 30


def title_of(entry: Entry) -> str:
    """The known bug's title, else what the signature says in words."""
    if entry.bug:
        return known.get(entry.bug).title
    kind, _, rest = entry.signature.partition(":")
    prop, _, detail = rest.partition(":") if kind in ("exception", "crash") else rest.partition("@")
    if kind == "exception" and "@" in detail:
        exc, _, where = detail.partition("@")
        return f"{exc.rsplit('.', 1)[-1]} in {where} ({prop})"
    if kind == "crash":
        return f"a rank dies ({detail.replace('@', ' in ')}) ({prop})"
    if kind == "hang":
        return f"ranks hang in {detail or '?'} ({prop})"
    return f"{prop} disagrees: {detail or rest} ({entry.summary.split('(')[0].strip()[:80]})"


def _first_error(entry: Entry) -> tuple[str, str] | None:
    """(message, traceback tail) of the first rank that raised, from the entry's details."""
    ranks = entry.details.get("ranks") if isinstance(entry.details, dict) else None
    for r in ranks if isinstance(ranks, list) else []:
        if isinstance(r, dict) and r.get("exc_type"):
            tb = str(r.get("traceback") or "").strip().splitlines()
            return f"rank {r.get('rank')}: {r['exc_type']}: {r.get('message') or ''}", "\n".join(tb[-TRACEBACK_LINES:])
    return None


def _raised(entry: Entry) -> str:
    """The entry's exception as its signature names it: ``type`` in ``torch/x.py:function``."""
    sig = Signature.parse(entry.signature)
    return f"`{sig.check}` in `{sig.where}`" if sig is not None and sig.check else f"`{entry.signature}`"


def _fence(text: str, lang: str = "") -> str:
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, run + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def render_issue(entry: Entry, script: str, source: str = "") -> str:
    """The Markdown for ``entry``; ``script`` is its reduced script (kept beside the entry) or its
    unreduced one (fuzz.repro.render_entry)."""
    case = entry.case
    prop = get_property(case.property)
    name = Path(source).name if source else entry.file_name
    versions = entry.versions
    gpu = entry.backend == "nccl"
    reduced = bool(header_fields(script))
    lines = [f"# {title_of(entry)}", ""]
    lines += [
        "| torch | Python | backend | world size | device |",
        "| --- | --- | --- | --- | --- |",
        f"| {versions.get('torch', '?')} | {versions.get('python', '?')} | {entry.backend} | {case.world_size} | "
        f"{versions.get('device', entry.device_kind)} |",
        "",
        "## Observed",
        "",
        " ".join(entry.summary.split()),
        "",
    ]
    error = _first_error(entry)
    if error is not None:
        lines += [_fence(f"{error[0]}\n\n{error[1]}", "text"), ""]
    check = entry.details.get("check") if isinstance(entry.details, dict) else None
    lines += [
        f"Failure signature (shardfuzz): `{entry.signature}`" + (f", check `{check}`" if check else "") + ".",
        "",
        "## Expected",
        "",
        f"{prop.description[0].upper()}{prop.description[1:]} (shardfuzz property `{prop.name}`).",
        "",
        "## Reproduce",
        "",
        f"Save the script below as `repro.py` and run it on {'one GPU per rank' if gpu else 'CPU'}:",
        "",
        _fence(run_command(entry), "sh"),
        "",
        (
            f"While the bug is present a rank raises {_raised(entry)} (its traceback is printed) "
            "and torchrun exits 1; once it is fixed every rank prints `PASS` and it exits 0."
            if is_plain(script)
            else "It exits 1 and its last line reads `REPRODUCED <signature>: ...` while the bug is present, "
            "and exits 0 with `PASS` once it is fixed."
        ),
        "It needs only torch: "
        + (
            "it was cut down from the fuzzer's case while the same failure still reproduced."
            if reduced
            else "the case (JSON) and the code that builds, composes, trains and checks it are in the file."
        ),
        "",
        f"<details><summary>repro.py ({code_lines(script)} code lines, {'reduced' if reduced else 'unreduced'}; "
        f"corpus entry {name})</summary>",
        "",
        _fence(script, "python"),
        "",
        "</details>",
        "",
        "## Upstream",
        "",
    ]
    upstream, url = upstream_of(entry)
    if entry.bug:
        bug = known.get(entry.bug)
        said = url or bug.upstream
        lines.append(
            f"{said}" + (f" ({bug.relation})" if bug.relation else "") + (f"; {bug.state}" if bug.state else "")
        )
        for other in bug.see_also:
            lines.append(f"See also {other}.")
    else:
        lines.append(upstream or "Not linked to an upstream issue.")
    return "\n".join(lines) + "\n"
