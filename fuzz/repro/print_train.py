"""The training half of a printed script (:mod:`fuzz.repro.printed`): ``train(rank,
world_size, compose)``, the case's training as the ranks run it (:mod:`fuzz._rank.parity`).

The model is built under the case's seed and composed (``compose`` None: the plain model, the
parity reference, which averages its gradients over the ranks itself); each rank trains on its
slice of batches drawn from a generator seeded by the case, with the case's optimizer, steps,
microbatches, gradient-sync switch, modules left out of forward and leaves unfrozen between
steps. Where the script compares (a mismatch), ``train`` returns what each step saw: the
losses, the full gradients and the full parameters after the step, by parameter name.
"""

from __future__ import annotations

from typing import Any

from fuzz.model import AccumSync, Case, Compile, Composition, Dtype, Layout, LeafKind, Optimizer, Training, Wrapper
from fuzz.repro.print_model import SHARDED_FSDP1, batch_placements, check_default, mesh_line, refuse, uses

#: Training fields every printed script writes (the optimizer, the steps and the data); every
#: other must hold its default.
TRAINING_FIELDS = {
    "optimizer",
    "lr",
    "momentum",
    "eps",
    "steps",
    "batch_per_rank",
    "dtype",
    "same_input",
    "set_to_none",
    "param_groups",
}
#: Those the training properties' loop (:func:`train_lines`) writes besides: microbatches, a
#: gradient-sync switch, modules left out of forward, leaves unfrozen later, foreach.
LOOP_FIELDS = {"grad_accum", "accum_sync", "skips", "unfreeze", "foreach", "compile"}
#: The first forward of a compiled run is under forward pre-hooks that are removed after it, as
#: the pool's is (it records dtypes there): the next forward is compiled again, which some bugs
#: need (FSDP1's sharded gradients met by a recompilation).


def compositions(case: Case) -> list[Composition]:
    """The compositions ``case`` trains under: its own, and a metamorphic case's variant."""
    body: Any = case.body
    return [body.composition, *([body.variant] if case.property == "metamorphic" else [])]


def scales(case: Case) -> dict[str, float]:
    """Per module path holding parameters: what the composition's knobs scale its averaged
    gradient by, as documented (:meth:`fuzz.model.Layout.gradient_scale`)."""
    body: Any = case.body
    layout = Layout(body.tree, body.composition)
    return {path: layout.gradient_scale(path, case.world_size) for path in layout.paths}


def check_training(training: Training, *, loop: bool = True) -> None:
    """Raise :class:`~fuzz.repro.print_model.NotPrintable` naming the first training field a
    printed script does not write (``loop``: the training properties' loop, :func:`train_lines`,
    which writes :data:`LOOP_FIELDS` too)."""
    check_default(training, TRAINING_FIELDS | (LOOP_FIELDS if loop else set()), "training")


def check_loop(case: Case) -> None:
    """Raise :class:`~fuzz.repro.print_model.NotPrintable` naming the first training field (or
    use of one) :func:`train_lines` does not write."""
    training: Training = case.body.training  # type: ignore[attr-defined]
    check_training(training)
    if training.skips and any(c.wrapper is not Wrapper.NONE for c in compositions(case)):
        raise refuse("training.skips under a wrapper")
    switched = training.grad_accum > 1 and training.accum_sync is not AccumSync.ALWAYS
    last = any(c.knobs.reshard_after_backward_last for c in compositions(case))
    meshed = [c for c in compositions(case) if c.tp or c.spmd]
    dropout = uses(case.body.tree, lambda n: getattr(n, "kind", None) is LeafKind.DROPOUT)  # type: ignore[attr-defined]
    if meshed and (case.property == "metamorphic" or training.skips or training.unfreeze or dropout):
        raise refuse("tensor parallelism or SPMD with a variant, skips, unfreezing or dropout")
    for comp in compositions(case):
        if (switched or last) and "" not in {s.path for s in comp.shards}:
            raise refuse("a gradient-sync switch or a per-microbatch knob without fully_shard on the root")


def optimizer(training: Training, params: str, *, fresh: bool = False) -> str:
    """``torch.optim.X(PARAMS, lr=...)``: the case's optimizer (:func:`fuzz._rank.parity.make_optimizer`)
    over ``params``; ``fresh``: with other hyperparameters, which a load must bring back
    (:func:`fuzz._rank.state_dict.fresh_training`)."""
    lr = f"{training.lr!r} * 0.37" if fresh else repr(training.lr)
    foreach = "" if training.foreach is None else f", foreach={training.foreach}"
    if training.optimizer is Optimizer.SGD:
        momentum = ("0.5" if fresh else repr(training.momentum)) if training.momentum else ""
        extra = f", momentum={momentum}" if momentum else ""
        return f"torch.optim.SGD({params}, lr={lr}{extra}{foreach})"
    name = "Adam" if training.optimizer is Optimizer.ADAM else "AdamW"
    eps = f"{training.eps!r} * 10" if fresh else repr(training.eps)
    return f"torch.optim.{name}({params}, lr={lr}, eps={eps}{foreach})"


def draw(case: Case, training: Training, width: int, tp_size: int = 1) -> str:
    """This rank's (input, target) of one step or microbatch, drawn from ``gen``
    (:func:`fuzz._rank.parity.batches`; a tensor-parallel group's ``tp_size`` ranks share theirs)."""
    b = training.batch_per_rank
    dtype = ", dtype=torch.float64" if training.dtype is Dtype.FLOAT64 else ""
    r = "rank" if tp_size == 1 else f"(rank // {tp_size})"
    lo = "0" if training.same_input else (r if b == 1 else f"{r} * {b}")
    rows = "world_size" if b == 1 else f"world_size * {b}"
    return f"(torch.randn({rows}, {width}, generator=gen{dtype})[{lo} :][:{b}] for _ in range(2))"


def average_lines(condition: str = "") -> list[str]:
    """A plain model's data parallelism by hand, where ``condition`` holds: its gradients averaged
    over the ranks (the parity reference; a plain side of a round trip)."""
    only = f"{condition} and " if condition else ""
    return [
        f"for p in [p for p in model.parameters() if {only}p.grad is not None]:",
        "    dist.all_reduce(p.grad)  # a plain model, data-parallel by hand: gradients averaged",
        "    p.grad /= dist.get_world_size()",
    ]


def step_lines(training: Training) -> list[str]:
    """The optimizer's step and zeroing of the gradients."""
    return ["opt.step()", "opt.zero_grad()" if training.set_to_none else "opt.zero_grad(set_to_none=False)"]


def spmd_lines(comp: Composition, world_size: int, observe: bool) -> list[str]:
    """One microbatch of an SPMD program (:func:`fuzz._rank.compose.spmd_backward`): this rank's
    rows as its part of the global batch, backward from the sum of the ranks' mean losses (whose
    gradient fully_shard averages); with ``observe`` this rank's loss as ``loss``."""
    batch = batch_placements(comp)
    shards = world_size // comp.tp_size
    lines = [f"out = model(DTensor.from_local(x, mesh, {batch}))  # this rank's rows of the global batch"]
    if comp.spmd_mse_loss:
        lines += [
            f"target = DTensor.from_local(y, mesh, {batch})",
            f"(F.mse_loss(out, target) * {shards}).backward()  # the global mean, times the {shards} shards",
        ]
    else:
        lines += [
            f"err = out - DTensor.from_local(y, mesh, {batch})",
            "(err * err).sum().div(y.numel()).backward()  # the sum of the ranks' mean losses",
        ]
    if observe:
        lines.append(f"loss = F.mse_loss(out.detach().redistribute(mesh, {batch}).to_local(), y)")
    return lines


def _inline(build: list[str], compose: list[str]) -> list[str]:
    """The body of ``build()`` then of ``compose(model)``, as statements on ``model`` in ``train``."""
    model = [line.replace("    return ", "    model = ", 1) for line in build[1:]]
    calls = [line.replace("return FSDP(", "model = FSDP(") for line in compose[1:] if line != "    return model"]
    return model + calls


def _whole(lines: list[str], args: str) -> list[str]:
    """``lines`` under ``FSDP.summon_full_params(ARGS)``: FSDP1's sharded parameters (and gradients)
    read whole, on every rank (a plain model has nothing to gather)."""
    return [f"with FSDP.summon_full_params({args}):  # whole, not this rank's shard", *(f"    {x}" for x in lines)]


def _loop(var: str, count: int, body: list[str]) -> list[str]:
    """``for VAR in range(COUNT):`` around ``body``, or ``body`` alone where it runs once and needs no ``VAR``."""
    if count == 1 and var == "_":
        return body
    return [f"for {var} in range({count}):", *(f"    {line}" for line in body)]


def train_lines(
    case: Case,
    *,
    observe: bool,
    named: str = "model.named_parameters()",
    inline: tuple[list[str], list[str]] | None = None,
) -> list[str]:
    """``def train(rank, world_size, compose):``; with ``observe`` it returns what each step saw
    by name, in the order training computes it (each microbatch's loss, each gradient, each
    parameter after the step), read through ``named`` (an expression of ``model``
    giving (name, parameter) pairs) and gathered by ``full``. With ``inline`` (the lines of
    ``build`` and of ``compose``) it is ``train(rank, world_size)`` building and composing the
    model itself, the script's ``main``."""
    body: Any = case.body
    training: Training = body.training
    tree = body.tree
    parity = case.property != "metamorphic"
    steps, micros = training.steps, training.grad_accum
    switched = micros > 1 and training.accum_sync is not AccumSync.ALWAYS
    last_knob = any(c.knobs.reshard_after_backward_last for c in compositions(case))
    wrapped = any(c.wrapper is not Wrapper.NONE for c in compositions(case))
    by_step = bool(training.skips or training.unfreeze) or (observe and steps > 1)
    at = "{step}" if by_step else "0"  # the step a name says
    by_micro = bool(training.skips) or switched or last_knob or (observe and micros > 1)
    table: dict[tuple[int, int], list[str]] = {}
    for s in training.skips:
        table.setdefault((s.step, s.microbatch), []).append(s.path)
    skips = [f"SKIPS = {table!r}  # (step, microbatch): the modules left out of forward then"] if table else []
    meshed = next((c for c in compositions(case) if c.tp or c.spmd), None)
    lines = [] if meshed is None else [mesh_line(meshed, case.world_size)]
    lines += [f"torch.manual_seed({case.seed})  # every rank builds the same weights"]
    if inline is not None:
        lines += [line.removeprefix("    ") for line in _inline(*inline)]
    else:
        args = "build()" if meshed is None else "build(), mesh"
        build = f"build() if compose is None else compose({args})" if observe and parity else f"compose({args})"
        lines += [f"model = {build}"]
    if training.compile is not Compile.NONE:  # the suite's first forward runs under hooks that record dtypes
        compiled = f'torch.compile(model, backend="{training.compile.value}")'
        hooks = "[m.register_forward_pre_hook(lambda *_: None) for m in model.modules() if list(m.parameters(0))]"
        if observe and parity:  # the reference runs eagerly
            compiled = f"model if compose is None else {compiled}"
        lines += [f"forward = {compiled}", f"hooks = {hooks}"]
    params = "model.parameters()"  # an optimizer skips the parameters without a gradient
    frozen = uses(tree, lambda n: getattr(n, "frozen", False))
    if training.param_groups == 2:
        if frozen and not training.unfreeze:
            lines += ["params = [p for p in model.parameters() if p.requires_grad]"]
        else:
            lines += ["params = list(model.parameters())"]
        lines += [f'params = [{{"params": params[0::2]}}, {{"params": params[1::2], "lr": {training.lr!r} / 2}}]']
        params = "params"
    lines += [f"opt = {optimizer(training, params)}"]
    lines += [f"gen = torch.Generator().manual_seed({case.seed})"]
    if uses(tree, lambda n: getattr(n, "kind", None) is LeafKind.DROPOUT):
        lines += [f"torch.manual_seed({case.seed * 7919 + 1} + rank)  # dropout: the same masks on both runs of a rank"]
    if observe:
        lines += ["seen = {}  # every loss, gradient and parameter after the step, by name, in order"]
    if training.unfreeze:  # the parameters as built: the optimizer holds them, whatever the module holds later
        held = {
            u.path: f'[q for n, q in {named} if n.rpartition(".")[0] == "{u.path}"]'
            if wrapped
            else f'list(model.get_submodule("{u.path}").parameters())'
            for u in training.unfreeze
        }
        lines += ["later = {" + ", ".join(f'"{p}": {h}' for p, h in held.items()) + "}  # frozen now, unfrozen later"]
    step = []
    for u in training.unfreeze:
        step += [f"if step == {u.step}:", f'    for p in later["{u.path}"]:', "        p.requires_grad_(True)"]
    tp_size = 1 if meshed is None else meshed.tp_size
    micro = [f"x, y = {draw(case, training, tree.width, tp_size)}"]
    if training.skips:
        micro += ["SKIPPED[:] = [model.get_submodule(p) for p in SKIPS.get((step, micro), [])]"]
    last = micros - 1
    per_micro = []
    if switched:
        switch = {
            AccumSync.NO_GRAD_SYNC: "set_requires_gradient_sync",
            AccumSync.NO_ALL_REDUCE: "set_requires_all_reduce",
        }
        per_micro.append(f"model.{switch[training.accum_sync]}(micro == {last})")
    if last_knob:
        per_micro += [
            f"model.set_reshard_after_backward(micro == {last})",
            f"model.set_is_last_backward(micro == {last})",
        ]
    if per_micro and observe and parity:
        micro += ["if compose is not None:", *(f"    {line}" for line in per_micro)]
    else:
        micro += per_micro
    mp = any(s.mixed_precision is not None for c in compositions(case) for s in c.shards)
    forward = "model" if training.compile is Compile.NONE else "forward"
    out = f"{forward}(x).to(y.dtype)" if mp else f"{forward}(x)"
    spmd = [] if meshed is None or not meshed.spmd else spmd_lines(meshed, case.world_size, observe)
    if observe:
        plain = [f"loss = F.mse_loss({out}, y)", "loss.backward()"]
        if spmd:
            plain = ["if compose is None:", *(f"    {x}" for x in plain), "else:", *(f"    {x}" for x in spmd)]
        key = f"loss at step {at}, microbatch {{micro}}" if by_micro else f"loss at step {at}"
        micro += [*plain, f'seen[{"f" * ("{" in key)}"{key}"] = loss.detach()']
    else:
        micro += spmd or [f"F.mse_loss({out}, y).backward()"]
    if training.compile is not Compile.NONE:
        micro += [
            "while hooks:  # removed after the first forward: the next one is compiled again",
            "    hooks.pop().remove()",
        ]
    step += _loop("micro" if by_micro else "_", micros, micro)
    local = sorted(body.composition.shard_ignored) if parity else []
    if observe and parity and local:
        mine = " | ".join(f'set(model.get_submodule("{p}").parameters(recurse=False))' for p in local)
        lines += [f"ignored = {mine}  # fully_shard's ignored_params: each rank's own"]
    if observe and parity:
        step += average_lines("compose is None and p not in ignored" if local else "compose is None")
        factor = body.composition.knobs.gradient_divide_factor
        if factor is not None and set(scales(case).values()) != {1.0}:
            d = case.world_size
            step += [f"    p.grad *= {d} / {factor!r}  # documented: the sum over {d} ranks / {factor!r}"]
    whole = any(c.wrapper in SHARDED_FSDP1 for c in compositions(case))
    if observe:
        grads = [
            f"for n, p in {named}:  # no gradient counts as zeros",
            f'    seen[f"gradient of {{n}} at step {at}"] = full(p.grad) if p.grad is not None else torch.zeros(p.shape)',  # noqa: E501
        ]
        step += _whole(grads, "model, with_grads=True") if whole else grads
    step += step_lines(training)
    if observe:
        after = [f'seen.update({{f"{{n}} after step {at}": full(p) for n, p in {named}}})']
        step += _whole(after, "model") if whole else after
    lines += _loop("step" if by_step else "_", steps, step)
    if observe:
        lines += ["return seen"]
    head = "def main(rank, world_size):" if inline is not None else "def train(rank, world_size, compose):"
    return [*skips, *([""] * 2 * bool(skips)), head, *(f"    {line}" for line in lines)]
