"""The parts the state_dict and dcp printers share (:mod:`fuzz.repro.print_state`,
:mod:`fuzz.repro.print_dcp`): the data, the optimizers, the training loop (of the pieces
:mod:`fuzz.repro.print_train` writes), the requires_grad schedule and what a mismatch script
compares; what a script says of itself and its ``__main__`` block are :mod:`fuzz.repro.print_check`'s.

A round trip script trains a model under the source composition, moves its state into a freshly
built model under the target composition (other weights, other hyperparameters, so that a load
that does nothing shows), and trains both on over the same batches, as the rank programs do
(:mod:`fuzz._rank.state_dict`, :mod:`fuzz._rank.dcp`). Its verdict, by the entry's kind:

- an exception, a hang or a crash: the ranks run the program (:func:`fuzz.repro.print_check.main_block`;
  a crash's in a child process each, :mod:`fuzz.repro.print_crash`) up to the end of the phase
  the case failed in (:mod:`fuzz.repro.print_cut`); the target's optimizer has the source's
  hyperparameters;
- a mismatch (and a case printed without an entry): the target's optimizer has other
  hyperparameters, and the program compares the target, right after the load, with the source
  right after its state was taken (every parameter and buffer, its optimizer state and each
  group's lr, gathered in full; exactly), and both after training on (within the tolerance policy
  of :mod:`fuzz.tolerance`), and names the first that differs.

Where the sides are composed alike one ``compose`` serves both; a definition or an imported name
that nothing left reads is not printed.
"""

from __future__ import annotations

from typing import Any

from fuzz.model import Api, Case, Composition, Leaf, ModuleTree, RequiresGrad, Training, Wrapper, is_plain
from fuzz.repro.print_check import compare_parts, expected_raised, header, main_block, main_imports, raised_line
from fuzz.repro.print_crash import crash_header, crash_imports, crash_main_block, died_line
from fuzz.repro.print_cut import PHASES, cut_main, failed_phase, prune
from fuzz.repro.print_model import (
    SHARDED_FSDP1,
    assemble,
    build_lines,
    check_composition,
    check_tree,
    compose_helpers,
    compose_imports,
    compose_lines,
    model_source,
    param_names,
)
from fuzz.repro.print_train import average_lines, draw, optimizer, step_lines

#: Seed offset of the target's weights (:data:`fuzz._rank.state_dict.FRESH_SEED`, which the
#: rank side keeps; a test checks they agree).
FRESH_SEED = 0x5EED


def check_sides(tree: ModuleTree, source: Composition, target: Composition, kind: str) -> None:
    """Raise :class:`~fuzz.repro.print_model.NotPrintable` for what of the tree or a side (of an
    entry of ``kind``) is not written."""
    check_tree(tree)
    check_composition(source, "source", judged=kind == "mismatch")
    check_composition(target, "target", judged=kind == "mismatch")


def composed(comp: Composition) -> bool:
    """Whether ``comp`` makes any call (else the side is the plain model as built)."""
    return comp != Composition()


def composer(body: Any, side: str) -> str:
    """The name of the function composing ``side`` ("source", "target"): one ``compose`` where
    both sides are composed alike."""
    return "compose" if body.source == body.target else f"compose_{side}"


def side_line(name: str, body: Any, fused: bool) -> str:
    """``model = compose_source(build())`` (``target`` the target, any other name the source)."""
    side = "target" if name == "target" else "source"
    built = "fuse(build())" if fused else "build()"
    comp = body.target if side == "target" else body.source
    return f"    {name} = {composer(body, side)}({built})" if composed(comp) else f"    {name} = {built}"


def meta_side_lines(body: Any, fused: bool) -> list[str]:
    """The target built on the meta device, then composed."""
    lines = [
        '    with torch.device("meta"):  # no storage until the load',
        f"        target = {'fuse(build())' if fused else 'build()'}",
    ]
    return lines + ([f"    target = {composer(body, 'target')}(target)"] if composed(body.target) else [])


def data_lines(case: Case, tree: ModuleTree, training: Training, steps: int) -> list[str]:
    """``data``: this rank's (input, target) for ``steps`` steps (fuzz._rank.parity.batches)."""
    return [
        f"    gen = torch.Generator().manual_seed({case.seed})  # the global batches, the same on every rank",
        f"    batches = {draw(case, training, tree.width).replace('range(2)', f'range(2 * {steps})')}",
        "    data = [(x, next(batches)) for x in batches]  # (input, target) of each step",
    ]


def _trainable(tree: ModuleTree, frozen_in_optimizer: bool) -> int:
    """How many parameters the optimizer is built over (fuzz._rank.parity.make_optimizer)."""
    frozen = [p for p, n in tree.paths().items() if isinstance(n, Leaf) and n.frozen]
    names = param_names(tree)
    if frozen_in_optimizer:
        return len(names)
    return len([n for n in names if not any(n.startswith(f"{p}.") for p in frozen)])


def optimizer_lines(
    name: str, model: str, tree: ModuleTree, training: Training, body: Any, *, fresh: bool
) -> list[str]:
    """``NAME = torch.optim.X(...)`` over ``model``'s parameters (the frozen ones too where the case
    holds them in the optimizer; 2 param groups, an empty third), as
    :func:`fuzz._rank.state_dict.body_optimizer` builds it; ``fresh``: other hyperparameters."""
    frozen = any(isinstance(n, Leaf) and n.frozen for n in tree.paths().values())
    params = f"{model}.parameters()"
    lines = []
    if frozen and not body.frozen_in_optimizer:
        params = f"[p for p in {model}.parameters() if p.requires_grad]"
    lr = f"{training.lr!r}" + (" * 0.37" if fresh else "")
    if training.param_groups == 2 and _trainable(tree, body.frozen_in_optimizer) > 1:
        lines.append(f"    params = {params if params.startswith('[') else f'list({params})'}")
        lines.append('    params = [{"params": params[0::2]}, {"params": params[1::2], "lr": ' + lr + " / 2}]")
        params = "params"
    lines.append(f"    {name} = {optimizer(training, params, fresh=fresh)}")
    if body.empty_group:
        lines.append(f'    {name}.add_param_group({{"params": [], "lr": {lr} / 4}})')
    return lines


def call_lines(indent: str, head: str, args: list[str], tail: str = "") -> list[str]:
    """``head(args)tail`` on one line; where that is long, the arguments on a line of their own,
    or one argument a line."""
    one = f"{indent}{head}({', '.join(args)}){tail}"
    if len(one) <= 116:
        return [one]
    inner = f"{indent}    {', '.join(args)}"
    if len(inner) <= 116:
        return [f"{indent}{head}(", inner, f"{indent}){tail}"]
    return [f"{indent}{head}(", *(f"{indent}    {a}," for a in args), f"{indent}){tail}"]


def train_def(comps: list[Composition], training: Training) -> list[str]:
    """``def train(model, opt, batches)``: one step per batch; a plain model averages its
    gradients over the ranks by hand (``average``, where the sides differ in that)."""
    plain = [is_plain(c) for c in comps]
    mixed = len(set(plain)) > 1
    lines = [f"def train(model, opt, batches{', average' if mixed else ''}):", "    for x, y in batches:"]
    lines.append("        F.mse_loss(model(x), y).backward()")
    if any(plain):
        lines += [f"        {line}" for line in average_lines("average" if mixed else "")]
    return lines + [f"        {line}" for line in step_lines(training)]


def train_calls(
    model: str, opt: str, lo: int, hi: int, schedule: tuple[RequiresGrad, ...], average: str = ""
) -> list[str]:
    """Train ``model`` on steps ``lo`` to ``hi``, applying the requires_grad changes made before
    each of those steps (fuzz._rank.state_dict.change_requires_grad)."""
    lines = []
    start = lo
    for step in range(lo, hi):
        changes = [c for c in schedule if c.step == step]
        if not changes:
            continue
        if step > start:
            lines.append(f"    train({model}, {opt}, data[{start}:{step}]{average})")
        lines += [_requires_grad(model, c) + f"  # before step {step}" for c in changes]
        start = step
    if hi > start:
        lines.append(f"    train({model}, {opt}, data[{start}:{hi}]{average})")
    return lines


def catch_up(model: str, steps: int, schedule: tuple[RequiresGrad, ...]) -> list[str]:
    """The changes a run of ``steps`` steps made, replayed on a fresh target."""
    changes = [c for c in schedule if c.step < steps]
    return [_requires_grad(model, c) + "  # as the source is by now" for c in changes]


def _requires_grad(model: str, change: RequiresGrad) -> str:
    return f'    {model}.get_submodule("{change.path}").requires_grad_({change.trainable})'


FUSED = """\
class Fused(nn.Module):  # a leaf under a child "fused" that its state dict hides; {method} says so
    def __init__(self, leaf):
        super().__init__()
        self.fused = leaf
        self.register_state_dict_post_hook(lambda m, sd, prefix, _: m.rename(sd, prefix + "fused.", prefix))
        self.register_load_state_dict_pre_hook(lambda m, sd, prefix, *_: m.rename(sd, prefix, prefix + "fused."))

    def {method}(self):
        return {{name: "fused" for name, _ in self.fused.named_parameters()}}

    def forward(self, x):
        return self.fused(x)

    def rename(self, state_dict, old, new):
        for name in self.{method}():
            if old + name in state_dict:
                state_dict[new + name] = state_dict.pop(old + name)"""


def fused_lines(fused: tuple[str, ...], method: str) -> list[str]:
    """The ``Fused`` class and ``fuse(model)``, which puts the leaves at ``fused`` under it."""
    paths = ", ".join(repr(p) for p in fused)
    return [
        FUSED.format(method=method),
        "",
        "",
        "def fuse(model):",
        f"    for path in ({paths}{',' if len(fused) == 1 else ''}):  # the leaves built as fused modules",
        '        owner, _, name = path.rpartition(".")',
        "        model.get_submodule(owner).add_module(name, Fused(model.get_submodule(path)))",
        "    return model",
    ]


def snapshot_def(sides: list[Composition]) -> str:
    """``def snapshot(model, opt=None)``: every parameter and buffer (and the optimizer's state and
    each group's lr), gathered in full (``full``), by name: what a mismatch script compares. Where a
    side is FSDP1's, read under ``FSDP.summon_full_params`` (whole, by plain name); where one shards,
    without the optimizer's state (FSDP1 keeps this rank's flat shard of it; training on shows it)."""
    fsdp1 = any(c.wrapper is not Wrapper.NONE for c in sides)
    sharded = any(c.wrapper in SHARDED_FSDP1 for c in sides)
    lines = [
        "def snapshot(model, opt=None):  # every parameter and buffer"
        + (", each group's lr" if sharded else " (its optimizer state, each group's lr)")
        + ", in full",
        *(["    with FSDP.summon_full_params(model):  # whole, by plain name"] if fsdp1 else []),
        f"    {'    ' * fsdp1}out = {{n: full(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}}",
    ]
    if not sharded:
        lines += [
            "    for name, p in model.named_parameters() if opt is not None else ():",
            '        out.update({f"{name} {k}": full(t) for k, t in opt.state.get(p, {}).items() if torch.is_tensor(t)})',  # noqa: E501
        ]
    lines += [
        '    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})',  # noqa: E501
        "    return out",
    ]
    return "\n".join(lines)


def round_trip(case: Case, entry: Any, body: Any, *, imports: list[str], extra: list[str], main: list[str]) -> str:
    """The script of a round trip ``case`` (of ``entry``, None: judged as a mismatch): the model,
    its sides' compositions, ``extra`` definitions, ``train``, what a mismatch compares, ``main``
    (its lines) and the ``__main__`` block, below the header saying ``what`` it does."""
    kind = "mismatch" if entry is None else entry.kind
    sides, t = [body.source, body.target], body.training
    wrap = any(c.auto_wrap for c in sides)
    checks = crash_imports() if kind == "crash" else main_imports(kind)
    head = ["import torch.nn.functional as F", *checks, *compose_imports(sides), *imports]
    parts = [model_source(body.tree, auto_wrap=wrap), *extra]
    parts += [
        "\n".join(build_lines(body.tree, auto_wrap=wrap, dtype=t.dtype)),
        *compose_helpers(sides, case.world_size),
    ]
    names = [composer(body, "source"), composer(body, "target")]
    parts += list(
        dict.fromkeys("\n".join(compose_lines(c, n)) for c, n in zip(sides, names, strict=True) if composed(c))
    )
    parts.append("\n".join(train_def(sides, t)))
    if kind == "mismatch":
        parts += [*compare_parts(t.dtype, "the source", any(c.shards for c in sides)), snapshot_def(sides)]
    elif kind == "exception":
        parts.append(raised_line(expected_raised(entry)))
    elif kind == "crash":
        parts.append(died_line(entry))
    main, cut = cut_main(main, entry)
    kept = ["\n".join(main), crash_main_block() if kind == "crash" else main_block(kind)]
    head, parts = prune(head, parts, kept)
    script = assemble(["\n".join(head), *parts, *kept])
    what = _what(case, body, failed_phase(entry) if cut else None)
    said = (crash_header if kind == "crash" else header)(entry, what, case.world_size)
    return "\n".join(["#!/usr/bin/env python3", *said, script])


def _what(case: Case, body: Any, phase: str | None) -> str:
    """What a round trip script does, said in its header (up to ``phase``, where it ends there)."""
    if case.property == "dcp":
        steps = [
            "Trains a model",
            "saves its state with dcp.save into a fresh directory",
            "loads it with dcp.load into a freshly built one",
            "trains both on",
        ]
    else:
        steps = [
            "Trains a model",
            f"takes its state through {_CALLS[body.api]}",
            "loads it into a freshly built one in memory",
            "trains both on",
        ]
    if phase is None:
        return f"{', '.join(steps[:-1])} and {steps[-1]}."
    done = steps[: PHASES.index(phase) + 1]
    said = f"{', '.join(done[:-1])} and {done[-1]}" if len(done) > 1 else done[0]
    return f"{said}: the case fails there (what would follow is not printed)."


_CALLS = {
    Api.SPLIT: "get/set_model_state_dict and get/set_optimizer_state_dict",
    Api.COMBINED: "get_state_dict / set_state_dict",
    Api.MODULE: "FSDP2's own state_dict / load_state_dict and get/set_optimizer_state_dict",
    Api.FSDP1: "FSDP1's state_dict_type, FSDP.optim_state_dict and FSDP.optim_state_dict_to_load",
}
