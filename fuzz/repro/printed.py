"""Scripts printed from the case: a parity or metamorphic mismatch as the torch program it is.

Where the reducer (:mod:`fuzz.repro.reduce`) cuts a generic program (the rank side's modules)
down to one case, this module writes that case's program directly, as a maintainer would:

- the tree as plain module code (``nn.Linear``, ``nn.LayerNorm``, a one-tap ``Conv``, a
  ``Block`` with only the features the tree uses, else ``nn.Sequential``), built under the
  case's seed as the ranks build it, so the weights are the pool's;
- the composition calls the case makes, in the order it makes them (:meth:`Composition.steps`);
- the training (the case's optimizer, steps, microbatches, gradient-sync switches, modules left
  out of forward, leaves unfrozen between steps), on each rank's slice of batches drawn from a
  generator seeded by the case;
- the reference computed in the same script: for ``parity`` the plain model trained on the same
  data with its gradients all-reduced and averaged (data-parallel training with nothing to get
  wrong), for ``metamorphic`` the same training under the variant composition;
- the comparison, step by step, with the tolerance policy of :mod:`fuzz.tolerance`: each
  microbatch's loss on every rank, then each parameter's gradient, then each parameter after
  the step. The first tensor outside the tolerance is named at run time (which loss, gradient
  or parameter, step, microbatch, rank, the value against the reference's, how many elements
  differ, and the factor between them where it is a clean one). No expected value is written
  in the script.

Exit status (as :mod:`fuzz.repro.harness`'s): 1 where a tensor differs (``REPRODUCED``), 0 where
none does (rank 0 prints ``PASS``), 2 where the script cannot run here or the case fails
another way (an exception). A case this module cannot print yet (a leaf kind, a composition
field, a training field it does not write) raises :class:`fuzz.errors.InvalidArgument` naming
it, rather than printing a program that is not the case's.
"""

from __future__ import annotations

from typing import Any

from fuzz.corpus import Entry
from fuzz.model import AccumSync, Case, Compile, Dtype, Layout, ModuleTree, Optimizer, Training, Wrapper
from fuzz.repro.print_model import (
    PRINTED_MARK,
    NotPrintable,
    build_lines,
    check_composition,
    check_default,
    check_tree,
    compose_imports,
    compose_lines,
    model_source,
    param_names,
    refuse,
)
from fuzz.tolerance import tolerance_for

#: The properties whose mismatches are printed.
PRINTED = ("parity", "metamorphic")
#: Training fields a printed script writes.
_TRAINING_FIELDS = {
    "optimizer",
    "lr",
    "momentum",
    "eps",
    "steps",
    "batch_per_rank",
    "dtype",
    "grad_accum",
    "accum_sync",
    "set_to_none",
    "same_input",
    "skips",
    "unfreeze",
    "foreach",
}


def check_printable(case: Case) -> None:
    """Raise :class:`NotPrintable` naming the first thing of ``case`` this module does not write."""
    body: Any = case.body
    if case.property not in PRINTED:
        raise refuse(f"a {case.property} case")
    check_tree(body.tree)
    check_composition(body.composition, "composition", knobs=case.property == "parity")
    if case.property == "parity" and len(set(_scales(case).values())) > 1:
        raise refuse("gradient scales that differ between modules")
    if case.property == "metamorphic":
        check_composition(body.variant, "variant")
    training: Training = body.training
    check_default(training, _TRAINING_FIELDS, "training")
    if training.compile is not Compile.NONE:
        raise refuse("training.compile")
    if training.accum_sync is not AccumSync.ALWAYS and training.grad_accum > 1:
        for comp in (body.composition, *([body.variant] if case.property == "metamorphic" else [])):
            if "" not in {s.path for s in comp.shards}:
                raise refuse("a gradient-sync switch without fully_shard on the root")


def _scales(case: Case) -> dict[str, float]:
    """Per module path holding parameters: what the composition's knobs scale its averaged
    gradient by, as documented (:meth:`fuzz.model.Layout.gradient_scale`)."""
    body: Any = case.body
    layout = Layout(body.tree, body.composition)
    return {path: layout.gradient_scale(path, case.world_size) for path in layout.paths}


def _optimizer(training: Training) -> str:
    foreach = "" if training.foreach is None else f", foreach={training.foreach}"
    if training.optimizer is Optimizer.SGD:
        extra = f", momentum={training.momentum!r}" if training.momentum else ""
        return f"torch.optim.SGD(params, lr={training.lr!r}{extra}{foreach})"
    name = "Adam" if training.optimizer is Optimizer.ADAM else "AdamW"
    return f"torch.optim.{name}(params, lr={training.lr!r}, eps={training.eps!r}{foreach})"


def _train(case: Case, training: Training, sharded: bool, metamorphic: bool) -> list[str]:
    """``train(model, rank, world_size, composed)``: what each step saw (losses, gradients,
    parameters after the step), full tensors; the reference averages its gradients itself."""
    tree: ModuleTree = case.body.tree  # type: ignore[attr-defined]
    b, w = training.batch_per_rank, tree.width
    dtype = ", dtype=torch.float64" if training.dtype is Dtype.FLOAT64 else ""
    lo = "0" if training.same_input else "rank * " + str(b)
    later = [u.path for u in training.unfreeze]
    uses_micro = bool(training.skips) or (training.grad_accum > 1 and training.accum_sync is not AccumSync.ALWAYS)
    lines = ["def train(model, rank, world_size, composed):"]
    if later:
        held = ", ".join(f'"{p}": [q for n, q in named(model).items() if n.rpartition(".")[0] == "{p}"]' for p in later)
        lines += ["    # frozen now, unfrozen later: the optimizer holds them", f"    later = {{{held}}}"]
        lines += ["    held = [q for ps in later.values() for q in ps]"]
        lines += ["    params = [p for p in model.parameters() if p.requires_grad or any(p is q for q in held)]"]
    else:
        lines += ["    params = [p for p in model.parameters() if p.requires_grad]"]
    lines += [
        f"    opt = {_optimizer(training)}",
        f"    gen = torch.Generator().manual_seed({case.seed})",
        "    seen = []",
        f"    for {'step' if training.unfreeze or uses_micro else '_'} in range({training.steps}):",
    ]
    for u in training.unfreeze:
        lines += [f"        if step == {u.step}:", f'            for p in later["{u.path}"]:']
        lines += ["                p.requires_grad_(True)"]
    lines += ["        losses = []", f"        for {'micro' if uses_micro else '_'} in range({training.grad_accum}):"]
    lines += [
        f"            x = torch.randn(world_size * {b}, {w}, generator=gen{dtype})[{lo} :][:{b}]",
        f"            y = torch.randn(world_size * {b}, {w}, generator=gen{dtype})[{lo} :][:{b}]",
    ]
    if training.skips:
        table: dict[tuple[int, int], list[str]] = {}
        for s in training.skips:
            table.setdefault((s.step, s.microbatch), []).append(s.path)
        lines += [
            f"            skipped = {table!r}.get((step, micro), [])",
            "            for name, block in model.named_modules():",
            "                if isinstance(block, Block):",
            '                    block.skipped = {p.rpartition(".")[2] for p in skipped if p.rpartition(".")[0] == name}',  # noqa: E501
        ]
    if training.grad_accum > 1 and training.accum_sync is not AccumSync.ALWAYS:
        switch = {
            AccumSync.NO_GRAD_SYNC: "set_requires_gradient_sync",
            AccumSync.NO_ALL_REDUCE: "set_requires_all_reduce",
        }[training.accum_sync]
        lines += ["            if composed:", f"                model.{switch}(micro == {training.grad_accum - 1})"]
    lines += [
        "            loss = F.mse_loss(model(x), y)",
        "            loss.backward()",
        "            losses.append(loss.item())",
    ]
    if not metamorphic:
        lines += [
            "        if not composed:  # the reference: gradients averaged over the ranks",
            "            for p in model.parameters():",
            "                if p.grad is not None:",
            "                    dist.all_reduce(p.grad)",
            "                    p.grad /= world_size",
        ]
        factor = case.body.composition.knobs.gradient_divide_factor  # type: ignore[attr-defined]
        if factor is not None and set(_scales(case).values()) != {1.0}:
            d = case.world_size
            lines.append(
                f"                    p.grad *= {d} / {factor!r}  # documented: the sum over {d} ranks / {factor!r}"
            )
    lines += [
        "        grads = {n: full(p.grad) for n, p in named(model).items()}",
        "        opt.step()",
        f"        opt.zero_grad(set_to_none={training.set_to_none})",
        "        seen.append((losses, grads, {n: full(p) for n, p in named(model).items()}))",
        "    return seen",
    ]
    return lines


_NAMED_PLAIN = """\
def named(model):
    return dict(model.named_parameters())"""

_NAMED_WRAPPED = """\
def named(model):
    \"\"\"Every parameter by its plain name (NAMES), read off its module through FSDP1's wrappers,
    which leave some out of named_parameters() (pytorch/pytorch#85831).\"\"\"
    modules = {".".join(c for c in n.split(".") if c != "_fsdp_wrapped_module"): m for n, m in model.named_modules()}
    return {n: getattr(modules[n.rpartition(".")[0]], n.rpartition(".")[2]) for n in NAMES}"""

_FULL_SHARDED = """\
def full(t):  # gathered where fully_shard shards it
    return None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()"""

_FULL_PLAIN = """\
def full(t):
    return None if t is None else t.detach().clone()"""

_COMPARE = """\
def differs(what, got, want):
    \"\"\"Why ``got`` is not ``want`` within the tolerance, or None (no gradient counts as zeros).\"\"\"
    if got is None and want is None:
        return None
    got = (torch.zeros_like(want) if got is None else got).double()
    want = (torch.zeros_like(got) if want is None else want).double()
    over = (got - want).abs() - (ATOL + RTOL * want.abs())
    if not bool((over > 0).any()):
        return None
    i = int(over.flatten().argmax())
    said = f"{what}: {float(got.flatten()[i]):.9g} where {REFERENCE} has {float(want.flatten()[i]):.9g}"
    said += f" (element {i}; {int((over > 0).sum())} of {over.numel()} outside rtol={RTOL}, atol={ATOL})"
    factors = [f for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(got, f * want, rtol=1e-4, atol=ATOL)]
    return said + "".join(f": {f:.4g} times {REFERENCE}'s" for f in factors[:1])


def compared(got, want, losses):
    \"\"\"(what, value, reference) in the order training computes them: every rank's losses, then each
    parameter's gradient, then each parameter after the step, step by step.\"\"\"
    for step, ((_, got_grads, got_params), (_, grads, params)) in enumerate(zip(got, want, strict=True)):
        for rank, (mine, theirs) in enumerate(losses):
            for micro, (a, e) in enumerate(zip(mine[step], theirs[step], strict=True)):
                yield f"loss of rank {rank} at step {step}, microbatch {micro}", torch.tensor([a]), torch.tensor([e])
        yield from ((f"gradient of {n} at step {step}", got_grads[n], grads[n]) for n in grads)
        yield from ((f"{n} after step {step}", got_params[n], params[n]) for n in params)"""

_MAIN = """\
def main():
    import os
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import sys
    import traceback
    if os.environ.get("WORLD_SIZE") != "{world_size}":
        print("run it with: torchrun --nproc-per-node {world_size} " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        got, want = run(rank, world_size, {composed}), run(rank, world_size, {reference})
        losses = [None] * world_size
        dist.all_gather_object(losses, ([s[0] for s in got], [s[0] for s in want]))
        verdict = [next(filter(None, (differs(*c) for c in compared(got, want, losses))), None)]
        dist.broadcast_object_list(verdict, src=0)
    except Exception as e:
        traceback.print_exc()
        print(f"FAIL (the case failed another way): rank {{rank}} raised {{type(e).__name__}}: {{e}}", flush=True)
        os._exit(2)
    if rank == 0:
        print(f"REPRODUCED: {{verdict[0]}}" if verdict[0] else "PASS: every loss, gradient and parameter agrees")
    sys.stdout.flush()
    os._exit(1 if verdict[0] else 0)


if __name__ == "__main__":
    main()"""


def print_case(case: Case) -> str:
    """The torch program of ``case`` (a parity or metamorphic case) with its own reference and
    check; :class:`NotPrintable` where it uses what this module does not write yet."""
    check_printable(case)
    body: Any = case.body
    tree: ModuleTree = body.tree
    training: Training = body.training
    metamorphic = case.property == "metamorphic"
    comps = [body.composition, *([body.variant] if metamorphic else [])]
    api = {api for comp in comps for api, _ in comp.steps()}
    skips = bool(training.skips)
    auto_wrap = any(c.auto_wrap for c in comps)
    tol = tolerance_for(training.dtype.value)
    imports = [
        "import torch",
        "import torch.distributed as dist",
        "import torch.nn.functional as F",
        "from torch import nn",
        *compose_imports(comps),
        *(["from torch.distributed.tensor import DTensor"] if "fully_shard" in api else []),
    ]
    reference = "the run with the variant composition" if metamorphic else "the plain model with averaged gradients"
    parts = [
        "\n".join(imports),
        f"RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # the tolerance policy for {training.dtype.value}\n"
        f"REFERENCE = {reference!r}",
    ]
    parts += model_source(tree, skips=skips, auto_wrap=auto_wrap).split("\n\n\n")[1:]
    parts.append("\n".join(build_lines(tree, skips=skips, auto_wrap=auto_wrap, dtype=training.dtype)))
    parts.append("\n".join(compose_lines(body.composition, "compose")))
    if metamorphic:
        parts.append("\n".join(compose_lines(body.variant, "compose_variant")))
    wrapped = any(comp.wrapper is not Wrapper.NONE for comp in comps)
    if wrapped:
        names = ", ".join(repr(n) for n in param_names(tree))
        parts.append(f"NAMES = [{names}]  # the plain model's parameters\n\n\n" + _NAMED_WRAPPED)
    else:
        parts.append(_NAMED_PLAIN)
    parts.append(_FULL_SHARDED if "fully_shard" in api else _FULL_PLAIN)
    parts.append("\n".join(_train(case, training, "fully_shard" in api, metamorphic)))
    run = [
        "def run(rank, world_size, compose=None):",
        f"    torch.manual_seed({case.seed})  # every rank builds the same weights",
        "    model = build()",
        "    if compose is not None:",
        "        model = compose(model)",
        f"    return train(model, rank, world_size, composed={'True' if metamorphic else 'compose is not None'})",
    ]
    parts.append("\n".join(run))
    parts.append(_COMPARE)
    composed, ref = ("compose", "compose_variant") if metamorphic else ("compose", "None")
    parts.append(_MAIN.format(world_size=case.world_size, composed=composed, reference=ref))
    return "\n\n\n".join(parts) + "\n"


def comments(entry: Entry) -> list[str]:
    """What a printed script says of itself, as comments: the bug, what it compares, how to run
    it and what its exit status means. Nothing the pool observed: the script computes that."""
    import textwrap

    from fuzz import known
    from fuzz.repro.script import upstream_of

    case = entry.case
    said = []
    if entry.bug:
        upstream, url = upstream_of(entry)
        said.append(f"Known torch bug: {known.get(entry.bug).title}; upstream: {url or upstream or 'none found'}.")
    if case.property == "metamorphic":
        said.append(
            "Trains the model under one composition and under a variant that must not change the numerics, "
            "and names the first loss, gradient or parameter that differs (the tolerance policy below)."
        )
    else:
        said.append(
            "Trains the composed model and, as the reference, the same plain model on the same data with its "
            "gradients all-reduced and averaged, and names the first loss, gradient or parameter that differs "
            "(the tolerance policy below)."
        )
    said.append(
        f"Run: torchrun --nproc-per-node {case.world_size} THIS_FILE.py: rank 0 prints REPRODUCED and every rank "
        "exits 1 while the bug is there; rank 0 prints PASS and they exit 0 once it is gone; a rank exits 2 where "
        "the script cannot run (not under torchrun, another world size) or the case fails another way."
    )
    return [f"# {line}" for text in said for line in textwrap.wrap(text, 96)]


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


def printable(entry: Entry) -> bool:
    """Whether ``entry``'s script is printed from its case: a training property's by this module,
    a state_dict or dcp entry's by :mod:`fuzz.repro.print_state` (where that module is there)."""
    case = entry.case
    if case.property in ("state_dict", "dcp"):
        printer = _state_printer()
        if printer is None:
            return False
        try:
            printer.check_printable(case)
        except NotPrintable:
            return False
        return True
    if entry.kind != "mismatch" or case.property not in PRINTED:
        return False
    try:
        check_printable(case)
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
    if entry.kind != "mismatch":
        raise refuse(f"a {case.property} {entry.kind}")
    return "\n".join(["#!/usr/bin/env python3", *comments(entry)]) + "\n\n" + print_case(case)
