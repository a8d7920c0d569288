"""Strategies for compositions: which modules get fully_shard / replicate / checkpoint, with
which options, on which mesh; or a whole-model wrapper (DDP, FSDP1)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import InvalidArgument
from fuzz.model import (
    PARAM_LEAVES,
    TP_BETWEEN,
    Block,
    Composition,
    Dtype,
    Knobs,
    Layout,
    Leaf,
    LeafKind,
    MixedPrecision,
    ModuleTree,
    Node,
    ShardSpec,
    TpPair,
    Wrapper,
    contains,
    has_params,
    is_ancestor,
)
from strategies._odds import keep_known
from strategies._validation import check_world_size


def _nested(a: str, b: str) -> bool:
    return contains(a, b) or contains(b, a)


def reshard_values(shard_size: int) -> st.SearchStrategy[bool | int]:
    """``reshard_after_forward`` values valid on a shard dimension of ``shard_size``: bools, and
    the non-trivial divisors of the shard size."""
    check_world_size(shard_size)
    divisors = [d for d in range(2, shard_size) if shard_size % d == 0]
    values: st.SearchStrategy[bool | int] = st.booleans()
    if divisors:
        values = st.one_of(values, st.sampled_from(divisors))
    return values


def meshes(world_size: int) -> st.SearchStrategy[tuple[int, ...]]:
    """() for a 1D mesh, or an HSDP (replicate, shard) shape: every factorisation of the world
    size, replicate size > 1 with shard size 1 included."""
    check_world_size(world_size)
    shapes = [(r, world_size // r) for r in range(1, world_size + 1) if world_size % r == 0]
    return st.sampled_from([(), *shapes])


def _depth(path: str) -> int:
    return path.count(".") + 1 if path else 0


@st.composite
def mixed_precision_policies(draw: st.DrawFn, *, context: Dtype | None = None, root: bool = False) -> MixedPrecision:
    """Policies for one fully_shard unit. A unit's floating input arrives in ``context`` (the
    compute dtype of the unit around it; the parameters' dtype, float32, at the root) and its
    output flows on into layers of that unit without a cast, so a unit that computes in another
    dtype casts its inputs to its ``param_dtype`` and its outputs back to ``context``
    (``output_dtype``, which MixedPrecisionPolicy documents for "different modules [with]
    different mixed precision policies"); one that computes in ``context`` may leave either
    unset. Anything else is a dtype mismatch by construction, not a bug. An unset
    ``param_dtype`` computes in the parameters' dtype and casts nothing, so in a low-precision
    context it is the context's dtype. ``context`` None: the unit's own compute dtype. The
    ``root``'s output leaves the model: any ``output_dtype``."""
    param = draw(st.one_of(st.none(), st.sampled_from([Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32])))
    if param is None and context not in (None, Dtype.FLOAT32):
        param = context
    compute = param if param is not None else Dtype.FLOAT32
    context = compute if context is None else context
    reduce = draw(st.one_of(st.none(), st.sampled_from([Dtype.FLOAT32, Dtype.BFLOAT16, Dtype.FLOAT16])))
    if root:
        output = draw(st.sampled_from([None, Dtype.FLOAT32, Dtype.BFLOAT16, Dtype.FLOAT16]))
    elif compute != context:
        output = context
    else:
        output = draw(st.sampled_from([None, context]))
    cast = compute != context or draw(st.sampled_from((True, False)))  # shrinks to torch's default
    return MixedPrecision(param_dtype=param, reduce_dtype=reduce, output_dtype=output, cast_forward_inputs=cast)


def _fit_precision(mp: MixedPrecision | None, context: Dtype, root: bool) -> MixedPrecision | None:
    """``mp`` made to keep to ``context`` as :func:`mixed_precision_policies` draws it."""
    if mp is None:
        return None if context is Dtype.FLOAT32 else MixedPrecision(param_dtype=context)
    param = mp.param_dtype if mp.param_dtype is not None or context is Dtype.FLOAT32 else context
    compute = param if param is not None else Dtype.FLOAT32
    output = mp.output_dtype
    if not root and compute != context:
        output = context
    elif not root and output not in (None, context):
        output = None
    cast = mp.cast_forward_inputs or compute != context
    return replace(mp, param_dtype=param, output_dtype=output, cast_forward_inputs=cast)


def _context(member: str, computes: dict[str, Dtype]) -> Dtype:
    """The dtype the input of the unit member at ``member`` arrives in: the compute dtype of the
    innermost unit member above it in ``computes``, else the parameters' (float32)."""
    around = [m for m in computes if is_ancestor(m, member)]
    return computes[max(around, key=_depth)] if around else Dtype.FLOAT32


def fitted_precision(comp: Composition) -> Composition:
    """``comp`` whose fully_shard units' policies keep the dtypes their layers meet
    (:func:`mixed_precision_policies`), from the root down: for use after a strategy took units
    out (the unit around another changes its context) or where units were grouped whose members
    sit in units of different compute dtypes (such a group is split: one output_dtype cannot
    return to both). Policies speak of float32 parameters."""
    if not any(s.mixed_precision is not None for s in comp.shards):
        return comp
    computes: dict[str, Dtype] = {}
    fitted: dict[int, list[ShardSpec]] = {}
    for i in sorted(range(len(comp.shards)), key=lambda i: _depth(comp.shards[i].path)):
        spec = comp.shards[i]
        contexts = {_context(m, computes) for m in spec.paths}
        parts = [spec] if len(contexts) == 1 else [replace(spec, path=m, group=()) for m in spec.paths]
        fitted[i] = []
        for part in parts:
            mp = _fit_precision(part.mixed_precision, _context(part.path, computes), part.path == "")
            for m in part.paths:
                computes[m] = mp.param_dtype if mp is not None and mp.param_dtype is not None else Dtype.FLOAT32
            fitted[i].append(replace(part, mixed_precision=mp))
    return replace(comp, shards=tuple(s for i in range(len(comp.shards)) for s in fitted[i]))


def _trainable_left(tree: ModuleTree, path: str, sharded: list[str]) -> bool:
    """Whether the module at ``path`` holds a trainable parameter outside every sharded module."""
    for sub, node in tree.paths().items():
        if not _nested(sub, path) or (path and not contains(path, sub)):
            continue
        if any(s == sub or (s != path and _nested(sub, s) and contains(s, sub)) for s in sharded):
            continue
        if isinstance(node, Leaf) and node.kind in PARAM_LEAVES and not node.frozen:
            return True
        if isinstance(node, Block) and node.scale:
            return True
    return False


@st.composite
def disjoint_subset(draw: st.DrawFn, candidates: list[str], exclude: list[str], min_size: int = 0) -> list[str]:
    out: list[str] = []
    if not candidates:
        return out
    for p in draw(st.lists(st.sampled_from(candidates), unique=True, min_size=min(min_size, len(candidates)))):
        if not any(_nested(p, q) for q in out + exclude):
            out.append(p)
    return out


def rare_int_reshard_dim_1(draw: st.DrawFn, reshard: bool | int, shard_dim: int) -> int:
    """An int reshard_after_forward with Shard(1) placements meets a known FSDP2 bug (IndexError
    in foreach_all_gather_copy_out, corpus/parity-exception-c9b6f29fb81d.json): keep that rare,
    each hit costs a respawn of the pool."""
    spec = ShardSpec(path="", reshard_after_forward=reshard, shard_dim=shard_dim)
    if known.int_reshard_dim1(Composition(shards=(spec,))) and not keep_known(draw, known.INT_RESHARD_DIM1):
        return 0
    return shard_dim


def _tied_group(draw: st.DrawFn, tree: ModuleTree, chosen: list[str], mode: str) -> list[str]:
    """Where the tree's head is tied to its embedding, fully_shard takes both in one unit or
    neither (fuzz.model.rules, the invalid property's tied_across_units): takes them out of
    ``chosen`` (in place) and returns the group ``[embedding, head]`` to shard where one of them
    was drawn (both sit at depth 0, so they group), or nothing. Not under a replicated root,
    where a group would be a root of its own."""
    if tree.tied is None or not any(p in chosen for p in tree.tied):
        return []
    chosen[:] = [p for p in chosen if p not in tree.tied]
    return list(tree.tied) if mode != "replicate-root" and draw(st.sampled_from((True, True, False))) else []


@st.composite
def compositions(
    draw: st.DrawFn,
    tree: ModuleTree,
    *,
    world_size: int,
    replicate: bool = True,
    checkpoint: bool = True,
    hsdp: bool = True,
    mixed_precision: bool = False,
    offload: bool = False,
) -> Composition:
    """Composable APIs on a tree: fully_shard on the root (or replicate on it) and on any
    subset of the other parameter-holding modules, some grouped; replicate on submodules (half
    the time with find_unused_parameters=True); checkpoint anywhere, before or after
    fully_shard; a 1D or HSDP mesh. With ``mixed_precision``, a MixedPrecisionPolicy on every
    fully_shard call, one per unit (:func:`mixed_precision_policies`). With ``offload`` (ranks
    with an accelerator: FSDP2's CPUOffloadPolicy keeps parameters on the CPU and moves them to
    the accelerator for compute), a third of the compositions take CPUOffloadPolicy in every
    fully_shard call."""
    check_world_size(world_size)
    paths = tree.paths()
    mesh = draw(meshes(world_size)) if hsdp else ()
    shard_size = mesh[1] if mesh else world_size
    candidates = [p for p, n in paths.items() if p and has_params(n)]
    mode = draw(st.sampled_from(["fsdp", "replicate-root", "replicate-sub"])) if replicate else "fsdp"
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    tied = _tied_group(draw, tree, chosen, mode)
    replicates: list[str] = []
    if mode == "replicate-sub":
        free = [p for p in candidates if p not in chosen and p not in (tree.tied or ())]
        replicates = draw(disjoint_subset(free, [], min_size=1))
    if mode == "replicate-root":
        replicates = [""]
    # DDP (inside replicate) refuses a module with no trainable parameter of its own to manage.
    replicates = [r for r in replicates if _trainable_left(tree, r, chosen)]
    if mode == "replicate-root" and not replicates:
        mode = "fsdp"
    # Group disjoint sharded modules into one fully_shard call, sometimes.
    groups: list[list[str]] = []
    for p in chosen:
        # A group must sit under a sharded root: FSDP2 refuses a group as a root of its own.
        same_depth = mode != "replicate-root" and groups and all(q.count(".") == p.count(".") for q in groups[-1])
        if same_depth and draw(st.sampled_from([False, True, True])) and not any(_nested(p, q) for q in groups[-1]):
            groups[-1].append(p)
        else:
            groups.append([p])
    if tied:
        groups.append(tied)
    if mode != "replicate-root":
        groups.append([""])
    # A policy per unit, drawn from the root down: each unit's input arrives in the compute
    # dtype of the unit around it (mixed_precision_policies).
    policies: dict[int, MixedPrecision] = {}
    computes: dict[str, Dtype] = {}
    for i in sorted(range(len(groups)), key=lambda i: _depth(groups[i][0])) if mixed_precision else ():
        policies[i] = draw(mixed_precision_policies(context=_context(groups[i][0], computes), root=groups[i] == [""]))
        for m in groups[i]:
            computes[m] = policies[i].param_dtype or Dtype.FLOAT32
    # One offload policy for the model: under the meta-device path every parameter is
    # materialized on the CPU at once (fuzz/_rank/compose.py:build_composed).
    offloaded = offload and draw(st.sampled_from((False, False, True)))
    specs = []
    for i, group in enumerate(groups):
        mp = policies.get(i)
        reshard = draw(reshard_values(shard_size))
        specs.append(
            ShardSpec(
                path=group[0],
                group=tuple(group[1:]),
                reshard_after_forward=reshard,
                shard_dim=rare_int_reshard_dim_1(draw, reshard, draw(st.sampled_from((0, 1)))),
                mixed_precision=mp,
                offload=offloaded,
            )
        )
    checkpoints = draw(disjoint_subset(list(paths), replicates)) if checkpoint else []
    composition = Composition(
        shards=tuple(specs),
        replicates=tuple(replicates),
        checkpoints=tuple(checkpoints),
        checkpoint_first=draw(st.booleans()),
        mesh=mesh,
        find_unused=bool(replicates) and draw(st.booleans()),
    )
    return fitted_precision(composition)


@st.composite
def wrappers(draw: st.DrawFn, tree: ModuleTree, *, world_size: int, checkpoint: bool = True) -> Composition:
    """DDP (half the time with find_unused_parameters=True) or FSDP1 (FULL_SHARD,
    SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD), FSDP1 with or without auto-wrapping every block,
    with checkpoint on submodules."""
    check_world_size(world_size)
    wrapper = draw(st.sampled_from([w for w in Wrapper if w is not Wrapper.NONE]))
    mesh: tuple[int, ...] = ()
    if wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        mesh = draw(meshes(world_size).filter(bool))
        if known.fsdp1_shard1(Composition(wrapper=wrapper, mesh=mesh)) and not keep_known(
            draw, known.FSDP1_HSDP_SHARD1
        ):
            # A shard dimension of size 1 meets a known FSDP1 bug (pytorch/pytorch#154888,
            # signature ...@fsdp1:shard1) that would hide other mismatches there: rarely.
            mesh = (1, world_size)
    auto_wrap = draw(st.booleans()) if wrapper.value.startswith("fsdp1") else False
    submodules = [p for p in tree.paths() if p]
    checkpoints = draw(disjoint_subset(submodules, [])) if checkpoint else []
    find_unused = wrapper is Wrapper.DDP and draw(st.booleans())
    return Composition(
        wrapper=wrapper, mesh=mesh, auto_wrap=auto_wrap, checkpoints=tuple(checkpoints), find_unused=find_unused
    )


#: Tensor-parallel group size of the TP cases (a (world_size / 2, 2) mesh).
TP_SIZE = 2


def _trainable_linear(node: Node) -> bool:
    return isinstance(node, Leaf) and node.kind is LeafKind.LINEAR and not node.frozen


def tp_candidates(tree: ModuleTree) -> list[TpPair]:
    """Disjoint pairs of trainable Linear leaves of one block with only activations between,
    left to right: where Colwise- and RowwiseParallel can go."""
    pairs: list[TpPair] = []
    for path, node in tree.paths().items():
        if not isinstance(node, Block):
            continue
        prefix = f"{path}." if path else ""
        i = 0
        while i < len(node.children):
            if _trainable_linear(node.children[i]):
                j = i + 1
                while j < len(node.children) and isinstance(node.children[j], Leaf):
                    child = node.children[j]
                    assert isinstance(child, Leaf)
                    if child.kind not in TP_BETWEEN:
                        break
                    j += 1
                if j < len(node.children) and _trainable_linear(node.children[j]):
                    pairs.append(TpPair(f"{prefix}{i}", f"{prefix}{j}"))
                    i = j + 1
                    continue
            i += 1
    return pairs


def _insert(node: Block, at: list[str], index: int, child: Node) -> Block:
    if not at:
        children = (*node.children[:index], child, *node.children[index:])
    else:
        k = int(at[0])
        inner = node.children[k]
        assert isinstance(inner, Block)
        children = (*node.children[:k], _insert(inner, at[1:], index, child), *node.children[k + 1 :])
    return Block(children=children, residual=node.residual, scale=node.scale, buffer=node.buffer)


@st.composite
def tp_blocks(draw: st.DrawFn, *, buffers: bool = True) -> Block:
    """An MLP-like block: Linear, an activation or none, Linear (a tensor-parallel pair); a
    buffer of its own only with ``buffers``."""
    act = draw(st.one_of(st.none(), st.sampled_from(sorted(TP_BETWEEN, key=lambda k: k.value))))
    return Block(
        children=(
            Leaf(LeafKind.LINEAR, bias=draw(st.booleans())),
            *([Leaf(act)] if act is not None else []),
            Leaf(LeafKind.LINEAR, bias=draw(st.booleans())),
        ),
        residual=draw(st.booleans()),
        scale=draw(st.booleans()),
        buffer=draw(st.booleans()) if buffers else False,
    )


@st.composite
def with_tp_blocks(draw: st.DrawFn, tree: ModuleTree, *, buffers: bool = True) -> ModuleTree:
    """``tree`` with one or two MLP-like blocks inserted at random places (:func:`tp_blocks`)."""
    root = tree.root
    assert isinstance(root, Block)
    for _ in range(draw(st.integers(1, 2))):
        blocks = [p for p, n in ModuleTree(width=tree.width, root=root).paths().items() if isinstance(n, Block)]
        at = draw(st.sampled_from(blocks))
        parent = ModuleTree(width=tree.width, root=root).paths()[at]
        assert isinstance(parent, Block)
        index = draw(st.integers(0, len(parent.children)))
        root = _insert(root, at.split(".") if at else [], index, draw(tp_blocks(buffers=buffers)))
    return ModuleTree(width=tree.width, root=root)


@st.composite
def tensor_parallel(
    draw: st.DrawFn, tree: ModuleTree, *, world_size: int, checkpoint: bool = True, mixed_precision: bool = False
) -> Composition:
    """FSDP + TP on a (world_size / 2, 2) mesh: ColwiseParallel / RowwiseParallel on some of the
    tree's Linear pairs (``tp_candidates``, at least one), then fully_shard over the other mesh
    dimension on the root and any other modules (shard placement Shard(0)), checkpoint anywhere;
    with ``mixed_precision``, a MixedPrecisionPolicy per fully_shard unit (:func:`compositions`)."""
    check_world_size(world_size)
    if world_size % TP_SIZE or world_size < 2 * TP_SIZE:
        raise InvalidArgument(f"world_size={world_size} has no (shard, tp) mesh with tp={TP_SIZE} and shard > 1")
    candidates = tp_candidates(tree)
    if not candidates:
        raise InvalidArgument("the tree has no Linear pair for tensor parallelism (see with_tp_blocks)")
    pairs = [c for c in candidates if draw(st.sampled_from([True, True, False]))] or candidates[:1]
    base = draw(
        compositions(
            tree,
            world_size=world_size // TP_SIZE,
            replicate=False,
            checkpoint=checkpoint,
            hsdp=False,
            mixed_precision=mixed_precision,
        )
    )
    shards = tuple(replace(s, shard_dim=0) for s in base.shards)
    return replace(base, shards=shards, tp=tuple(pairs), tp_size=TP_SIZE)


#: About one in this many fully_shard compositions of parity gets FSDPModule knobs.
KNOB_ODDS = 3


def _knob_in_torch(name: str) -> bool:
    """Whether the installed torch has every FSDPModule method the knob ``name`` calls (the
    field metadata "torch" of :class:`fuzz.model.Knobs`)."""
    methods = next(f.metadata["torch"] for f in dataclasses.fields(Knobs) if f.name == name)
    return all(_fsdp_has(m) for m in methods)


def _fsdp_has(method: str) -> bool:
    """Whether the installed torch's FSDPModule has ``method`` (False without torch)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return hasattr(FSDPModule, method)


@st.composite
def fsdp_knobs(
    draw: st.DrawFn,
    comp: Composition,
    *,
    world_size: int,
    scaling: bool,
    accelerator: bool = False,
    tree: ModuleTree | None = None,
) -> Knobs:
    """FSDPModule knobs for ``comp`` (:class:`fuzz.model.Knobs`); none where it has no
    fully_shard unit. ``tree`` (the one ``comp`` composes): also ``set_unshard_in_backward``
    where a unit's parameters are not needed in backward. ``scaling``: also the all-reduce
    hook and the gradient divide factor, which change gradients by design (the parity
    reference scales its own the same way).

    Gloo has no ReduceOp.PREMUL_SUM, which a divide factor other than the shard size is
    reduced with unless ``set_force_sum_reduction_for_comms(True)`` turns it into sums and a
    separate division: on the CPU a divide factor comes with force-sum."""
    if not comp.shards or comp.tp:
        return Knobs()
    fields: dict[str, object] = {}
    fields["forward_prefetch"] = draw(st.sampled_from([0, 1, 0, 2]))
    fields["backward_prefetch"] = draw(st.sampled_from([0, 1, 0, 2]))
    fields["reshard_after_backward_last"] = draw(st.booleans())
    fields["explicit_unshard"] = draw(st.booleans())
    if not comp.replicates and all(isinstance(s.reshard_after_forward, bool) for s in comp.shards):
        fields["late_reshard_after_forward"] = draw(st.sampled_from([None, True, None, False]))
    if (
        "" in comp.sharded_paths
        and not comp.replicates
        and not fields["explicit_unshard"]
        and _knob_in_torch("abort_and_reset")
    ):
        fields["abort_and_reset"] = draw(st.sampled_from([False, False, True]))
    if _knob_in_torch("custom_all_gather"):
        fields["custom_all_gather"] = draw(st.sampled_from([False, False, True]))
        fields["custom_reduce_scatter"] = draw(st.sampled_from([False, False, True]))
    if _knob_in_torch("separate_rs_group"):
        # rare: each call makes a process group
        fields["separate_rs_group"] = draw(st.sampled_from([False, False, False, True]))
    custom = fields.get("custom_all_gather") or fields.get("custom_reduce_scatter")
    if _knob_in_torch("pg_allocator") and not custom:
        fields["pg_allocator"] = draw(st.sampled_from([False, False, True]))
    if _knob_in_torch("rs_max_buffers"):
        fields["rs_max_buffers"] = draw(st.sampled_from([0, 0, 1, 2, 3]))
    if _knob_in_torch("reduce_scatter_unused"):
        # dropped again where the training skips modules (fuzz.model.rules.check_training)
        fields["reduce_scatter_unused"] = draw(st.sampled_from([False, False, True]))
    repeats = tree is not None and any(isinstance(n, Block) and n.repeat for n in tree.paths().values())
    if (
        tree is not None
        and not repeats  # fuzz.model.rules: not with modules called twice
        and _knob_in_torch("no_unshard_in_backward")
        and Layout(tree, comp).unneeded_in_backward()
    ):
        fields["no_unshard_in_backward"] = draw(st.booleans())
    if scaling:
        fields["all_reduce_hook_scale"] = draw(st.sampled_from([None, 2.0, None, 0.5]))
        shard_size = comp.mesh[1] if comp.mesh else world_size
        factor = draw(st.sampled_from([None, 1.0, None, float(world_size), 3.0]))
        fields["gradient_divide_factor"] = factor
        needs_sum = factor is not None and factor != shard_size and not accelerator
        fields["force_sum_reduction"] = needs_sum or draw(st.booleans())
    else:
        fields["force_sum_reduction"] = draw(st.booleans())
    return Knobs(**fields)  # type: ignore[arg-type]
