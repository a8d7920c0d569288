"""Strategies for whole cases: trainings, and the cases of each training property."""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import (
    AccumSync,
    Case,
    Composition,
    Dtype,
    InvalidBody,
    LeafKind,
    MetamorphicBody,
    Misuse,
    ModuleTree,
    Optimizer,
    ParityBody,
    Training,
    Wrapper,
    has_params,
    iter_paths,
)
from fuzz.case import Leaf as _Leaf
from strategies._compositions import compositions, meshes, rare_int_reshard_dim_1, reshard_values, wrappers
from strategies._odds import KNOWN_BUG_ODDS, one_in
from strategies._trees import module_trees
from strategies._validation import check_bounds, check_world_size


@st.composite
def trainings(
    draw: st.DrawFn, *, max_steps: int = 3, max_batch_per_rank: int = 3, accumulation: bool = True, hsdp: bool = False
) -> Training:
    """Optimizer, learning rate and schedule: SGD (with momentum), Adam, AdamW; one or two
    parameter groups; gradient accumulation with every sync mode; zero_grad with and without
    set_to_none; the same or different inputs per rank. Adam's eps stays >= 1e-4 and Adam runs in
    float64 (see Training.eps and fuzz.tolerance)."""
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    check_bounds(
        "max_batch_per_rank", max_batch_per_rank, "max_batch_per_rank", max_batch_per_rank, floor=1, ceiling=64
    )
    optimizer = draw(st.sampled_from(Optimizer))
    momentum = draw(st.sampled_from((0.0, 0.9))) if optimizer is Optimizer.SGD else 0.0
    dtype = draw(st.sampled_from([Dtype.FLOAT32, Dtype.FLOAT64])) if optimizer is Optimizer.SGD else Dtype.FLOAT64
    grad_accum = draw(st.integers(1, 3)) if accumulation else 1
    syncs = [AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC] + ([AccumSync.NO_ALL_REDUCE] if hsdp else [])
    accum_sync = draw(st.sampled_from(syncs)) if grad_accum > 1 else AccumSync.ALWAYS
    return Training(
        optimizer=optimizer,
        lr=draw(st.sampled_from((0.01, 0.05, 0.1))),
        momentum=momentum,
        eps=draw(st.sampled_from((1e-4, 1e-3))),
        steps=draw(st.integers(1, max_steps)),
        batch_per_rank=draw(st.integers(1, max_batch_per_rank)),
        dtype=dtype,
        grad_accum=grad_accum,
        accum_sync=accum_sync,
        set_to_none=draw(st.booleans()),
        same_input=draw(st.booleans()),
        param_groups=draw(st.sampled_from((1, 2))),
        # foreach=True over fully_shard + replicate parameters hits a known torch bug (corpus:
        # pytorch/pytorch#183207); its minimal cases are kept there, the strategy draws the rest.
        # None is foreach on CUDA: see _rare_foreach_on_mixed_params.
        foreach=draw(st.sampled_from((None, False))),
    )


def _fit_training(training: Training, comp: Composition) -> Training:
    """Drop gradient-sync modes the composition has no switch for: replicate has none (every
    microbatch reduces); no_all_reduce needs fully_shard on an HSDP mesh, elsewhere it becomes
    no_grad_sync (set_requires_gradient_sync(False), or FSDP1's and DDP's no_sync())."""
    sync = training.accum_sync
    if comp.replicates and sync is not AccumSync.ALWAYS:
        sync = AccumSync.ALWAYS
    elif sync is AccumSync.NO_ALL_REDUCE and (not comp.mesh or comp.wrapper is not Wrapper.NONE):
        sync = AccumSync.NO_GRAD_SYNC
    return training if sync is training.accum_sync else Training(**{**training.__dict__, "accum_sync": sync})


def _rare_foreach_on_mixed_params(draw: st.DrawFn, training: Training, *comps: Composition) -> Training:
    """foreach=None means the foreach kernels on CUDA, which meet the known bug over a mix of
    fully_shard (DTensor) and replicate (plain tensor) parameters: keep that rare. (On CPU None
    is the per-parameter loop, like False, so CPU cases are unchanged.)"""
    mixed = any(c.shards and c.replicates for c in comps)
    if training.foreach is None and mixed and not one_in(draw, KNOWN_BUG_ODDS):
        return Training(**{**training.__dict__, "foreach": False})
    return training


def _maybe_meta_init(draw: st.DrawFn, comp: Composition) -> Composition:
    """About one in three fully_shard / checkpoint compositions starts from the meta device."""
    if comp.wrapper is Wrapper.NONE and not comp.replicates and draw(st.sampled_from((False, True, False))):
        return Composition(**{**comp.__dict__, "meta_init": True})
    return comp


@st.composite
def parity_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3) -> Case:
    """Cases for ``parity``: a tree, a composition of the composable APIs (or, one case in
    five, DDP / FSDP1), a training."""
    check_world_size(world_size)
    tree = draw(module_trees(max_depth=max_depth))
    if draw(st.sampled_from(["composable", "wrapper", "composable", "composable", "composable"])) == "wrapper":
        comp = draw(wrappers(tree, world_size=world_size))
    else:
        comp = _maybe_meta_init(draw, draw(compositions(tree, world_size=world_size)))
    training = _fit_training(draw(trainings(max_steps=max_steps, hsdp=bool(comp.mesh))), comp)
    training = _rare_foreach_on_mixed_params(draw, training, comp)
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="parity", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def mixed_precision_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3) -> Case:
    """Cases for ``mixed_precision``: fully_shard with MixedPrecisionPolicy on every unit.
    Trees have no buffers: FSDP2 does not cast buffers, so a float32 buffer would promote a
    low-precision activation by design."""
    check_world_size(world_size)
    tree = draw(module_trees(max_depth=max_depth, buffers=False))
    comp = _maybe_meta_init(
        draw, draw(compositions(tree, world_size=world_size, replicate=False, mixed_precision=True))
    )
    training = _fit_training(draw(trainings(max_steps=2, hsdp=bool(comp.mesh))), comp)
    # Policies speak of float32 parameters (output_dtype=float32 meets float32 layers).
    training = Training(**{**training.__dict__, "dtype": Dtype.FLOAT32})
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def metamorphic_variants(draw: st.DrawFn, tree: ModuleTree, comp: Composition, *, world_size: int) -> Composition:
    """``comp`` with one change that must not change numerics."""
    change = draw(st.sampled_from(["checkpoint", "meta_init", "wrapper", "checkpoint_order", "reshard", "mesh"]))
    if change == "meta_init" and not comp.replicates:
        return Composition(**{**comp.__dict__, "meta_init": not comp.meta_init})
    if change == "checkpoint":
        if comp.checkpoints:
            return Composition(**{**comp.__dict__, "checkpoints": ()})
        blocked = list(comp.replicates)
        free = [p for p in tree.paths() if not any(p == b or b == "" or p.startswith(b + ".") for b in blocked)]
        return Composition(**{**comp.__dict__, "checkpoints": tuple(free[:1])})
    if change == "checkpoint_order":
        return Composition(**{**comp.__dict__, "checkpoint_first": not comp.checkpoint_first})
    if change == "reshard":
        shard_size = comp.mesh[1] if comp.mesh else world_size
        resharded = []
        for s in comp.shards:
            reshard = draw(reshard_values(shard_size))
            shard_dim = rare_int_reshard_dim_1(draw, reshard, s.shard_dim)
            resharded.append(type(s)(**{**s.__dict__, "reshard_after_forward": reshard, "shard_dim": shard_dim}))
        return Composition(**{**comp.__dict__, "shards": tuple(resharded)})
    if change == "mesh":
        mesh = draw(meshes(world_size))
        # An int reshard_after_forward is tied to the old shard size; True is valid for any.
        shards = tuple(
            s if isinstance(s.reshard_after_forward, bool) else type(s)(**{**s.__dict__, "reshard_after_forward": True})
            for s in comp.shards
        )
        return Composition(**{**comp.__dict__, "mesh": mesh, "shards": shards})
    return draw(wrappers(tree, world_size=world_size))


@st.composite
def metamorphic_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3) -> Case:
    """Cases for ``metamorphic``: a composition and a variant that must train identically."""
    check_world_size(world_size)
    tree = draw(module_trees(max_depth=max_depth))
    comp = draw(compositions(tree, world_size=world_size))
    variant = draw(metamorphic_variants(tree, comp, world_size=world_size))
    training = draw(trainings(max_steps=max_steps, accumulation=False))
    training = _rare_foreach_on_mixed_params(draw, training, comp, variant)
    body = MetamorphicBody(tree=tree, composition=comp, variant=variant, training=training)
    return Case(property="metamorphic", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


def _has_matrix(tree: ModuleTree, path: str) -> bool:
    node = tree.paths()[path]
    nodes = [n for _, n in iter_paths(node)] if not isinstance(node, _Leaf) else [node]
    return any(isinstance(n, _Leaf) and n.kind in (LeafKind.LINEAR, LeafKind.CONV1D) for n in nodes)


@st.composite
def invalid_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 2) -> Case:
    """Cases for ``invalid``: one documented misuse on a parameter-holding module."""
    check_world_size(world_size)
    misuse = draw(st.sampled_from(Misuse))
    widths = None
    if misuse is Misuse.UNEVEN_SHARD_DIM_1:
        widths = st.sampled_from([w for w in range(1, 13) if w % world_size]) if world_size > 1 else None
        if widths is None:
            misuse = Misuse.REPLICATE_AFTER_FULLY_SHARD
    tree = draw(module_trees(max_depth=max_depth, widths=widths))
    paths = [p for p, n in tree.paths().items() if has_params(n)]
    if misuse is Misuse.UNEVEN_SHARD_DIM_1:
        paths = [p for p in paths if _has_matrix(tree, p)]
        if not paths:
            misuse, paths = Misuse.REPLICATE_AFTER_FULLY_SHARD, [p for p, n in tree.paths().items() if has_params(n)]
    body = InvalidBody(tree=tree, misuse=misuse, path=draw(st.sampled_from(paths)))
    return Case(property="invalid", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
