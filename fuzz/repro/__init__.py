"""Standalone reproducers: a corpus entry as one Python script that needs only torch.

``python -m fuzz repro ENTRY.json -o FILE.py`` writes a script for ``torchrun --nproc-per-node N
FILE.py`` that runs the entry's case on every rank with the rank side's own code (carried in
the script, :mod:`fuzz.repro.script`), judges it on rank 0 with the property's own judge
(:mod:`fuzz.repro.runtime`), and exits 1 iff the entry's failure reproduces. ``--issue`` writes
the same as Markdown for an upstream issue (:mod:`fuzz.repro.issue`); ``--all DIR`` renders
(and with ``--run`` runs) every entry of a corpus and prints figures (:mod:`fuzz.repro.bench`).
Where the printers write the entry's case (:mod:`fuzz.repro.printed`), the script is printed
from the case instead: the torch program a maintainer would write, with its reference computed
in the script; ``--reduce`` stores that one beside the entry as ``NAME.repro.py`` once it
reproduces here (:mod:`fuzz.repro.store`), and ``repro ENTRY.json`` writes the stored one first.

Properties name their renderer (:attr:`fuzz.properties.Property.repro`, "module:function"
taking the entry and its source name); a property that refuses on purpose says why
(:attr:`fuzz.properties.Property.repro_refusal`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument
from fuzz.properties import all_properties, get_property


def render_entry(entry: Entry, *, source: str = "") -> str:
    """The reproducer script for ``entry`` (``source`` names the entry file in its docstring)."""
    case = entry.case
    prop = get_property(case.property)
    if prop.repro_refusal is not None:
        raise InvalidArgument(f"{source or 'entry'}: {prop.repro_refusal}")
    if prop.repro is None:
        rendered = sorted(p.name for p in all_properties() if p.repro is not None)
        raise InvalidArgument(
            f"{source or 'entry'}: repro has no renderer for property {case.property!r} "
            f"(it renders {rendered}); replay it with `python -m fuzz replay` instead"
        )
    module, function = prop.repro.split(":")
    renderer: Callable[[Entry, str], str] = getattr(importlib.import_module(module), function)
    return renderer(entry, source)


__all__ = ["render_entry"]
