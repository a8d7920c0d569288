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

import dataclasses
from typing import Any

from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Compile,
    Composition,
    Dtype,
    Layout,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Training,
    Wrapper,
)
from fuzz.tolerance import tolerance_for

#: The properties whose mismatches are printed.
PRINTED = ("parity", "metamorphic")
#: Composition fields a printed script writes; every other must hold its default.
_COMPOSITION_FIELDS = {"shards", "replicates", "checkpoints", "checkpoint_first", "mesh", "wrapper", "auto_wrap"}
#: FSDP1 wrappers whose parameters and gradients stay whole on every rank, so that a script reads
#: them by their plain names: NO_SHARD. (HYBRID_SHARD over one-rank shard groups looks whole, but
#: on a torch with its shard-dimension fix the gradients read off the parameters are local
#: shards: not printed yet.)
_WRAPPERS = {Wrapper.NONE: "", Wrapper.FSDP1_NO_SHARD: "NO_SHARD"}
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
_LEAVES = {LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D, LeafKind.RELU, LeafKind.TANH, LeafKind.GELU}


class NotPrintable(InvalidArgument):
    """The case uses something :mod:`fuzz.repro.printed` does not write yet."""


def _refuse(what: str) -> NotPrintable:
    return NotPrintable(f"cannot print {what} yet")


def _check_default(obj: Any, written: set[str], where: str) -> None:
    """Every field of ``obj`` but those ``written`` holds its default (a dataclass field's own
    fields, where it is one, named one by one)."""
    for f in dataclasses.fields(obj):
        if f.name in written or not f.init:
            continue
        value = getattr(obj, f.name)
        factory: Any = f.default_factory
        default = f.default if f.default is not dataclasses.MISSING else factory()
        if value == default:
            continue
        if dataclasses.is_dataclass(value) and type(value) is type(default):
            _check_default(value, set(), f"{where}.{f.name}")
        raise _refuse(f"{where}.{f.name}={value!r}")


def _check_tree(tree: ModuleTree) -> None:
    if getattr(tree, "seq", 0) or getattr(tree, "vocab", 0):
        raise _refuse("a tree with a sequence or a vocabulary")

    def visit(node: Any, path: str) -> None:
        if isinstance(node, Leaf):
            if node.kind not in _LEAVES:
                raise _refuse(f"leaf kind {node.kind.value} (at {path or 'the root'})")
            _check_default(node, {"kind", "bias", "frozen"}, f"leaf {path}")
            return
        if not isinstance(node, Block):
            raise _refuse(f"node {type(node).__name__} (at {path or 'the root'})")
        _check_default(node, {"children", "residual", "scale", "buffer"}, f"block {path or 'root'}")
        for i, child in enumerate(node.children):
            visit(child, f"{path}.{i}" if path else str(i))

    visit(tree.root, "")


def _check_composition(comp: Composition, where: str, knobs: bool = False) -> None:
    _check_default(comp, _COMPOSITION_FIELDS | ({"knobs"} if knobs else set()), where)
    if comp.wrapper not in _WRAPPERS:
        raise _refuse(f"{where}.wrapper={comp.wrapper.value}")
    _check_default(comp.knobs, {"force_sum_reduction", "gradient_divide_factor"}, f"{where}.knobs")
    for spec in comp.shards:
        _check_default(spec, {"path", "reshard_after_forward"}, f"{where}.shards[{spec.path!r}]")


def check_printable(case: Case) -> None:
    """Raise :class:`NotPrintable` naming the first thing of ``case`` this module does not write."""
    body: Any = case.body
    if case.property not in PRINTED:
        raise _refuse(f"a {case.property} case")
    _check_tree(body.tree)
    _check_composition(body.composition, "composition", knobs=case.property == "parity")
    if case.property == "parity" and len(set(_scales(case).values())) > 1:
        raise _refuse("gradient scales that differ between modules")
    if case.property == "metamorphic":
        _check_composition(body.variant, "variant")
    training: Training = body.training
    _check_default(training, _TRAINING_FIELDS, "training")
    if training.compile is not Compile.NONE:
        raise _refuse("training.compile")
    if training.accum_sync is not AccumSync.ALWAYS and training.grad_accum > 1:
        for comp in (body.composition, *([body.variant] if case.property == "metamorphic" else [])):
            if "" not in {s.path for s in comp.shards}:
                raise _refuse("a gradient-sync switch without fully_shard on the root")


def _param_names(tree: ModuleTree) -> list[str]:
    """The plain model's parameter names, in registration order (children, then a block's scale)."""

    def visit(node: Any, prefix: str) -> list[str]:
        if isinstance(node, Leaf):
            own = (
                ["weight", "bias"]
                if node.bias and node.kind in (LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D)
                else []
            )
            own = own or (["weight"] if node.kind in (LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D) else [])
            return [f"{prefix}{n}" for n in own]
        names = [] if not node.scale else [f"{prefix}scale"]
        children = [n for i, c in enumerate(node.children) for n in visit(c, f"{prefix}{i}.")]
        return names + children

    return visit(tree.root, "")


def _scales(case: Case) -> dict[str, float]:
    """Per module path holding parameters: what the composition's knobs scale its averaged
    gradient by, as documented (:meth:`fuzz.model.Layout.gradient_scale`)."""
    body: Any = case.body
    layout = Layout(body.tree, body.composition)
    return {path: layout.gradient_scale(path, case.world_size) for path in layout.paths}


# -- the program -------------------------------------------------------------------------------


def _uses(tree: ModuleTree, test: Any) -> bool:
    def visit(node: Any) -> bool:
        return test(node) or (isinstance(node, Block) and any(visit(c) for c in node.children))

    return visit(tree.root)


def _node(node: Any, width: int, sequential: bool) -> str:
    if isinstance(node, Leaf):
        bias = "" if node.bias else ", bias=False"
        code = {
            LeafKind.LINEAR: f"nn.Linear({width}, {width}{bias})",
            LeafKind.LAYER_NORM: f"nn.LayerNorm({width}{bias})",
            LeafKind.CONV1D: f"Conv({width}, {width}, 1{bias})",
            LeafKind.RELU: "nn.ReLU()",
            LeafKind.TANH: "nn.Tanh()",
            LeafKind.GELU: "nn.GELU()",
        }[node.kind]
        return f"{code}.requires_grad_(False)" if node.frozen else code
    children = ", ".join(_node(c, width, sequential) for c in node.children)
    if sequential:
        return f"nn.Sequential({children})"
    extra = "".join(f", {name}=True" for name in ("scale", "buffer", "residual") if getattr(node, name))
    return f"Block([{children}], {width}{extra})"


def _block_class(tree: ModuleTree, skips: bool) -> str:
    """``Block``: runs its children (those not ``skipped``), then the features the tree uses."""
    scale = _uses(tree, lambda n: isinstance(n, Block) and n.scale)
    buffer = _uses(tree, lambda n: isinstance(n, Block) and n.buffer)
    residual = _uses(tree, lambda n: isinstance(n, Block) and n.residual)
    params = "".join(
        f", {n}=False" for n, used in (("scale", scale), ("buffer", buffer), ("residual", residual)) if used
    )
    lines = [
        "class Block(nn.Module):",
        f"    def __init__(self, children, width{params}):",
        "        super().__init__()",
        "        for i, child in enumerate(children):",
        "            self.add_module(str(i), child)",
    ]
    if scale:
        lines.append("        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None")
    if buffer:
        lines.append("        self.register_buffer('shift', 0.1 * torch.randn(width) if buffer else None)")
    if residual:
        lines.append("        self.residual = residual")
    if skips:
        lines.append("        self.skipped = set()  # children left out of forward")
    lines += ["", "    def forward(self, x):", "        y = x"]
    if skips:
        lines += ["        for name, child in self.named_children():", "            if name not in self.skipped:"]
        lines.append("                y = child(y)")
    else:
        lines += ["        for child in self.children():", "            y = child(y)"]
    if scale:
        lines.append("        y = y if self.scale is None else y * self.scale")
    if buffer:
        lines.append("        y = y if self.shift is None else y + self.shift")
    lines.append("        return x + y if self.residual else y" if residual else "        return y")
    return "\n".join(lines)


_CONV = """\
class Conv(nn.Conv1d):
    \"\"\"A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence.\"\"\"

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)"""


def _compose(comp: Composition, name: str) -> list[str]:
    """A function that composes ``model`` as ``comp`` says and returns what trains."""
    lines = []
    if comp.wrapper is not Wrapper.NONE:
        lines += [f'checkpoint(model.get_submodule("{p}"))' for p in comp.checkpoints]
        kwargs = f"sharding_strategy=ShardingStrategy.{_WRAPPERS[comp.wrapper]}, use_orig_params=True"
        if comp.mesh:
            dims = ", ".join(str(d) for d in comp.mesh)
            lines.append(f'mesh = init_device_mesh("cpu", ({dims}), mesh_dim_names=("replicate", "shard"))')
            kwargs += ", device_mesh=mesh"
        if comp.auto_wrap:
            kwargs += ", auto_wrap_policy=ModuleWrapPolicy({Block})"
        args = ["model", *kwargs.split(", "), 'device_id=torch.device("cpu")']
        lines += ["return FSDP(", *(f"    {a}," for a in args), ")"]
        return [f"def {name}(model):", *(f"    {line}" for line in lines)]
    if comp.mesh:
        dims = ", ".join(str(d) for d in comp.mesh)
        lines.append(f'mesh = init_device_mesh("cpu", ({dims}), mesh_dim_names=("replicate", "shard"))')
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        module = "model" if path == "" else f'model.get_submodule("{path}")'
        if api == "fully_shard":
            spec = specs[path]
            kwargs = ", mesh=mesh" if comp.mesh else ""
            if spec.reshard_after_forward is not True:
                kwargs += f", reshard_after_forward={spec.reshard_after_forward!r}"
            lines.append(f"fully_shard({module}{kwargs})")
        else:
            lines.append(f"{api}({module})")
    for spec in comp.shards:
        module = "model" if spec.path == "" else f'model.get_submodule("{spec.path}")'
        if comp.knobs.force_sum_reduction:
            lines.append(f"{module}.set_force_sum_reduction_for_comms(True)")
        if comp.knobs.gradient_divide_factor is not None:
            lines.append(f"{module}.set_gradient_divide_factor({comp.knobs.gradient_divide_factor!r})")
    return [f"def {name}(model):", *(f"    {line}" for line in [*lines, "return model"])]


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
    sequential = (
        not skips
        and not any(c.auto_wrap for c in comps)
        and not _uses(tree, lambda n: isinstance(n, Block) and (n.scale or n.buffer or n.residual))
    )
    tol = tolerance_for(training.dtype.value)
    imports = [
        "import torch",
        "import torch.distributed as dist",
        "import torch.nn.functional as F",
        "from torch import nn",
    ]
    if "checkpoint" in api or "replicate" in api:
        imports.append(
            f"from torch.distributed._composable import {', '.join(sorted(api & {'checkpoint', 'replicate'}))}"
        )
    if any(comp.wrapper is not Wrapper.NONE for comp in comps):
        imports.append("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy")
    if any(comp.auto_wrap for comp in comps):
        imports.append("from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
    if any(comp.mesh for comp in comps):
        imports.append("from torch.distributed.device_mesh import init_device_mesh")
    if "fully_shard" in api:
        imports += ["from torch.distributed.fsdp import fully_shard", "from torch.distributed.tensor import DTensor"]
    reference = "the run with the variant composition" if metamorphic else "the plain model with averaged gradients"
    parts = [
        "\n".join(imports),
        f"RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # the tolerance policy for {training.dtype.value}\n"
        f"REFERENCE = {reference!r}",
    ]
    if not sequential:
        parts.append(_block_class(tree, skips))
    if _uses(tree, lambda n: isinstance(n, Leaf) and n.kind is LeafKind.CONV1D):
        parts.append(_CONV)
    to = ".to(torch.float64)" if training.dtype is Dtype.FLOAT64 else ""
    parts.append(f"def build():\n    return {_node(tree.root, tree.width, sequential)}{to}")
    parts.append("\n".join(_compose(body.composition, "compose")))
    if metamorphic:
        parts.append("\n".join(_compose(body.variant, "compose_variant")))
    wrapped = any(comp.wrapper is not Wrapper.NONE for comp in comps)
    if wrapped:
        names = ", ".join(repr(n) for n in _param_names(tree))
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
    """Whether ``script`` was printed by this module (it has no carried harness to refresh)."""
    return "\ndef compared(" in script


def printable(entry: Entry) -> bool:
    """Whether ``entry`` is a mismatch this module prints."""
    if entry.kind != "mismatch" or entry.case.property not in PRINTED:
        return False
    try:
        check_printable(entry.case)
    except NotPrintable:
        return False
    return True
