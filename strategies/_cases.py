"""Strategies for whole cases: trainings, and the cases of each training property."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.model import (
    MATRIX_LEAVES,
    AccumSync,
    Case,
    Compile,
    Composition,
    Dtype,
    InvalidBody,
    Layout,
    LeafKind,
    MetamorphicBody,
    Misuse,
    ModuleTree,
    Optimizer,
    ParityBody,
    Reinit,
    ReinitHow,
    Skip,
    Training,
    Unfreeze,
    Wrapper,
    check_composition,
    check_training,
    clip_problem,
    containers,
    contains,
    eval_problem,
    has_leaf,
    has_params,
    is_ancestor,
    iter_paths,
    owns_params,
    scalar_problem,
)
from fuzz.model import Block as _Block
from fuzz.model import Leaf as _Leaf
from strategies._compositions import (
    KNOB_ODDS,
    TP_SIZE,
    compositions,
    fitted_precision,
    fsdp_knobs,
    meshes,
    rare_int_reshard_dim_1,
    reshard_values,
    tensor_parallel,
    with_tp_blocks,
    wrappers,
)
from strategies._odds import (
    CHECKPOINT_OPTION_ODDS,
    IGNORED_PARAMS_ODDS,
    REPLICATE_OPTION_ODDS,
    SPMD_ODDS,
    keep_known,
    one_in,
)
from strategies._options import (
    checkpoint_options,
    checkpoint_takes,
    fully_shard_refuses_shared,
    has_dp_mesh_dims,
    replicate_options,
)
from strategies._trees import (
    WIDTHS,
    module_trees,
    tied_trees,
    with_gain,
    without_gains,
    without_refused_scalars,
)
from strategies._validation import check_bounds, check_world_size

#: One parity case in this many, where the world size has a (shard, tp) mesh, is FSDP + TP.
TP_ODDS = 4

# The training and invalid properties draw half their trees from the extended world (the models
# people train: strategies.module_trees(extended=True)) and half from the first one, whose rare
# paths (a first Linear for set_unshard_in_backward) keep their rates; a failure shrinks towards
# the first world where it does not need the new ingredients.

#: One case in this many compiles its composed model (see training_schedules): Dynamo's tracing
#: costs far more than a small case's training.
COMPILE_ODDS = 32


def accum_syncs(composition: Composition | None = None, *, hsdp: bool = False) -> list[AccumSync]:
    """The gradient-sync modes of the microbatches before a step's last one that a composition
    has a switch for (all but no_all_reduce without one): replicate has none (every microbatch
    reduces); set_requires_all_reduce(False) (no_all_reduce) needs fully_shard on an HSDP mesh
    (``hsdp`` where no composition is given)."""
    if composition is None:
        return [AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC] + ([AccumSync.NO_ALL_REDUCE] if hsdp else [])
    if composition.replicates:
        return [AccumSync.ALWAYS]
    hsdp = bool(composition.mesh) and composition.wrapper is Wrapper.NONE
    return [AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC] + ([AccumSync.NO_ALL_REDUCE] if hsdp else [])


@st.composite
def trainings(
    draw: st.DrawFn,
    *,
    max_steps: int = 3,
    max_batch_per_rank: int = 3,
    accumulation: bool = True,
    hsdp: bool = False,
    composition: Composition | None = None,
    clipping: bool = False,
    evaluation: bool = False,
    forwards: bool = False,
) -> Training:
    """Optimizer, learning rate and schedule: SGD (with momentum), Adam, AdamW; one or two
    parameter groups; gradient accumulation with every sync mode; zero_grad with and without
    set_to_none; the same or different inputs per rank. Adam's eps stays >= 1e-4 and Adam runs in
    float64 (see Training.eps and fuzz.tolerance).

    ``clipping``: half the time ``clip_grad_norm_`` before each step (max_norm 0.1, which
    clips most steps here, or 1.0).
    ``evaluation``: one time in three an eval / inference_mode forward after each step.
    ``forwards``: one time in four two or three forwards per microbatch before its backward.

    ``composition``: only schedules that composition can train (:func:`accum_syncs`; ``hsdp``
    then follows from it; no clipping where :func:`fuzz.model.clip_problem` says why), so that a
    composition and a training drawn apart make a valid case::

        tree = data.draw(module_trees())
        comp = data.draw(compositions(tree, world_size=2))
        training = data.draw(trainings(composition=comp))
        case = Case("parity", 2, seed, ParityBody(tree=tree, composition=comp, training=training))
    """
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    check_bounds(
        "max_batch_per_rank", max_batch_per_rank, "max_batch_per_rank", max_batch_per_rank, floor=1, ceiling=64
    )
    optimizer = draw(st.sampled_from(Optimizer))
    momentum = draw(st.sampled_from((0.0, 0.9))) if optimizer is Optimizer.SGD else 0.0
    dtype = draw(st.sampled_from([Dtype.FLOAT32, Dtype.FLOAT64])) if optimizer is Optimizer.SGD else Dtype.FLOAT64
    grad_accum = draw(st.integers(1, 3)) if accumulation else 1
    syncs = accum_syncs(composition, hsdp=hsdp)
    accum_sync = draw(st.sampled_from(syncs)) if grad_accum > 1 else AccumSync.ALWAYS
    clip = draw(st.sampled_from((None, 0.1, None, 1.0))) if clipping else None
    training = Training(
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
        # None is foreach on CUDA: see rare_foreach_on_mixed_params.
        foreach=draw(st.sampled_from((None, False))),
        clip_grad_norm=clip,
        eval_forward=draw(st.sampled_from((False, True, False))) if evaluation else False,
        forwards=draw(st.sampled_from((1, 1, 1, 1, 1, 1, 2, 3))) if forwards else 1,
    )
    if composition is not None:
        return _fit_extras(training, composition)
    return training


def without_container_units(tree: ModuleTree, comp: Composition) -> Composition:
    """``comp`` without fully_shard, replicate or checkpoint on the tree's nn.ModuleList /
    nn.ModuleDict blocks (fuzz.model.rules: fully_shard and replicate refuse them); their
    parameters go to the unit above, their items keep theirs."""
    held = set(containers(tree))
    if not held:
        return comp
    shards = []
    for spec in comp.shards:
        members = [p for p in spec.paths if p not in held]
        if members:
            shards.append(replace(spec, path=members[0], group=tuple(members[1:])))
    return replace(
        comp,
        shards=tuple(shards),
        replicates=tuple(p for p in comp.replicates if p not in held),
        checkpoints=tuple(p for p in comp.checkpoints if p not in held),
        find_unused=comp.find_unused and bool([p for p in comp.replicates if p not in held]),
    )


def _fit_extras(training: Training, *comps: Composition) -> Training:
    """``training`` without the clipping or eval forwards a composition cannot take
    (:func:`fuzz.model.clip_problem`, :func:`fuzz.model.eval_problem`)."""
    for comp in comps:
        if clip_problem(comp, training) is not None:
            training = replace(training, clip_grad_norm=None)
        if eval_problem(comp, training) is not None:
            training = replace(training, eval_forward=False)
    return training


def _tp_layer_norm_in_float64(training: Training, tree: ModuleTree, *comps: Composition) -> Training:
    """A case with tensor parallelism and a LayerNorm leaf trains in float64: tensor parallelism
    moves forward values by ulps and a LayerNorm amplifies that beyond float32's policy (the
    reason is written in fuzz.tolerance)."""
    if training.dtype is Dtype.FLOAT32 and any(c.tp for c in comps) and has_leaf(tree.root, LeafKind.LAYER_NORM):
        return replace(training, dtype=Dtype.FLOAT64)
    return training


def _fit_training(training: Training, comp: Composition) -> Training:
    """Drop gradient-sync modes the composition has no switch for: replicate has none (every
    microbatch reduces); no_all_reduce needs fully_shard on an HSDP mesh, elsewhere it becomes
    no_grad_sync (set_requires_gradient_sync(False), or FSDP1's and DDP's no_sync()). An SPMD
    composition trains without torch.compile."""
    sync = training.accum_sync
    if comp.replicates and sync is not AccumSync.ALWAYS:
        sync = AccumSync.ALWAYS
    elif sync is AccumSync.NO_ALL_REDUCE and (not comp.mesh or comp.wrapper is not Wrapper.NONE):
        sync = AccumSync.NO_GRAD_SYNC
    if comp.spmd and training.compile is not Compile.NONE:
        training = replace(training, compile=Compile.NONE)  # not drawn together yet
    if (comp.spmd or comp.tp) and training.forwards > 1:
        training = replace(training, forwards=1)  # not drawn together yet
    training = _fit_extras(training, comp)
    return training if sync is training.accum_sync else replace(training, accum_sync=sync)


def rare_foreach_on_mixed_params(draw: st.DrawFn, training: Training, *comps: Composition) -> Training:
    """foreach=None means the foreach kernels on CUDA, which meet the known bug over a mix of
    fully_shard (DTensor) and replicate (plain tensor) parameters: keep that rare. (On CPU None
    is the per-parameter loop, like False, so CPU cases are unchanged.)"""
    if known.foreach_over_mixed(training, comps) and not keep_known(draw, known.FOREACH_MIXED):
        return replace(training, foreach=False)
    return training


@st.composite
def training_schedules(draw: st.DrawFn, tree: ModuleTree, training: Training, *comps: Composition) -> Training:
    """``training`` with, sometimes, modules left out of forward on some microbatches (unused
    parameters), frozen leaves unfrozen between steps, parameters re-initialised or replaced
    after composing (``Training.reinit``), and torch.compile of the composed model;
    only where :func:`fuzz.model.check_training` accepts them for ``comps``."""
    paths = tree.paths()
    changes: dict[str, Any] = {}
    if draw(st.sampled_from((False, True, False))):
        movable = [p for p in paths if p and p not in tree.shape_changing]  # rules: not the embedding or head
        candidates = [p for p in movable if has_params(paths[p])] or movable
        slots = [(s, m) for s in range(training.steps) for m in range(training.grad_accum)]
        skips: list[Skip] = []
        for path in draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=2, unique=True)):
            for s, m in draw(st.lists(st.sampled_from(slots), min_size=1, unique=True)):
                skips.append(Skip(path=path, step=s, microbatch=m))
        changes["skips"] = tuple(skips)
    frozen = [p for p, n in paths.items() if isinstance(n, _Leaf) and n.frozen]
    if frozen and training.steps > 1 and draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(frozen), min_size=1, max_size=2, unique=True))
        changes["unfreeze"] = tuple(Unfreeze(path=p, step=draw(st.integers(1, training.steps - 1))) for p in chosen)
    # parameters re-initialised or replaced by user code after composing; shrinks to none,
    # then to an in-place scale
    owners = [p for p, n in paths.items() if owns_params(n)]
    if draw(st.sampled_from((False, False, False, True))):
        chosen = draw(st.lists(st.sampled_from(owners), min_size=1, max_size=2, unique=True))
        changes["reinit"] = tuple(Reinit(path=p, how=draw(st.sampled_from(ReinitHow))) for p in chosen)
    if one_in(draw, COMPILE_ODDS):
        changes["compile"] = draw(st.sampled_from([Compile.EAGER, Compile.AOT_EAGER]))
    if not changes:
        return training
    out = replace(training, **changes)
    # Drop what the tree or the compositions cannot take, one skip at a time.
    while True:
        try:
            check_training(tree, comps, out)
            return out
        except CaseError as e:
            if e.path.startswith("training.skips[") and out.skips:
                i = int(e.path.split("[")[1].split("]")[0])
                out = replace(out, skips=out.skips[:i] + out.skips[i + 1 :])
            elif e.path.startswith("training.skips") and out.skips:
                out = replace(out, skips=())
            elif e.path.startswith("training.unfreeze") and out.unfreeze:
                out = replace(out, unfreeze=())
            elif e.path.startswith("training.reinit[") and out.reinit:
                i = int(e.path.split("[")[1].split("]")[0])
                again = out.reinit[i]
                kept = () if again.how is ReinitHow.SCALE else (replace(again, how=ReinitHow.SCALE),)
                out = replace(out, reinit=out.reinit[:i] + kept + out.reinit[i + 1 :])
            elif e.path.startswith("training.forwards") and out.forwards > 1:
                out = replace(out, forwards=1)  # compile was drawn over it: one or the other
            elif e.path.startswith("training.eval_forward") and out.eval_forward:
                out = replace(out, eval_forward=False)  # compile was drawn over it: one or the other
            elif e.path.startswith("training.compile") and out.compile is not Compile.NONE:
                fallback = Compile.EAGER if out.compile is Compile.AOT_EAGER else Compile.NONE
                out = replace(out, compile=fallback)
            else:
                raise


def _checked(tree: ModuleTree, training: Training, *comps: Composition) -> Training:
    """``training`` if check_training accepts it, else without its skips (the rules below change
    skips after training_schedules made them valid)."""
    try:
        check_training(tree, comps, training)
        return training
    except CaseError:
        return replace(training, skips=())


def _rare_unused_after_partial_reduce(
    draw: st.DrawFn, tree: ModuleTree, training: Training, comp: Composition
) -> Training:
    """With set_requires_all_reduce(False) (no_all_reduce), parameters unused on some but not all
    microbatches of a step meet a known FSDP2 bug (their unit's partial reduce-scatter output is
    dropped or fails to add up; signature ``...@fsdp2:unused-no-all-reduce``): keep that rare, and
    otherwise leave such modules out of every microbatch of their step."""
    if known.unused_no_all_reduce(tree, comp, training) and not keep_known(draw, known.UNUSED_NO_ALL_REDUCE):
        whole = {(s.path, s.step) for s in training.skips}
        skips = tuple(
            Skip(path=p, step=st_, microbatch=m) for p, st_ in sorted(whole) for m in range(training.grad_accum)
        )
        return _checked(tree, replace(training, skips=skips), comp)
    return training


def _rare_unfrozen_unresharded(
    draw: st.DrawFn, tree: ModuleTree, training: Training, *comps: Composition, world_size: int = 2
) -> Training:
    """Unfreezing a leaf of an all-frozen fully_shard unit with reshard_after_forward other than
    True meets a known FSDP2 bug under a replicate'd root (signature ``...:unfrozen-unresharded``,
    see fuzz.properties.parity.unfrozen_unresharded_unit), and of an all-frozen FSDP1 NO_SHARD
    unit a known FSDP1 bug (``...:unfrozen-frozen-unit``, fsdp1_unfrozen_in_frozen_unit): keep
    both rare."""
    met = [
        bug
        for c in comps
        for bug, meets in (
            (known.UNFROZEN_UNRESHARDED, known.unfrozen_unresharded_unit(tree, c, training)),
            (known.FSDP1_UNFROZEN_FROZEN_UNIT, known.fsdp1_unfrozen_in_frozen_unit(tree, c, training, world_size)),
        )
        if meets
    ]
    if met and not keep_known(draw, met[0]):
        # without the unfrozen leaves a skip may leave no trainable parameter: drop the skips then
        return _checked(tree, replace(training, unfreeze=()), *comps)
    return training


def _rare_fsdp1_compiled(draw: st.DrawFn, training: Training, world_size: int, *comps: Composition) -> Training:
    """torch.compile over FSDP1 with gradients held into a later forward meets a known Dynamo bug
    (known.FSDP1_COMPILE_SHARDED_GRAD): keep it rare, else leave compile out."""
    met = any(known.fsdp1_compiled_with_sharded_grads(c, training, world_size) for c in comps)
    if met and not keep_known(draw, known.FSDP1_COMPILE_SHARDED_GRAD):
        return replace(training, compile=Compile.NONE)
    return training


def _rare_never_run_under_no_sync(draw: st.DrawFn, tree: ModuleTree, training: Training, comp: Composition) -> Training:
    """Keep :func:`never_run_under_no_sync` rare (1 in KNOWN_BUG_ODDS); else run everything first."""
    if known.never_run_under_no_sync(tree, comp, training) and not keep_known(draw, known.MP_NEVER_RUN_NO_SYNC):
        skips = tuple(s for s in training.skips if (s.step, s.microbatch) != (0, 0))
        return _checked(tree, replace(training, skips=skips), comp)
    return training


def _maybe_api_options(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> Composition:
    """Sometimes options for the composition's replicate calls (about one in
    REPLICATE_OPTION_ODDS) and checkpoint calls (about one in CHECKPOINT_OPTION_ODDS)."""
    if comp.replicates and one_in(draw, REPLICATE_OPTION_ODDS):
        comp = replace(comp, replicate_options=draw(replicate_options(tree, comp)))
    if comp.checkpoints and one_in(draw, CHECKPOINT_OPTION_ODDS):
        comp = replace(comp, checkpoint_options=draw(checkpoint_options(tree, comp)))
    return comp


def _maybe_ignored_params(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> Composition:
    """About one in IGNORED_PARAMS_ODDS compositions that can take them (``fuzz.model.rules``):
    ``ignored_params`` on one fully_shard call, the own parameters of some of the modules it
    manages, never all of them."""
    if not comp.shards or not one_in(draw, IGNORED_PARAMS_ODDS):
        return comp
    layout = Layout(tree, comp)
    index = draw(st.integers(0, len(comp.shards) - 1))
    unit = next(u for u in layout.units if u.api == "fully_shard" and u.index == index)
    owned = layout.owned_by(unit)
    if len(owned) < 2:
        return comp
    chosen = draw(st.lists(st.sampled_from(owned), unique=True, min_size=1, max_size=len(owned) - 1))
    shards = list(comp.shards)
    shards[index] = replace(shards[index], ignored=tuple(p for p in owned if p in chosen))
    candidate = replace(comp, shards=tuple(shards))
    try:
        check_composition(tree, candidate)
    except CaseError:
        return comp
    return candidate


def spmd_of(tree: ModuleTree, comp: Composition) -> Composition | None:
    """``comp`` as an SPMD program (:attr:`fuzz.model.Composition.spmd`), its int
    reshard_after_forward values made True and meta_init dropped (torch does not take the one,
    the suite does not draw the other yet), or None where it cannot be one: torch without
    fully_shard's dp_mesh_dims, or a composition the rules refuse (a tree with dropout among them)."""
    if not has_dp_mesh_dims():
        return None
    shards = tuple(
        s if isinstance(s.reshard_after_forward, bool) else replace(s, reshard_after_forward=True, shard_dim=0)
        for s in comp.shards
    )
    try:
        candidate = replace(comp, shards=shards, meta_init=False, spmd=True)
        check_composition(tree, candidate)
    except CaseError:
        return None
    return candidate


def _spmd_keeping_known(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> Composition | None:
    """:func:`spmd_of`, but None in most draws where the SPMD program would meet DTensor's
    convolution bug (known.DTENSOR_CONV_PARTIAL: wrong values forward, an exception in
    backward): kept rare."""
    candidate = spmd_of(tree, comp)
    if (
        candidate is not None
        and known.spmd_tp_conv(tree, candidate)
        and not keep_known(draw, known.DTENSOR_CONV_PARTIAL)
    ):
        return None
    return candidate


def maybe_spmd(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> Composition:
    """About one in SPMD_ODDS compositions that can be one become an SPMD program; rarely, one
    whose loss is F.mse_loss of the DTensors (a known bug: known.DTENSOR_MSE_LOSS)."""
    candidate = _spmd_keeping_known(draw, tree, comp)
    if candidate is None or not one_in(draw, SPMD_ODDS):
        return comp
    if keep_known(draw, known.DTENSOR_MSE_LOSS):
        candidate = replace(candidate, spmd_mse_loss=True)
    return candidate


def _rare_delay_not_float32(draw: st.DrawFn, training: Training, comp: Composition) -> Composition:
    """Delayed all-reduce over parameters that are not float32 meets a known DDP bug
    (known.DELAY_BUFFER_FLOAT32, an exception): keep it rare, else leave the delay out."""
    if known.delayed_not_float32(comp, training) and not keep_known(draw, known.DELAY_BUFFER_FLOAT32):
        return replace(comp, replicate_options=replace(comp.replicate_options, delay_all_reduce=False))
    return comp


def _maybe_meta_init(draw: st.DrawFn, comp: Composition, tree: ModuleTree) -> Composition:
    """About one in three fully_shard / checkpoint compositions starts from the meta device."""
    if comp.wrapper is Wrapper.NONE and not comp.replicates and draw(st.sampled_from((False, True, False))):
        return replace(comp, meta_init=True)
    return comp


@st.composite
def parity_cases(
    draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3, accelerator: bool = False
) -> Case:
    """Cases for ``parity``: a tree, a composition of the composable APIs (or, one case in
    five, DDP / FSDP1), sometimes with FSDPModule knobs and replicate's / checkpoint's options,
    a training. ``accelerator``: the ranks have one (CPUOffloadPolicy is drawn only then)."""
    check_world_size(world_size)
    if world_size >= 2 * TP_SIZE and world_size % TP_SIZE == 0 and one_in(draw, TP_ODDS):
        return draw(_tensor_parallel_parity_case(world_size, max_depth, max_steps))
    extended = draw(st.booleans())
    tree = draw(module_trees(max_depth=max_depth, extended=extended, scalars=extended, containers=extended))
    if draw(st.sampled_from(["composable", "wrapper", "composable", "composable", "composable"])) == "wrapper":
        comp = without_container_units(tree, draw(wrappers(tree, world_size=world_size)))
        tree = without_refused_scalars(tree, comp)
    else:
        comp = without_container_units(tree, draw(compositions(tree, world_size=world_size, offload=accelerator)))
        tree = without_refused_scalars(tree, comp)
        comp = _maybe_meta_init(draw, comp, tree)
        if comp.shards and one_in(draw, KNOB_ODDS):
            knobs = draw(fsdp_knobs(comp, world_size=world_size, scaling=True, accelerator=accelerator, tree=tree))
            comp = replace(comp, knobs=knobs)
    comp = maybe_spmd(draw, tree, _maybe_ignored_params(draw, tree, _maybe_api_options(draw, tree, comp)))
    training = _fit_training(
        draw(trainings(max_steps=max_steps, hsdp=bool(comp.mesh), clipping=True, evaluation=True, forwards=True)),
        comp,
    )
    training = rare_foreach_on_mixed_params(draw, training, comp)
    training = _rare_unused_after_partial_reduce(draw, tree, draw(training_schedules(tree, training, comp)), comp)
    training = _rare_unfrozen_unresharded(draw, tree, training, comp, world_size=world_size)
    training = _rare_fsdp1_compiled(draw, training, world_size, comp)
    training = _rare_never_run_under_no_sync(draw, tree, training, comp)
    if known.unfrozen_in_frozen_mp_unit(tree, comp, training) and not keep_known(draw, known.MP_FROZEN_AT_LAZY_INIT):
        training = _checked(tree, replace(training, unfreeze=()), comp)
    if comp.knobs.is_set:
        training = _checked(tree, training, comp)  # the rare branches above may add skips
    if known.divide_factor_twice(comp, training, world_size) and not keep_known(draw, known.DIVIDE_FACTOR_TWICE):
        comp = replace(comp, knobs=replace(comp.knobs, gradient_divide_factor=None))
    comp = _rare_delay_not_float32(draw, training, comp)
    if known.compiled_unfreeze_ignored(comp, training) and not keep_known(draw, known.COMPILED_UNFREEZE_PLAIN):
        training = _checked(
            tree,
            replace(training, unfreeze=tuple(u for u in training.unfreeze if u.path not in comp.shard_ignored)),
            comp,
        )
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="parity", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def _tensor_parallel_parity_case(draw: st.DrawFn, world_size: int, max_depth: int, max_steps: int) -> Case:
    """A parity case of FSDP + TP: a tree of a width the tp ranks split evenly, with MLP-like
    blocks inserted so that it has Linear pairs; trained without skips, unfreeze or compile;
    about one in SPMD_ODDS as an SPMD program on the (shard, tp) mesh, where torch has it."""
    widths = st.sampled_from([w for w in WIDTHS if w % TP_SIZE == 0])
    tree = draw(with_tp_blocks(draw(module_trees(max_depth=max_depth, widths=widths))))
    comp = maybe_spmd(draw, tree, draw(tensor_parallel(tree, world_size=world_size)))
    training = _fit_training(draw(trainings(max_steps=max_steps, hsdp=False)), comp)
    training = _tp_layer_norm_in_float64(training, tree, comp)
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="parity", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def mixed_precision_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, accelerator: bool = False) -> Case:
    """Cases for ``mixed_precision``: fully_shard with a MixedPrecisionPolicy on every unit, one
    per unit (param, reduce and output dtypes and input casts that differ between units where
    the dtypes their layers meet allow it: strategies.mixed_precision_policies); one composition
    in KNOB_ODDS with FSDPModule knobs (``fsdp_knobs``, the gradient-scaling ones too: the
    hand-cast reference scales as they do); one case in TP_ODDS, where the world size has a
    (shard, tp) mesh, FSDP + TP. Trees have no buffers: FSDP2 does not cast buffers, so a
    float32 buffer would promote a low-precision activation by design."""
    check_world_size(world_size)
    if world_size >= 2 * TP_SIZE and world_size % TP_SIZE == 0 and one_in(draw, TP_ODDS):
        return draw(_tensor_parallel_mixed_precision_case(world_size, max_depth))
    extended = draw(st.booleans())
    tree = draw(module_trees(max_depth=max_depth, buffers=False, extended=extended, containers=extended))
    drawn = draw(compositions(tree, world_size=world_size, replicate=False, mixed_precision=True, offload=accelerator))
    # without a container's unit, the units inside it meet the dtype of the unit above
    comp = _maybe_meta_init(
        draw, _rare_group_recomputed(draw, fitted_precision(without_container_units(tree, drawn))), tree
    )
    if comp.shards and one_in(draw, KNOB_ODDS):
        knobs = draw(fsdp_knobs(comp, world_size=world_size, scaling=True, accelerator=accelerator, tree=tree))
        comp = replace(comp, knobs=knobs)
    training = _fit_training(draw(trainings(max_steps=2, hsdp=bool(comp.mesh), forwards=True)), comp)
    # Policies speak of float32 parameters (output_dtype=float32 meets float32 layers).
    training = replace(training, dtype=Dtype.FLOAT32)
    training = _rare_unused_after_partial_reduce(draw, tree, draw(training_schedules(tree, training, comp)), comp)
    training = _rare_unfrozen_unresharded(draw, tree, training, comp, world_size=world_size)
    training = _rare_never_run_under_no_sync(draw, tree, training, comp)
    if known.unfrozen_in_frozen_mp_unit(tree, comp, training) and not keep_known(draw, known.MP_FROZEN_AT_LAZY_INIT):
        training = _checked(tree, replace(training, unfreeze=()), comp)
    if comp.knobs.is_set:
        training = _checked(tree, training, comp)  # the rare branches above may add skips
    if known.divide_factor_twice(comp, training, world_size) and not keep_known(draw, known.DIVIDE_FACTOR_TWICE):
        comp = replace(comp, knobs=replace(comp.knobs, gradient_divide_factor=None))
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


def _rare_group_recomputed(draw: st.DrawFn, comp: Composition) -> Composition:
    """A grouped unit with an output_dtype recomputed in part, and a unit recomputed inside a
    checkpoint region, meet a known FSDP2 bug (known.GROUP_FORCED_IN_RECOMPUTE): keep it rare,
    else leave out the checkpoints over a unit."""
    if known.group_recomputed_in_part(comp) and not keep_known(draw, known.GROUP_FORCED_IN_RECOMPUTE):
        over_unit = {c for c in comp.checkpoints if any(is_ancestor(c, m) for m in comp.sharded_paths)}
        return replace(comp, checkpoints=tuple(c for c in comp.checkpoints if c not in over_unit))
    return comp


@st.composite
def _tensor_parallel_mixed_precision_case(draw: st.DrawFn, world_size: int, max_depth: int) -> Case:
    """A mixed_precision case of FSDP + TP: the parity path's tree (a width the tp ranks split
    evenly, MLP-like blocks inserted for the Linear pairs; no buffers, as above) and mesh, a
    MixedPrecisionPolicy per fully_shard unit; trained in float32 without skips, unfreeze or
    compile (the parity path's TP cases draw none)."""
    widths = st.sampled_from([w for w in WIDTHS if w % TP_SIZE == 0])
    tree = draw(with_tp_blocks(draw(module_trees(max_depth=max_depth, widths=widths, buffers=False)), buffers=False))
    comp = _rare_group_recomputed(draw, draw(tensor_parallel(tree, world_size=world_size, mixed_precision=True)))
    training = _fit_training(draw(trainings(max_steps=2, hsdp=False)), comp)
    training = replace(training, dtype=Dtype.FLOAT32)
    body = ParityBody(tree=tree, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def metamorphic_variants(
    draw: st.DrawFn, tree: ModuleTree, comp: Composition, *, world_size: int, accelerator: bool = False
) -> Composition:
    """``comp`` with one change that must not change numerics (among them replicate's options
    but ``ignored_modules``, and checkpoint's options, and the same composition as an SPMD
    program, :func:`spmd_of`); with an ``accelerator``, also CPUOffloadPolicy on or off for
    every fully_shard call."""
    # meta_init twice: it only applies without replicate (else a wrapper is drawn), and with half
    # the trees extended it was 3.6% of 500 drawn variants (tests/test_strategies.py wants 5%)
    changes = ["checkpoint", "meta_init", "meta_init", "wrapper", "checkpoint_order", "reshard", "mesh", "find_unused"]
    if accelerator and comp.shards:
        changes.append("offload")
    if comp.shards and not comp.tp:
        changes.append("knobs")
    if comp.replicates:
        changes.append("replicate_options")
    if comp.checkpoints:
        changes.append("checkpoint_options")
    spmd = _spmd_keeping_known(draw, tree, comp)
    if spmd is not None:
        changes.append("spmd")
    change = draw(st.sampled_from(changes))
    if change == "spmd" and spmd is not None:
        # the same training as an SPMD program: the reshard values it cannot take are True in both
        return spmd
    if change == "replicate_options":
        # Only the options that change no numbers: ignored_modules keeps gradients local.
        opts = draw(replicate_options(tree, comp, local=False))
        if opts.is_set:
            return replace(comp, replicate_options=opts)
        change = "find_unused"
    if change == "checkpoint_options":
        ckpt = draw(checkpoint_options(tree, comp))
        if ckpt.is_set:
            return replace(comp, checkpoint_options=ckpt)
        change = "checkpoint_order"
    if change == "knobs":
        knobs = draw(fsdp_knobs(comp, world_size=world_size, scaling=False, accelerator=accelerator, tree=tree))
        if knobs.is_set:
            return replace(comp, knobs=knobs)
        change = "reshard"
    if change == "offload":
        on = not any(s.offload for s in comp.shards)
        return replace(comp, shards=tuple(replace(s, offload=on) for s in comp.shards))
    if change == "find_unused" and comp.replicates:
        return replace(comp, find_unused=not comp.find_unused)
    if change == "meta_init" and not comp.replicates:
        return replace(comp, meta_init=not comp.meta_init)
    if change == "checkpoint":
        if comp.checkpoints:
            return replace(comp, checkpoints=())
        blocked = list(comp.replicates)
        free = [p for p in tree.paths() if not any(contains(b, p) or contains(p, b) for b in blocked)]
        return replace(comp, checkpoints=tuple(free[:1]))
    if change == "checkpoint_order":
        return replace(comp, checkpoint_first=not comp.checkpoint_first)
    if change == "reshard":
        shard_size = comp.mesh[1] if comp.mesh else world_size
        resharded = []
        for s in comp.shards:
            reshard = draw(reshard_values(shard_size))
            shard_dim = rare_int_reshard_dim_1(draw, reshard, s.shard_dim)
            resharded.append(replace(s, reshard_after_forward=reshard, shard_dim=shard_dim))
        return replace(comp, shards=tuple(resharded))
    if change == "mesh":
        mesh = draw(meshes(world_size))
        # An int reshard_after_forward is tied to the old shard size; True is valid for any.
        shards = tuple(
            s if isinstance(s.reshard_after_forward, bool) else replace(s, reshard_after_forward=True)
            for s in comp.shards
        )
        return replace(comp, mesh=mesh, shards=shards)
    return draw(wrappers(tree, world_size=world_size))


@st.composite
def metamorphic_cases(
    draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3, accelerator: bool = False
) -> Case:
    """Cases for ``metamorphic``: a composition and a variant that must train identically."""
    check_world_size(world_size)
    extended = draw(st.booleans())
    tree = draw(module_trees(max_depth=max_depth, extended=extended, scalars=extended, containers=extended))
    comp = without_container_units(tree, draw(compositions(tree, world_size=world_size, offload=accelerator)))
    tree = without_refused_scalars(tree, comp)
    variant = draw(metamorphic_variants(tree, comp, world_size=world_size, accelerator=accelerator))
    if scalar_problem(tree, variant) is not None:  # a variant of fully_shard or FSDP1 over a gain
        tree = without_gains(tree)
        variant = draw(metamorphic_variants(tree, comp, world_size=world_size, accelerator=accelerator))
    variant = without_container_units(tree, variant)
    training = _fit_extras(
        draw(trainings(max_steps=max_steps, accumulation=False, clipping=True, evaluation=True, forwards=True)),
        comp,
    )
    training = _fit_training(training, variant)  # no accumulation here: only an SPMD variant's compile goes
    training = _tp_layer_norm_in_float64(training, tree, comp, variant)
    training = rare_foreach_on_mixed_params(draw, training, comp, variant)
    training = draw(training_schedules(tree, training, comp, variant))
    training = _rare_unfrozen_unresharded(draw, tree, training, comp, variant, world_size=world_size)
    training = _rare_fsdp1_compiled(draw, training, world_size, comp, variant)
    comp, variant = _rare_delay_not_float32(draw, training, comp), _rare_delay_not_float32(draw, training, variant)
    body = MetamorphicBody(tree=tree, composition=comp, variant=variant, training=training)
    return Case(property="metamorphic", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


def _has_matrix(tree: ModuleTree, path: str) -> bool:
    node = tree.paths()[path]
    nodes = [n for _, n in iter_paths(node)] if not isinstance(node, _Leaf) else [node]
    return any(isinstance(n, _Leaf) and n.kind in MATRIX_LEAVES for n in nodes)


@st.composite
def invalid_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 2, accelerator: bool = False) -> Case:
    """Cases for ``invalid``: one documented misuse on a parameter-holding module
    (``accelerator`` changes nothing here)."""
    check_world_size(world_size)
    misuse = draw(st.sampled_from(Misuse))
    if misuse is Misuse.CHECKPOINT_USE_REENTRANT and not checkpoint_takes("use_reentrant"):
        misuse = Misuse.REPLICATE_AFTER_FULLY_SHARD
    if misuse is Misuse.TIED_ACROSS_UNITS and not fully_shard_refuses_shared():
        misuse = Misuse.REPLICATE_AFTER_FULLY_SHARD
    if misuse is Misuse.CONTAINER_UNIT:
        tree = draw(module_trees(max_depth=max(max_depth, 2), extended=True, containers=True))
        held = [p for p in containers(tree) if has_params(tree.paths()[p])]
        if held:
            body = InvalidBody(tree=tree, misuse=misuse, path=draw(st.sampled_from(held)))
            return Case(property="invalid", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
        misuse = Misuse.REPLICATE_AFTER_FULLY_SHARD
    if misuse is Misuse.SCALAR_UNDER_FULLY_SHARD:
        tree = draw(module_trees(max_depth=max_depth, extended=draw(st.booleans())))
        blocks = [p for p, n in tree.paths().items() if isinstance(n, _Block) and (p or tree.head is None)]
        path = draw(st.sampled_from(blocks))
        body = InvalidBody(tree=with_gain(tree, path), misuse=misuse, path=path)
        return Case(property="invalid", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
    if misuse is Misuse.TIED_ACROSS_UNITS:
        tree = draw(tied_trees(max_depth=max_depth))
        assert tree.tied is not None
        body = InvalidBody(tree=tree, misuse=misuse, path=draw(st.sampled_from(tree.tied)))
        return Case(property="invalid", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
    widths = None
    if misuse is Misuse.UNEVEN_SHARD_DIM_1:
        widths = st.sampled_from([w for w in range(1, 13) if w % world_size]) if world_size > 1 else None
        if widths is None:
            misuse = Misuse.REPLICATE_AFTER_FULLY_SHARD
    tree = draw(module_trees(max_depth=max_depth, widths=widths, extended=draw(st.booleans())))
    paths = [p for p, n in tree.paths().items() if has_params(n)]
    if misuse is Misuse.UNEVEN_SHARD_DIM_1:
        paths = [p for p in paths if _has_matrix(tree, p)]
        if not paths:
            misuse, paths = Misuse.REPLICATE_AFTER_FULLY_SHARD, [p for p, n in tree.paths().items() if has_params(n)]
    body = InvalidBody(tree=tree, misuse=misuse, path=draw(st.sampled_from(paths)))
    return Case(property="invalid", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
