"""Scripts printed from the case for failures of the order, memory and activation contracts
(docs/contracts.md): a ``mismatch:<property>:contract-knobs`` entry whose message is one of
theirs gets a torch-only program that, under ``torchrun``, trains the case as the ranks do
(:mod:`fuzz.repro.print_model`, :mod:`fuzz.repro.print_train`) and records the one observation
the failed contract needs, through FSDP2's and autograd's own observation points
(:mod:`fuzz.repro.print_observe`): the all-gathers and reduce-scatters per unit through
``set_custom_all_gather`` / ``set_custom_reduce_scatter``, the unsharded bytes a unit holds,
the tensors a checkpointed region saves through ``saved_tensors_hooks``. It prints each point
observed against what the composition and the API's docstring document there, computed in the
script, and exits 1 with ``REPRODUCED:`` where the contract is broken, 0 with ``PASS:`` where it
holds, 2 where it failed another way.

Public: :data:`CONTRACTS`, :func:`failed_contract`, :func:`check_printable`,
:func:`print_entry`, :func:`is_contract_entry`.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from fuzz._rank.knobs import by_root
from fuzz.corpus import Entry
from fuzz.model import Case, Composition, ContextFn, Wrapper, contains
from fuzz.repro import print_observe as observe
from fuzz.repro.print_model import (
    PRINTED_MARK,
    NotPrintable,
    assemble,
    build_lines,
    check_composition,
    check_default,
    check_tree,
    compose_helpers,
    compose_imports,
    compose_lines,
    model_source,
    refuse,
)
from fuzz.repro.print_train import check_loop, train_lines

#: The knobs a contract script writes: the prefetch calls here, the rest by the shared printers.
KNOBS = {"forward_prefetch", "backward_prefetch", "force_sum_reduction", "gradient_divide_factor"}
KNOBS |= {"reshard_after_backward_last"}


@dataclasses.dataclass(frozen=True)
class Contract:
    """One contract a script can observe: the words of its recorder's message (``mark``), the
    recorder, the API and its docstring's rule, what the script observes."""

    name: str
    mark: str
    recorder: str
    api: str
    rule: str
    observes: str


CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "forward_prefetch",
        "set_modules_to_forward_prefetch on ",
        "fuzz/_rank/order.py",
        "set_modules_to_forward_prefetch",
        "explicitly prefetch all-gathers in forward. The prefetching runs after this module's all-gather copy-out",
        "every all-gather through set_custom_all_gather, and at each unit's forward start (a forward pre-hook "
        "behind FSDP2's) whether each prefetch target was all-gathered, holds its unsharded parameters or has "
        "an all-gather pending",
    ),
    Contract(
        "backward_prefetch",
        "set_modules_to_backward_prefetch on ",
        "fuzz/_rank/order.py",
        "set_modules_to_backward_prefetch",
        "explicitly prefetch all-gathers in backward. This overrides the default backward prefetching",
        "at each unit's backward start (a gradient hook on its output behind FSDP2's pre-backward, which "
        "prefetches) whether each prefetch target that ran forward holds its unsharded parameters or has an "
        "all-gather pending",
    ),
    Contract(
        "between_microbatches",
        "set_reshard_after_backward(False) on ",
        "fuzz/_rank/order.py",
        "set_reshard_after_backward(False) with set_is_last_backward(False)",
        "the unsharded parameters do not need to be re-all-gathered before the next forward",
        "every all-gather through set_custom_all_gather; after each backward that did not reshard, the unsharded "
        "bytes of the units it all-gathered; at each unit's first forward of the next microbatch, its all-gathers",
    ),
    Contract(
        "reduce_scatter_order",
        "reduce-scatter order: ",
        "fuzz/_rank/order.py",
        "fully_shard",
        "After gradient computation, FSDP frees the unsharded parameters and reduce-scatters the unsharded "
        "gradients (per unit, from its backward hook: a unit whose forward consumed another's output first)",
        "every reduce-scatter in backward through set_custom_reduce_scatter, and which unit's forward consumed "
        "which unit's output (the autograd graph behind each unit's inputs)",
    ),
    Contract(
        "freed_at_reduce_scatter",
        "memory: at ",
        "fuzz/_rank/order.py",
        "fully_shard, set_reshard_after_backward(True)",
        "After gradient computation, FSDP frees the unsharded parameters and reduce-scatters the unsharded gradients",
        "the unsharded bytes held (the storage of each unit's all-gather outputs) at each reduce-scatter in "
        "backward, through set_custom_reduce_scatter",
    ),
    Contract(
        "forward_bound",
        "memory: when ",
        "fuzz/_rank/memory.py",
        "fully_shard(reshard_after_forward=...), set_modules_to_forward_prefetch",
        "If True, then this reshards parameters after forward and re-all-gathers in backward. If False, then this "
        "keeps the unsharded parameters in memory after forward (prefetching: will use more reserved memory)",
        "the unsharded bytes each unit holds (the storage of its all-gather outputs) at each unit's forward start, "
        "through a forward pre-hook behind FSDP2's",
    ),
    Contract(
        "after_forward",
        "after forward with reshard_after_forward=",
        "fuzz/_rank/memory.py",
        "fully_shard(reshard_after_forward=...)",
        "If True, then this reshards parameters after forward and re-all-gathers in backward. If False, then this "
        "keeps the unsharded parameters in memory after forward",
        "the unsharded bytes each unit holds (the storage of its all-gather outputs) after its root's forward, "
        "through a forward hook behind FSDP2's",
    ),
    Contract(
        "after_backward",
        "after backward with reshard_after_backward=True",
        "fuzz/_rank/memory.py",
        "set_reshard_after_backward(True), the default",
        "Sets if the module should reshard parameters after backward",
        "the unsharded bytes each unit of a root whose backward ran holds (the storage of its all-gather "
        "outputs) after each backward that reshards, read before the next forward",
    ),
    Contract(
        "saved_inside",
        "saved for backward inside the checkpointed region",
        "fuzz/_rank/activations.py",
        "checkpoint",
        "instead of keeping tensors needed for gradient computation until they are used in gradient computation, "
        "they are recomputed",
        "every tensor saved for backward inside a checkpointed region that reaches saved_tensors_hooks entered "
        "around the model's forward (checkpoint's own are entered inside them)",
    ),
)


_CHECKPOINT = "fuzz/_rank/activations.py"
CONTRACTS += (
    Contract(
        "early_stop",
        "checkpoint early_stop=True on ",
        _CHECKPOINT,
        "checkpoint(early_stop=True), the default",
        "If True, non-reentrant checkpoint stops recomputation as soon as it has computed all needed Tensors",
        "whether each checkpointed region's forward, recomputed in backward, returns (a forward hook without "
        "always_call is called only then)",
    ),
    Contract(
        "rng",
        "checkpoint preserve_rng_state=True on ",
        _CHECKPOINT,
        "checkpoint(preserve_rng_state=True, the default; what False does is quoted)",
        "Omit stashing and restoring the RNG state during each checkpoint",
        "the CPU RNG state at each checkpointed region's forward start, and at its recomputation's start in "
        "backward (a forward pre-hook behind checkpoint's, which restores it)",
    ),
)


CONTRACTS += (
    Contract(
        "selective",
        "selective checkpoint: ",
        _CHECKPOINT,
        "create_selective_checkpoint_contexts(policy), the script's policy: matmuls MUST_SAVE, the rest "
        "PREFER_RECOMPUTE",
        "MUST_SAVE ops are saved, PREFER_RECOMPUTE ops recomputed",
        "the storage of each Linear's and elementwise activation's output inside a selectively checkpointed "
        "region, in forward and recomputed in backward (forward hooks)",
    ),
)
#: What the printed scripts say where the contract holds.
PASSED = "PASS: the contract holds at every point observed"


def is_contract_entry(entry: Entry) -> bool:
    """Whether ``entry`` is a contract failure (``mismatch:...:contract-knobs``) whose messages
    name one of :data:`CONTRACTS` (printable or not)."""
    return entry.kind == "mismatch" and entry.signature.endswith(":contract-knobs") and bool(_matches(entry))


def _problems(entry: Entry) -> list[str]:
    found = entry.details.get("problems") or [entry.summary.partition(": ")[2]]
    return [str(p) for p in found]


def _matches(entry: Entry) -> list[tuple[Contract, str]]:
    return [(c, p) for p in _problems(entry) for c in CONTRACTS if c.mark in p]


def _unprintable(contract: Contract, comp: Composition) -> str | None:
    """Why ``contract`` cannot be observed for ``comp`` by a script printed on this torch."""
    from torch.distributed.fsdp import FSDPModule

    order = contract.name in (
        "forward_prefetch",
        "backward_prefetch",
        "reduce_scatter_order",
        "freed_at_reduce_scatter",
    )
    if order and not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        return "an order contract on a torch without FSDP2's custom comm interface"
    if contract.name == "freed_at_reduce_scatter" and comp.knobs.reshard_after_backward_last:
        return "the memory at a reduce-scatter with a per-microbatch reshard_after_backward"
    for knob in ("forward_prefetch", "backward_prefetch"):
        if contract.name == knob and not getattr(comp.knobs, knob):
            return f"the {knob} contract where the case sets no {knob}"
    if contract.name == "between_microbatches" and not comp.knobs.reshard_after_backward_last:
        return "set_reshard_after_backward(False) where the case does not call it"
    if contract.recorder != _CHECKPOINT and not comp.shards:
        return f"the {contract.name} contract without fully_shard"
    if contract.recorder == _CHECKPOINT and not comp.checkpoints:
        return "a checkpoint contract without checkpoint"
    nested = any(a != b and contains(a, b) for a in comp.checkpoints for b in comp.checkpoints)
    if contract.name in ("early_stop", "rng") and nested:
        return f"the {contract.name} contract over nested checkpointed regions"
    if contract.name == "selective" and not _selective(comp):
        return "selective checkpointing over a fully_shard unit (fuzz.known.SAC_OVER_FSDP_UNIT)"
    return None


def _selective(comp: Composition) -> list[str]:
    """The selectively checkpointed regions the recorder observes: those holding no fully_shard
    unit (a known bug there)."""
    if comp.checkpoint_options.context_fn is ContextFn.NONE:
        return []
    units = [p for s in comp.shards for p in s.paths]
    return [r for r in comp.checkpoints if not any(contains(r, u) for u in units)]


def failed_contract(case: Case, entry: Entry) -> tuple[Contract, str]:
    """The first contract among ``entry``'s messages that a script can observe for ``case``, and
    the message; :class:`NotPrintable` naming the first failure otherwise."""
    matches = _matches(entry)
    if not matches:
        raise refuse(f"the contract failure {_problems(entry)[0][:80]!r}")
    body: Any = case.body
    reasons = []
    for contract, message in matches:
        reason = _unprintable(contract, body.composition)
        if reason is None:
            return contract, message
        reasons.append(reason)
    raise refuse(reasons[0])


def check_printable(case: Case, entry: Entry) -> None:
    """Raise :class:`NotPrintable` naming the first thing of ``case`` (the case of the contract
    failure ``entry``) that the contract printer does not write."""
    if entry.kind != "mismatch" or not entry.signature.endswith(":contract-knobs"):
        raise refuse(f"a {entry.kind} entry as a contract failure")
    if case.property != "parity":
        raise refuse(f"a {case.property} contract failure")
    body: Any = case.body
    comp: Composition = body.composition
    if comp.wrapper is not Wrapper.NONE:
        raise refuse(f"a contract failure under composition.wrapper={comp.wrapper.value}")
    check_tree(body.tree)
    check_default(comp.knobs, KNOBS, "composition.knobs")
    written = dataclasses.replace(comp, knobs=dataclasses.replace(comp.knobs, forward_prefetch=0, backward_prefetch=0))
    check_composition(written, "composition", knobs=True)
    check_loop(case)
    failed_contract(case, entry)


def _piece(contract: Contract, case: Case) -> observe.Piece:
    body: Any = case.body
    comp: Composition = body.composition
    if contract.name == "between_microbatches":
        return observe.between_microbatches(body.training.grad_accum)
    if contract.name == "after_backward":
        return observe.after_backward(body.training.grad_accum if comp.knobs.reshard_after_backward_last else 1)
    if contract.name == "forward_prefetch":
        return observe.forward_prefetch()
    if contract.name == "backward_prefetch":
        return observe.backward_prefetch()
    if contract.name == "reduce_scatter_order":
        return observe.reduce_scatter_order()
    if contract.name == "freed_at_reduce_scatter":
        return observe.freed_at_reduce_scatter()
    if contract.name == "forward_bound":
        resharded = {s.path: comp.reshard_after_forward(s) for s in comp.shards}
        return observe.forward_bound(resharded, bool(comp.knobs.forward_prefetch))
    if contract.name == "after_forward":
        return observe.after_forward({s.path: comp.reshard_after_forward(s) for s in comp.shards})
    if contract.name == "selective":
        return observe.selective(_selective(comp))
    if contract.name in ("early_stop", "rng"):
        return observe.recomputed(list(comp.checkpoints), contract.name)
    return observe.saved_inside(list(comp.checkpoints))


def _knobs(comp: Composition) -> tuple[list[str], list[str]]:
    """The prefetch knobs: their targets, computed from ``ROOTS`` as the composition documents
    them, and the calls of ``observed(model)`` that set them."""
    k = comp.knobs
    defs, calls = [], []
    if k.forward_prefetch:
        defs.append(
            f"AHEAD = {k.forward_prefetch}  # forward_prefetch: each unit prefetches the next AHEAD units of its root\n"
            "FORWARD_PREFETCH = {u: units[i + 1 : i + 1 + AHEAD] for units in ROOTS for i, u in enumerate(units)}"
        )
        calls += [
            "for path, targets in FORWARD_PREFETCH.items():",
            "    if targets:",
            "        UNIT[path].set_modules_to_forward_prefetch([UNIT[t] for t in targets])",
        ]
    if k.backward_prefetch:
        defs.append(
            f"BEHIND = {k.backward_prefetch}  # backward_prefetch: the BEHIND units before it (never the root)\n"
            "BACKWARD_PREFETCH = {u: units[max(1, i - BEHIND) : i][::-1] for units in ROOTS for i, u in "
            "enumerate(units)}"
        )
        calls += [
            "for path, targets in BACKWARD_PREFETCH.items():",
            "    if targets:",
            "        UNIT[path].set_modules_to_backward_prefetch([UNIT[t] for t in targets])",
        ]
    return defs, calls


def _explicit(lines: list[str], comp: Composition) -> list[str]:
    """``lines`` of ``compose`` with ``reshard_after_forward=True`` written where a unit has it,
    as the ranks call ``fully_shard`` (``fuzz/_rank/compose.py``): left out, torch 2.13's default
    (None) leaves the root unsharded after forward, which the memory contracts would read."""
    out = []
    for line in lines:
        for spec in comp.shards:
            module = "model" if spec.path == "" else f'model.get_submodule("{spec.path}")'
            call = f"fully_shard({module}"
            ends = line.strip() == f"{call})" or line.strip().startswith(f"{call}, ")
            if ends and comp.reshard_after_forward(spec) is True and "reshard_after_forward=" not in line:
                line = line[: line.rindex(")")] + ", reshard_after_forward=True)"
        out.append(line)
    return out


def _header(entry: Entry, contract: Contract, message: str, world_size: int) -> list[str]:
    from fuzz import known

    said = []
    if entry.bug:
        bug = known.get(entry.bug)
        said.append(f"Known torch bug: {bug.title}; upstream: {bug.url or bug.upstream or 'none found'}.")
    said += [
        f'Contract: {contract.api}: "{contract.rule}" (docs/contracts.md; recorder: {contract.recorder}).',
        f"The recorder saw: {message}",
        f"Observes {contract.observes}; prints each point against what the composition and that rule document there.",
        f"Run: torchrun --nproc-per-node {world_size} THIS_FILE.py. Exit 1 (REPRODUCED): the contract is broken "
        "(the first point named); 0 (PASS): it holds at every point observed; 2: it failed another way.",
    ]
    return [PRINTED_MARK, *(f"# {line}" for text in said for line in textwrap.wrap(text, 96))]


def _main_block(contract: Contract) -> str:
    return textwrap.dedent(
        f"""\
        def main(rank, world_size):
            train(rank, world_size, observed)
            microbatch_done()  # the last microbatch
            return SEEN


        if __name__ == "__main__":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU program: fully_shard without a mesh takes an accelerator's
            try:
                dist.init_process_group("gloo")
                said = [None] * dist.get_world_size()  # what each rank observed, against what is documented
                dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))
            except BaseException:
                traceback.print_exc()
                os._exit(2)  # it failed another way
            broken = [f"rank {{r}}: {{line}}" for r, seen in enumerate(said) for bad, line in seen if bad]
            if dist.get_rank() == 0:
                for bad, line in said[0]:
                    print(("broken: " if bad else "holds:  ") + line)
                if not any(said):
                    print("FAIL (the contract's points were never reached)", flush=True)
                    os._exit(2)
                print(f"{contract.name}: {{sum(map(len, said))}} points observed on {{len(said)}} ranks")
                print(f"REPRODUCED: {{broken[0]}}" if broken else "{PASSED}", flush=True)
            os._exit(1 if broken else 0 if any(said) else 2)"""
    )


def print_case(case: Case, entry: Entry) -> str:
    """The torch program observing the failed contract of ``entry`` in ``case`` (without the
    header); :class:`NotPrintable` where it uses what the printers do not write yet."""
    check_printable(case, entry)
    contract, _ = failed_contract(case, entry)
    body: Any = case.body
    comp: Composition = body.composition
    tree, training = body.tree, body.training
    skips = bool(training.skips)
    piece = _piece(contract, case)
    imports = ["import os", "import traceback", "import torch.distributed as dist", "import torch.nn.functional as F"]
    imports += [*compose_imports([comp]), *piece.imports]
    roots = [[s.path for s in units] for units in by_root(comp)]
    units = [p for group in roots for p in group]
    knob_defs, knob_calls = _knobs(comp)
    parts = ["\n".join(imports), model_source(tree, skips=skips, auto_wrap=comp.auto_wrap)]
    parts += compose_helpers([comp], case.world_size)
    parts.append("\n".join(build_lines(tree, skips=skips, auto_wrap=comp.auto_wrap, dtype=training.dtype)))
    parts.append("\n".join(_explicit(compose_lines(comp, "compose"), comp)))
    parts.append(f"ROOTS = {roots!r}  # the fully_shard units of each FSDP root, in the order their forwards start")
    parts += [*knob_defs, observe.COMMON, *observe.definitions(piece), *observe.observe_lines(piece, units, knob_calls)]
    parts.append("\n".join(train_lines(case, observe=False)))
    parts.append(_main_block(contract))
    return assemble(parts)


def print_entry(entry: Entry) -> str:
    """The script of the contract failure ``entry``, printed from its case, from
    ``#!/usr/bin/env python3`` on; :class:`NotPrintable` naming what it does not write."""
    body = print_case(entry.case, entry)
    contract, message = failed_contract(entry.case, entry)
    head = _header(entry, contract, message, entry.case.world_size)
    return "\n".join(["#!/usr/bin/env python3", *head]) + "\n" + body


__all__ = ["CONTRACTS", "Contract", "NotPrintable", "check_printable", "failed_contract", "is_contract_entry"]
__all__ += ["print_case", "print_entry"]
