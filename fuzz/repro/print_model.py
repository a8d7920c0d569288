"""The model half of a printed script: a case's tree as plain module code, and its compositions
as the calls they make. Shared by every printer (:mod:`fuzz.repro.printed` for the training
properties, :mod:`fuzz.repro.print_state` for state_dict and dcp).

Public names (stable):

- :class:`NotPrintable`: the :class:`~fuzz.errors.InvalidArgument` a printer raises naming what
  of a case it does not write (``cannot print X yet``); :func:`refuse` builds one.
- :func:`check_tree`, :func:`check_composition`, :func:`check_default`: raise it for a tree, a
  composition, or any dataclass field away from its default that is not written
  (``check_composition(comp, where, knobs=False, judged=True, tree=None)``: with the ``tree``,
  which the caller then hands :func:`compose_lines`, a delayed all-reduce, tensor parallelism
  and SPMD are written too).
- :func:`model_source` ``(tree, *, skips=False, auto_wrap=False) -> str``: the imports and class
  definitions (``Block`` with the features the tree's blocks use, ``Conv``, ``Attention``) the
  model needs, "" after the imports where plain ``nn.Sequential`` does.
- :func:`build_lines` ``(tree, *, skips=False, auto_wrap=False, dtype=None, seed=None) ->
  list[str]``: ``def build():`` returning the model (seeded with ``torch.manual_seed(seed)``
  first where ``seed`` is given, so every rank builds the pool's weights).
- :func:`compose_lines` ``(comp, name, tree=None) -> list[str]``: ``def NAME(model):`` making
  the composition's calls in its order (replicate's options, ``parallelize_module``, an SPMD
  program's DTensors, ``fully_shard`` with its options) and returning what trains; a
  tensor-parallel or SPMD one is ``def NAME(model, mesh):`` over :func:`mesh_line`'s mesh, whose
  global batch :func:`batch_placements` places; :func:`compose_imports` ``(comps) -> list[str]``
  the imports those calls need.
- :func:`compose_helpers` ``(comps, world_size) -> list[str]``: top-level functions those calls
  name (a shard placement function, a selective-checkpoint policy).
- :func:`param_names` ``(tree) -> list[str]``: the plain model's parameter names, in order.
- :data:`PRINTED_MARK`: a comment line every printed script carries (how
  :func:`fuzz.repro.printed.is_printed` tells it from a reduced one).
- :func:`assemble` ``(parts) -> str``: the parts of a script joined, their import lines hoisted
  to the top once each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from fuzz.errors import InvalidArgument
from fuzz.model import (
    Block,
    Composition,
    ContextFn,
    Dtype,
    Layout,
    Leaf,
    LeafKind,
    MixedPrecision,
    ModuleTree,
    ShardSpec,
    Wrapper,
    attention_heads,
    is_ancestor,
)

#: The comment line that marks a script printed from its case.
PRINTED_MARK = "# Printed from the case by shardfuzz (python -m fuzz repro)."
#: Composition fields a printed script writes; every other must hold its default.
COMPOSITION_FIELDS = {
    "shards",
    "replicates",
    "checkpoints",
    "checkpoint_first",
    "mesh",
    "wrapper",
    "auto_wrap",
    "checkpoint_options",
    "replicate_options",
    "tp",
    "tp_size",
    "spmd",
    "spmd_mse_loss",
}
#: ReplicateOptions fields a printed ``replicate`` call writes (``delay_all_reduce`` where the
#: tree is known: its plan is the tree's).
REPLICATE_FIELDS = {"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "init_sync", "delay_all_reduce"}
#: ShardSpec fields a printed ``fully_shard`` call writes.
SHARD_FIELDS = {"path", "reshard_after_forward", "shard_dim", "mixed_precision", "ignored", "group"}
#: The whole-model wrappers :func:`compose_lines` writes: FSDP1's strategies (HYBRID_SHARD over the
#: case's (replicate, shard) mesh). A script reads a sharded one's parameters and gradients whole
#: under ``FSDP.summon_full_params`` (:data:`SHARDED_FSDP1`).
WRAPPERS = {
    Wrapper.NONE: "",
    Wrapper.FSDP1_NO_SHARD: "NO_SHARD",
    Wrapper.FSDP1_FULL_SHARD: "FULL_SHARD",
    Wrapper.FSDP1_SHARD_GRAD_OP: "SHARD_GRAD_OP",
    Wrapper.FSDP1_HYBRID_SHARD: "HYBRID_SHARD",
    Wrapper.DDP: "",  # written where the script compares no parameter by name (DDP prefixes "module.")
}
#: FSDP1 strategies whose parameters (outside forward) are views of this rank's shard.
SHARDED_FSDP1 = {Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP, Wrapper.FSDP1_HYBRID_SHARD}
LEAVES = {
    LeafKind.LINEAR,
    LeafKind.LAYER_NORM,
    LeafKind.CONV1D,
    LeafKind.RELU,
    LeafKind.TANH,
    LeafKind.GELU,
    LeafKind.DROPOUT,
    LeafKind.ATTENTION,
}
#: What a Block of the tree may have that ``Block`` then writes (its ``__init__``'s flags).
FEATURES = ("scale", "buffer", "residual", "repeat")
_WEIGHTED = (LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D)


class NotPrintable(InvalidArgument):
    """The case uses something the printers (:mod:`fuzz.repro.printed`, :mod:`fuzz.repro.print_state`)
    do not write yet."""


def refuse(what: str) -> NotPrintable:
    return NotPrintable(f"cannot print {what} yet")


def check_default(obj: Any, written: set[str], where: str) -> None:
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
            check_default(value, set(), f"{where}.{f.name}")
        raise refuse(f"{where}.{f.name}={value!r}")


def check_tree(tree: ModuleTree) -> None:
    if getattr(tree, "seq", 0) or getattr(tree, "vocab", 0):
        raise refuse("a tree with a sequence or a vocabulary")

    def visit(node: Any, path: str) -> None:
        if isinstance(node, Leaf):
            if node.kind not in LEAVES:
                raise refuse(f"leaf kind {node.kind.value} (at {path or 'the root'})")
            check_default(node, {"kind", "bias", "frozen"}, f"leaf {path}")
            return
        if not isinstance(node, Block):
            raise refuse(f"node {type(node).__name__} (at {path or 'the root'})")
        check_default(node, {"children", *FEATURES}, f"block {path or 'root'}")
        for i, child in enumerate(node.children):
            visit(child, f"{path}.{i}" if path else str(i))

    visit(tree.root, "")


def check_composition(
    comp: Composition, where: str, knobs: bool = False, judged: bool = True, tree: ModuleTree | None = None
) -> None:
    """Raise :class:`NotPrintable` naming the first field of ``comp`` (at ``where``) that
    :func:`compose_lines` does not write: ``knobs`` where the caller writes the knobs' per-step
    calls; ``judged`` where the script compares parameters by name (DDP is not written then);
    ``tree`` where the caller hands :func:`compose_lines` the tree (a delayed all-reduce's plan)."""
    check_default(comp, COMPOSITION_FIELDS | ({"knobs"} if knobs else set()), where)
    written = REPLICATE_FIELDS - ({"delay_all_reduce"} if tree is None else set())
    check_default(comp.replicate_options, written, f"{where}.replicate_options")
    hybrid = comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD
    if comp.wrapper not in WRAPPERS or (hybrid and not comp.mesh) or (judged and comp.wrapper is Wrapper.DDP):
        raise refuse(f"{where}.wrapper={comp.wrapper.value}")
    check_default(
        comp.knobs, {"force_sum_reduction", "gradient_divide_factor", "reshard_after_backward_last"}, f"{where}.knobs"
    )
    check_default(comp.checkpoint_options, {"debug", "context_fn"}, f"{where}.checkpoint_options")
    for spec in comp.shards:
        check_default(spec, SHARD_FIELDS, f"{where}.shards[{spec.path!r}]")
    if comp.checkpoint_options.is_set and comp.wrapper is not Wrapper.NONE:
        raise refuse(f"{where}.checkpoint_options with a wrapper")
    if (comp.tp or comp.spmd) and tree is None:
        raise refuse(f"{where}.{'spmd' if comp.spmd else 'tp'} here")


def param_names(tree: ModuleTree) -> list[str]:
    """The plain model's parameter names, in registration order (children, then a block's scale)."""

    def visit(node: Any, prefix: str) -> list[str]:
        if isinstance(node, Leaf):
            own = ["weight", "bias"] if node.bias else ["weight"]
            if node.kind is LeafKind.ATTENTION:
                return [f"{prefix}{part}.{n}" for part in "qkvo" for n in own]
            return [f"{prefix}{n}" for n in own] if node.kind in _WEIGHTED else []
        names = [] if not node.scale else [f"{prefix}scale"]
        children = [n for i, c in enumerate(node.children) for n in visit(c, f"{prefix}{i}.")]
        return names + children

    return visit(tree.root, "")


def uses(tree: ModuleTree, test: Callable[[Any], bool]) -> bool:
    """Whether a node of ``tree`` passes ``test``."""

    def visit(node: Any) -> bool:
        return test(node) or (isinstance(node, Block) and any(visit(c) for c in node.children))

    return visit(tree.root)


def _blocks(node: Any) -> list[Block]:
    """Every block at or under ``node``."""
    return [node, *(b for c in node.children for b in _blocks(c))] if isinstance(node, Block) else []


def _sequential(tree: ModuleTree, skips: bool, auto_wrap: bool) -> bool:
    """Whether ``nn.Sequential`` does for every block (no feature, no skip, no wrap policy on Block)."""
    return not (skips or auto_wrap or _featured(tree, False))


def _featured(tree: ModuleTree, skips: bool) -> bool:
    """Whether ``Block`` needs its own forward (a feature, or children left out of forward)."""
    return skips or uses(tree, lambda n: isinstance(n, Block) and any(getattr(n, f) for f in FEATURES))


def _node(node: Any, width: int, sequential: bool, featured: bool = True) -> str:
    if isinstance(node, Leaf):
        bias = "" if node.bias else ", bias=False"
        code = {
            LeafKind.LINEAR: f"nn.Linear({width}, {width}{bias})",
            LeafKind.LAYER_NORM: f"nn.LayerNorm({width}{bias})",
            LeafKind.CONV1D: f"Conv({width}, {width}, 1{bias})",
            LeafKind.RELU: "nn.ReLU()",
            LeafKind.TANH: "nn.Tanh()",
            LeafKind.GELU: "nn.GELU()",
            LeafKind.DROPOUT: "nn.Dropout(0.5)",
            LeafKind.ATTENTION: f"Attention({width}{bias})",
        }[node.kind]
        return f"{code}.requires_grad_(False)" if node.frozen else code
    children = ", ".join(_node(c, width, sequential, featured) for c in node.children)
    if sequential:
        return f"nn.Sequential({children})"
    if not featured:
        return f"Block({children})"
    extra = "".join(f", {name}=True" for name in FEATURES if getattr(node, name))
    return f"Block([{children}], {width}{extra})"


def _block_class(tree: ModuleTree, skips: bool) -> str:
    """``Block``: runs its children (but those in ``SKIPPED``), then the features the tree uses."""
    used = {f for n in _blocks(tree.root) for f in FEATURES if getattr(n, f)}
    scale, buffer, residual, repeat = (f in used for f in FEATURES)
    params = "".join(f", {f}=False" for f in FEATURES if f in used)
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
    if repeat:
        lines.append("        self.repeat = repeat  # its children run twice over")
    lines += ["", "    def forward(self, x):", "        y = x"]
    run = [
        "for child in self.children():",
        "    y = y if child in SKIPPED else child(y)" if skips else "    y = child(y)",
    ]
    if repeat:
        run = ["for _ in range(2 if self.repeat else 1):", *(f"    {line}" for line in run)]
    lines += [f"        {line}" for line in run]
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


_ATTENTION = """\
class Attention(nn.Module):
    \"\"\"Self-attention (q, k, v, o projections, HEADS heads) over a (batch, width) activation, as a
    length-1 sequence.\"\"\"

    def __init__(self, width, bias=True):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=bias) for _ in range(4))

    def forward(self, x):
        h = x.unsqueeze(1)
        b, s, w = h.shape
        q, k, v = (t(h).reshape(b, s, HEADS, w // HEADS).transpose(1, 2) for t in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, w)).squeeze(1)"""


def model_source(tree: ModuleTree, *, skips: bool = False, auto_wrap: bool = False) -> str:
    """The imports and class definitions the model of ``tree`` needs (``Block`` where a block has
    a feature, children left out of forward (``skips``) or a wrap policy names it (``auto_wrap``);
    ``Conv`` for a one-tap convolution)."""
    parts = ["import torch\nfrom torch import nn"]
    if not _featured(tree, skips) and auto_wrap:
        parts.append("class Block(nn.Sequential):  # a class of its own, for FSDP1's wrap policy\n    pass")
    elif not _sequential(tree, skips, auto_wrap):
        parts.append(_block_class(tree, skips))
    if skips:
        parts.insert(1, "SKIPPED = []  # the modules left out of forward now")
    if uses(tree, lambda n: isinstance(n, Leaf) and n.kind is LeafKind.CONV1D):
        parts.append(_CONV)
    if uses(tree, lambda n: isinstance(n, Leaf) and n.kind is LeafKind.ATTENTION):
        heads = attention_heads(tree.width)
        parts.append(
            "import torch.nn.functional as F\n"
            + _ATTENTION.replace("HEADS heads", f"{heads} head" + "s" * (heads > 1)).replace(
                "HEADS, w // HEADS", "1, w" if heads == 1 else f"{heads}, w // {heads}"
            )
        )
    return "\n\n\n".join(parts)


def build_lines(
    tree: ModuleTree,
    *,
    skips: bool = False,
    auto_wrap: bool = False,
    dtype: Dtype | None = None,
    seed: int | None = None,
) -> list[str]:
    """``def build():`` returning the model of ``tree`` (in ``dtype`` where it is float64),
    seeded first where ``seed`` is given."""
    to = ".to(torch.float64)" if dtype is Dtype.FLOAT64 else ""
    seeded = [] if seed is None else [f"    torch.manual_seed({seed})  # every rank builds the same weights"]
    sequential, featured = _sequential(tree, skips, auto_wrap), _featured(tree, skips)

    def lines(node: Any, indent: str, head: str, end: str) -> list[str]:
        """``node`` after ``head``, on one line where it fits, else one child a line."""
        one = f"{indent}{head}{_node(node, tree.width, sequential, featured)}{end}"
        if len(one) <= 116 or not isinstance(node, Block):
            return [one]
        placeholder = dataclasses.replace(node, children=(Leaf(LeafKind.RELU),))
        opening, closing = _node(placeholder, tree.width, sequential, featured).split("nn.ReLU()")
        children = [line for c in node.children for line in lines(c, indent + "    ", "", ",")]
        return [f"{indent}{head}{opening}", *children, f"{indent}{closing}{end}"]

    model = lines(tree.root, "    ", "return ", to)
    if max(len(line) for line in model) > 116:
        raise refuse("a module of more than 116 characters a line")
    return ["def build():", *seeded, *model]


def compose_imports(comps: Iterable[Composition]) -> list[str]:
    """The imports the calls of ``comps`` (:func:`compose_lines`) need."""
    comps = list(comps)
    api = {api for comp in comps for api, _ in comp.steps()}
    lines = []
    if "checkpoint" in api or "replicate" in api:
        lines.append(
            f"from torch.distributed._composable import {', '.join(sorted(api & {'checkpoint', 'replicate'}))}"
        )
    if any(comp.wrapper is Wrapper.DDP for comp in comps):
        lines.append("from torch.nn.parallel import DistributedDataParallel as DDP")
    if any(comp.wrapper not in (Wrapper.NONE, Wrapper.DDP) for comp in comps):
        lines.append("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy")
    if any(comp.auto_wrap for comp in comps):
        lines.append("from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
    if any((comp.mesh and (comp.shards or comp.wrapper is not Wrapper.NONE)) or comp.tp or comp.spmd for comp in comps):
        lines.append("from torch.distributed.device_mesh import init_device_mesh")
    if any(comp.tp and not comp.spmd for comp in comps):
        lines.append(
            "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module"
        )
    if any(comp.spmd for comp in comps):
        lines.append("from torch.distributed.fsdp import DataParallelMeshDims")
        lines.append("from torch.distributed.tensor import DTensor")
        lines.append("from torch.distributed.tensor import Replicate, Shard, distribute_tensor")
    if "fully_shard" in api:
        lines.append("from torch.distributed.fsdp import fully_shard")
    specs = [spec for comp in comps for spec in comp.shards]
    if any(spec.mixed_precision is not None for spec in specs):
        lines.append("from torch.distributed.fsdp import MixedPrecisionPolicy")
    if any(spec.shard_dim for spec in specs) and not any(comp.spmd for comp in comps):
        lines.append("from torch.distributed.tensor import Shard")
    if any(comp.checkpoint_options.context_fn is not ContextFn.NONE for comp in comps):
        lines.append("import functools")
        lines.append("from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts")
    return lines


def _mp_policy(mp: MixedPrecision) -> str:
    args = [
        f"{f}=torch.{getattr(mp, f).value}" for f in ("param_dtype", "reduce_dtype", "output_dtype") if getattr(mp, f)
    ]
    return (
        f"MixedPrecisionPolicy({', '.join(args + ([] if mp.cast_forward_inputs else ['cast_forward_inputs=False']))})"
    )


def _shard_kwargs(comp: Composition, spec: ShardSpec) -> str:
    """The keyword arguments of ``spec``'s ``fully_shard`` call, from ", " on ("" without any)."""
    kwargs = ["mesh=mesh"] if comp.mesh or comp.spmd else (['mesh=mesh["shard"]'] if comp.tp else [])
    # fully_shard's default (None since torch 2.13) reshards every unit after forward but the
    # root, which stays unsharded: an outermost unit's True is written out.
    outermost = not any(is_ancestor(q, p) for other in comp.shards for q in other.paths for p in spec.paths)
    if spec.reshard_after_forward is not True or outermost:
        kwargs.append(f"reshard_after_forward={spec.reshard_after_forward!r}")
    if spec.shard_dim:
        kwargs.append(f"shard_placement_fn=on_dim{spec.shard_dim}")
    if spec.mixed_precision is not None:
        kwargs.append("mp_policy=mp")
    if spec.ignored:
        own = [f'*model.get_submodule("{p}").parameters(recurse=False)' for p in spec.ignored]
        kwargs.append(f"ignored_params={{{', '.join(own)}}}")
    if comp.spmd:
        dims = 'shard="shard", replicate="replicate"' if comp.mesh else 'shard="shard"'
        kwargs.append(f"dp_mesh_dims=DataParallelMeshDims({dims})")
    return "".join(f", {k}" for k in kwargs)


def _checkpoint_kwargs(comp: Composition) -> str:
    opts = comp.checkpoint_options
    kwargs = []
    if opts.context_fn is ContextFn.SAVE_MATMULS:
        kwargs.append("context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls)")
    elif opts.context_fn is ContextFn.SAVE_MATMULS_LIST:
        ops = "[torch.ops.aten.mm.default, torch.ops.aten.addmm.default]"
        kwargs.append(f"context_fn=functools.partial(create_selective_checkpoint_contexts, {ops})")
    if opts.debug:
        kwargs.append("debug=True")
    return "".join(f", {k}" for k in kwargs)


def _packed(head: str, args: list[str], tail: str, width: int = 100) -> list[str]:
    """``head`` + ``args`` joined + ``tail``, on as few lines of about ``width`` as they fit, later
    lines aligned under the first argument."""
    lines = [head]
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else tail)
        if len(lines[-1]) + len(piece.rstrip()) > width and lines[-1].strip() != head.strip():
            lines[-1] = lines[-1].rstrip()
            lines.append(" " * len(head))
        lines[-1] += piece
    return lines


def compose_helpers(comps: Iterable[Composition], world_size: int) -> list[str]:
    """Top-level functions the calls of ``comps`` name: a shard placement per ``shard_dim``, the
    selective checkpoint's policy."""
    comps = list(comps)
    out = []
    for d in sorted({s.shard_dim for c in comps for s in c.shards if s.shard_dim}):
        sizes = {c.mesh[-1] if c.mesh else world_size for c in comps for s in c.shards if s.shard_dim == d}
        size = sizes.pop() if len(sizes) == 1 else None
        if size is None:
            raise refuse("one shard_dim over shard groups of several sizes")
        out.append(
            f"def on_dim{d}(p):  # Shard({d}) where it splits evenly, else Shard(0) (uneven sharding: dim 0 only)\n"
            f"    return Shard({d}) if p.ndim > {d} and p.shape[{d}] % {size} == 0 else None"
        )
    if any(c.checkpoint_options.context_fn is ContextFn.SAVE_MATMULS for c in comps):
        out.append(
            "def save_matmuls(ctx, op, *args, **kwargs):  # saves the matmuls, recomputes the rest\n"
            "    matmuls = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]\n"
            "    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE"
        )
    return out


def _replicate_call(comp: Composition, path: str, module: str, tree: ModuleTree | None) -> list[str]:
    """``replicate(MODULE, ...)`` with the options ``comp`` sets (:func:`fuzz._rank.options.replicate_kwargs`)."""
    opts = comp.replicate_options
    kwargs = []
    if opts.bucket_cap_mb is not None:
        kwargs.append(f"bucket_cap_mb={opts.bucket_cap_mb!r}")
    kwargs += [f"{n}=True" for n in ("gradient_as_bucket_view", "static_graph") if getattr(opts, n)]
    if not opts.init_sync:
        kwargs.append("init_sync=False")
    plan = None if not opts.delay_all_reduce or tree is None else Layout(tree, comp).delay_plan(path)
    if plan is None or tree is None:
        return (
            _packed(f"replicate({module}" + (", " if kwargs else ""), kwargs, ")")
            if kwargs
            else [f"replicate({module})"]
        )
    hook, delayed = plan
    order = Layout(tree, comp).replicated_params(path)  # replicate's nn.ParameterList: DDP names them by index

    def param(p: str, n: str) -> str:
        return f'model.get_parameter("{p}.{n}")' if p else f'model.get_parameter("{n}")'

    first = next(n for p, n in order if p == hook)
    named = [f'("{i}", {param(p, n)})' for i, (p, n) in enumerate(order) if p in delayed]
    return [
        f"# when {hook}'s gradient is ready (backward reaches it last), the parameters of the modules after",
        "# it are all-reduced (named by their index in the parameter list replicate hands DDP)",
        *_packed(f"replicate({module}, ", [*kwargs, f"param_to_hook_all_reduce={param(hook, first)}"], ","),
        *_packed("          delay_all_reduce_named_params=[", named, "])"),
    ]


def mesh_line(comp: Composition, world_size: int) -> str:
    """``mesh = init_device_mesh(...)``: the mesh of a tensor-parallel or SPMD composition
    (:func:`fuzz._rank.compose.spmd_mesh`): (shard, tp), (replicate, shard) or (shard,)."""
    dims: tuple[int, ...]
    names: tuple[str, ...]
    if comp.tp:
        dims, names = (world_size // comp.tp_size, comp.tp_size), ("shard", "tp")
    elif comp.mesh:
        dims, names = tuple(comp.mesh), ("replicate", "shard")
    else:
        dims, names = (world_size,), ("shard",)
    quoted = "".join(f'"{n}", ' for n in names).rstrip(" ") if len(names) == 1 else ", ".join(f'"{n}"' for n in names)
    return f'mesh = init_device_mesh("cpu", {dims!r}, mesh_dim_names=({quoted}))'


def batch_placements(comp: Composition) -> str:
    """A global batch's placements on an SPMD mesh (:func:`fuzz._rank.compose.spmd_part`): split
    on dim 0 over every data-parallel dimension, whole on ``tp``."""
    return "[Shard(0), Replicate()]" if comp.tp else ("[Shard(0), Shard(0)]" if comp.mesh else "[Shard(0)]")


def _spmd_lines(comp: Composition, tree: ModuleTree) -> list[str]:
    """Every parameter and buffer made a DTensor on the whole mesh (:func:`fuzz._rank.compose.as_spmd`),
    a tensor-parallel pair's split on ``tp``."""
    n = 2 if comp.tp or comp.mesh else 1
    lines = []
    if comp.tp:
        split: dict[str, str] = {}
        for pair in comp.tp:
            split |= {f"{pair.colwise}.weight": "Shard(0)", f"{pair.colwise}.bias": "Shard(0)"}
            split[f"{pair.rowwise}.weight"] = "Shard(1)"
        names = set(param_names(tree))
        items = [f'"{k}": {v}' for k, v in split.items() if k in names]
        lines += _packed("split = {", items, "}  # on tp: colwise (dim 0), rowwise (dim 1)")
        placements = "[Replicate(), split.get(name, Replicate())]"
    else:
        placements = f"[Replicate()] * {n}" if n > 1 else "[Replicate()]"
    lines += [
        "for name, p in list(model.named_parameters()):  # an SPMD program: DTensors on the whole mesh",
        '    holder, _, attr = name.rpartition(".")',
        f"    dt = distribute_tensor(p.detach(), mesh, {placements})",
        "    setattr(model.get_submodule(holder), attr, nn.Parameter(dt, requires_grad=p.requires_grad))",
    ]
    if uses(tree, lambda node: isinstance(node, Block) and node.buffer):
        replicated = f"[Replicate()] * {n}" if n > 1 else "[Replicate()]"
        lines += [
            "for name, b in list(model.named_buffers()):",
            '    holder, _, attr = name.rpartition(".")',
            f"    model.get_submodule(holder).register_buffer(attr, distribute_tensor(b, mesh, {replicated}))",
        ]
    return lines


def compose_lines(comp: Composition, name: str, tree: ModuleTree | None = None) -> list[str]:
    """``def NAME(model):`` composing ``model`` as ``comp`` says and returning what trains
    (``tree``: the model's, which a delayed all-reduce's plan and an SPMD program need). A
    tensor-parallel or SPMD composition is ``def NAME(model, mesh):`` over the mesh of
    :func:`mesh_line`."""
    lines = []
    if comp.wrapper is Wrapper.DDP:
        lines += [f'checkpoint(model.get_submodule("{p}"))' for p in comp.checkpoints]
        return [f"def {name}(model):", *(f"    {line}" for line in [*lines, "return DDP(model)"])]
    if comp.wrapper is not Wrapper.NONE:
        lines += [f'checkpoint(model.get_submodule("{p}"))' for p in comp.checkpoints]
        kwargs = f"sharding_strategy=ShardingStrategy.{WRAPPERS[comp.wrapper]}, use_orig_params=True"
        if comp.mesh:
            dims = ", ".join(str(d) for d in comp.mesh)
            lines.append(f'mesh = init_device_mesh("cpu", ({dims}), mesh_dim_names=("replicate", "shard"))')
            kwargs += ", device_mesh=mesh"
        if comp.auto_wrap:
            kwargs += ", auto_wrap_policy=ModuleWrapPolicy({Block})"
        args = ["model", *kwargs.split(", "), 'device_id=torch.device("cpu")']
        lines += _packed("return FSDP(", args, ")")
        return [f"def {name}(model):", *(f"    {line}" for line in lines)]
    if comp.tp and not comp.spmd:
        plan = ", ".join(f'"{p.colwise}": ColwiseParallel(), "{p.rowwise}": RowwiseParallel()' for p in comp.tp)
        lines += _packed('parallelize_module(model, mesh["tp"], {', plan.split(", "), "})")
    if comp.spmd and tree is not None:
        lines += _spmd_lines(comp, tree)
    if comp.mesh and comp.shards and not comp.spmd:  # fully_shard's (replicate, shard) mesh
        dims = ", ".join(str(d) for d in comp.mesh)
        lines.append(f'mesh = init_device_mesh("cpu", ({dims}), mesh_dim_names=("replicate", "shard"))')
    specs = {s.path: s for s in comp.shards}
    checkpoint_kwargs = _checkpoint_kwargs(comp)
    for api, path in comp.steps():
        module = "model" if path == "" else f'model.get_submodule("{path}")'
        if api == "fully_shard":
            mp = specs[path].mixed_precision
            if mp is not None:
                lines.append(f"mp = {_mp_policy(mp)}")
            if specs[path].group:  # one unit of several modules
                module = (
                    "[" + ", ".join(f'model.get_submodule("{p}")' if p else "model" for p in specs[path].paths) + "]"
                )
            lines.append(f"fully_shard({module}{_shard_kwargs(comp, specs[path])})")
        elif api == "checkpoint":
            lines.append(f"checkpoint({module}{checkpoint_kwargs})")
        else:
            lines += _replicate_call(comp, path, module, tree)
    for spec in comp.shards:
        module = "model" if spec.path == "" else f'model.get_submodule("{spec.path}")'
        if comp.knobs.force_sum_reduction:
            lines.append(f"{module}.set_force_sum_reduction_for_comms(True)")
        if comp.knobs.gradient_divide_factor is not None:
            lines.append(f"{module}.set_gradient_divide_factor({comp.knobs.gradient_divide_factor!r})")
    head = f"def {name}(model, mesh):" if comp.tp or comp.spmd else f"def {name}(model):"
    return [head, *(f"    {line}" for line in [*lines, "return model"])]


def assemble(parts: Iterable[str]) -> str:
    """The script of ``parts`` (top-level definitions), two blank lines apart, with every
    top-level import line hoisted to the top once, plain imports before ``from`` imports."""
    imports: list[str] = []
    bodies = []
    for part in parts:
        kept = []
        for line in part.splitlines():
            if line.startswith(("import ", "from ")):
                if line not in imports:
                    imports.append(line)
            else:
                kept.append(line)
        body = "\n".join(kept).strip("\n")
        if body:
            bodies.append(body)
    head = sorted(i for i in imports if i.startswith("import ")) + sorted(i for i in imports if i.startswith("from "))
    return "\n\n\n".join(["\n".join(head), *bodies]) + "\n"
