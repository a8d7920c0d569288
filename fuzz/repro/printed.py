"""Scripts printed from the case for the training properties (parity, metamorphic,
mixed_precision): the case's torch program as a maintainer would write it, and the dispatch of
every entry to its property's printer (:func:`print_entry`, :func:`printable`; state_dict and dcp
entries go to :mod:`fuzz.repro.print_state`).

A script is the model as plain module code and the composition's calls
(:mod:`fuzz.repro.print_model`), the case's training (:mod:`fuzz.repro.print_train`), and its
check (:mod:`fuzz.repro.print_check`):

- an exception runs the composed training as it is (both compositions, in order, for a
  metamorphic case) and exits 1 (``REPRODUCED``) where a rank raises the entry's exception (its
  type, in the same innermost frame of torch's own code), 2 where it raises another, 0 (``PASS``)
  where none raises;
- a mismatch (parity, metamorphic) trains a reference in the same script, the plain model on
  the same data with its gradients all-reduced and averaged (parity) or the same training under
  the variant composition (metamorphic), and compares losses, gradients and parameters after
  each step with the tolerance policy of :mod:`fuzz.tolerance`, naming the first tensor outside
  it at run time (exit 1, ``REPRODUCED``) or printing ``PASS`` (exit 0). No expected value is
  written in the script.

A case that uses what the printers do not write yet raises :class:`NotPrintable` naming it,
rather than printing a program that is not the case's.
"""

from __future__ import annotations

from typing import Any

from fuzz.corpus import Entry
from fuzz.model import Case, Wrapper
from fuzz.repro import print_contract
from fuzz.repro.print_check import compare_parts, expected_raised, header, main_block, main_imports, raised_line
from fuzz.repro.print_model import (
    PRINTED_MARK,
    NotPrintable,
    assemble,
    build_lines,
    check_composition,
    check_tree,
    compose_helpers,
    compose_imports,
    compose_lines,
    model_source,
    param_names,
    refuse,
)
from fuzz.repro.print_train import check_loop, compositions, scales, train_lines

#: The properties whose entries this module prints.
PRINTED = ("parity", "metamorphic", "mixed_precision")
#: The kinds of entry it prints.
KINDS = ("exception", "mismatch")
#: Mismatch checks that what a printed script compares (losses, gradients, parameters) does not
#: see: a contract observed inside the run (which units hold unsharded storage, when).
UNSEEN = ("contract-knobs",)

_NAMED_WRAPPED = """\
def named(model):  # by plain name, off its module: FSDP1 leaves some out of named_parameters (#85831)
    modules = {".".join(c for c in n.split(".") if c != "_fsdp_wrapped_module"): m for n, m in model.named_modules()}
    return [(n, getattr(modules[n.rpartition(".")[0]], n.rpartition(".")[2])) for n in NAMES]"""


def check_printable(case: Case, kind: str = "mismatch") -> None:
    """Raise :class:`NotPrintable` naming the first thing of ``case`` (an entry of ``kind``) this
    module does not write."""
    body: Any = case.body
    if case.property not in PRINTED:
        raise refuse(f"a {case.property} case")
    if kind == "mismatch" and case.property == "mixed_precision":
        raise refuse("a mixed_precision mismatch")
    check_tree(body.tree)
    judged = kind == "mismatch"
    knobs = case.property != "metamorphic"
    check_composition(body.composition, "composition", knobs=knobs, judged=judged, tree=body.tree)
    if case.property == "metamorphic":
        check_composition(body.variant, "variant", judged=judged, tree=body.tree)
    if kind == "mismatch" and case.property == "parity" and len(set(scales(case).values())) > 1:
        raise refuse("gradient scales that differ between modules")
    check_loop(case)


def print_case(case: Case, expected: list[str] | None = None) -> str:
    """The torch program of ``case``: a mismatch's with its own reference and comparison, or with
    ``expected`` (``Type@torch/x.py:function`` of the entry's exception) an exception's.
    :class:`NotPrintable` where it uses what the printers do not write yet."""
    check_printable(case, "mismatch" if expected is None else "exception")
    body: Any = case.body
    tree, training = body.tree, body.training
    comps = compositions(case)
    metamorphic = case.property == "metamorphic"
    skips, auto_wrap = bool(training.skips), any(c.auto_wrap for c in comps)
    sharded = any(api == "fully_shard" for c in comps for api, _ in c.steps())
    kind = "mismatch" if expected is None else "exception"
    pointwise = expected is not None and any(c.spmd and not c.spmd_mse_loss for c in comps)  # no F.mse_loss
    imports = [
        *([] if pointwise else ["import torch.nn.functional as F"]),
        *main_imports(kind),
        *compose_imports(comps),
    ]
    parts = ["\n".join(imports), model_source(tree, skips=skips, auto_wrap=auto_wrap)]
    parts += compose_helpers(comps, case.world_size)
    raised = [] if expected is None else [raised_line(expected)]
    build = build_lines(tree, skips=skips, auto_wrap=auto_wrap, dtype=training.dtype)
    names = ["compose", *(["compose_variant"] if metamorphic else [])]
    composes = [compose_lines(comp, name, tree) for comp, name in zip(comps, names, strict=True)]
    if expected is not None and not metamorphic:  # one composition: main builds and composes the model itself
        parts.append("\n".join(train_lines(case, observe=False, inline=(build, composes[0]))))
        return assemble([*parts, *raised, main_block(kind)])
    parts += ["\n".join(build), *("\n".join(lines) for lines in composes)]
    if expected is not None:
        parts.append("\n".join(train_lines(case, observe=False)))
        run = "for composition in (compose, compose_variant):\n        train(rank, world_size, composition)"
        parts += [*raised, f"def main(rank, world_size):\n    {run}"]
        return assemble([*parts, main_block(kind)])
    named = "model.named_parameters()"
    if any(c.wrapper is not Wrapper.NONE for c in comps):
        parts.append(f"NAMES = {param_names(tree)!r}  # the plain model's parameters\n\n\n{_NAMED_WRAPPED}")
        named = "named(model)"
    reference = "the run with the variant composition" if metamorphic else "the plain model with averaged gradients"
    parts += compare_parts(training.dtype, reference, sharded)
    parts.append("\n".join(train_lines(case, observe=True, named=named)))
    ref_fn = "compose_variant" if metamorphic else "None"
    parts.append(
        "def main(rank, world_size):  # what differs first, step by step: losses, gradients, parameters\n"
        f"    return differs(train(rank, world_size, compose), train(rank, world_size, {ref_fn}))"
    )
    return assemble([*parts, main_block(kind)])


def what(case: Case, kind: str) -> str:
    """What a printed training script does, said in its header."""
    if kind == "exception":
        both = " under both compositions" if case.property == "metamorphic" else ""
        return f"Runs the case's training{both}."
    if case.property == "metamorphic":
        return "Trains the model under one composition and under a variant that must not change the numerics."
    return (
        "Trains the composed model and, as the reference, the same plain model on the same data with its "
        "gradients all-reduced and averaged."
    )


def is_printed(script: str) -> bool:
    """Whether ``script`` was printed from its case (it has no carried harness to refresh)."""
    return PRINTED_MARK in script or "\ndef compared(" in script


def _state_printer() -> Any:
    """:mod:`fuzz.repro.print_state` (the state_dict and dcp printer), or None where it is absent."""
    try:
        from fuzz.repro import print_state  # type: ignore[attr-defined, unused-ignore]
    except ImportError as e:
        if e.name not in ("fuzz.repro.print_state", None):
            raise
        return None
    return print_state


def _check_seen(entry: Entry) -> None:
    """Raise :class:`NotPrintable` for a mismatch whose check a printed comparison does not see."""
    check = entry.signature.rpartition(":")[2]
    if entry.kind == "mismatch" and check in UNSEEN:
        raise refuse(f"a {check} mismatch (an observation inside the run)")


def printable(entry: Entry) -> bool:
    """Whether ``entry``'s script is printed from its case: a training property's by this module,
    a state_dict or dcp entry's by :mod:`fuzz.repro.print_state` (where that module is there)."""
    case = entry.case
    if case.property in ("state_dict", "dcp"):
        printer = _state_printer()
        if printer is None:
            return False
        try:
            printer.check_printable(case, entry.kind)
        except NotPrintable:
            return False
        return True
    if print_contract.is_contract_entry(entry):
        try:
            print_contract.check_printable(case, entry)
        except NotPrintable:
            return False
        return True
    if entry.kind not in KINDS or case.property not in PRINTED:
        return False
    try:
        _check_seen(entry)
        check_printable(case, entry.kind)
    except NotPrintable:
        return False
    return True


def print_entry(entry: Entry) -> str:
    """The script of ``entry`` printed from its case, from ``#!/usr/bin/env python3`` on, by the
    printer of its property; :class:`NotPrintable` naming what it does not write."""
    case = entry.case
    if case.property in ("state_dict", "dcp"):
        printer = _state_printer()
        if printer is None:
            raise refuse(f"a {case.property} case")
        script = str(printer.print_case(case, entry))
        return script if script.startswith("#!") else "#!/usr/bin/env python3\n" + script
    if print_contract.is_contract_entry(entry):
        return print_contract.print_entry(entry)
    if entry.kind not in KINDS or case.property not in PRINTED:
        raise refuse(f"a {case.property} {entry.kind}")
    _check_seen(entry)
    expected = None if entry.kind == "mismatch" else expected_raised(entry)
    body = print_case(case, expected)
    return "\n".join(["#!/usr/bin/env python3", *header(entry, what(case, entry.kind), case.world_size)]) + "\n" + body
