"""Strategies for the state-dict and checkpoint properties: layouts, rank orders, cases.

``state_dict`` cases of the split and combined APIs put FSDP1 on either side, or both, one
layout in six (``layouts(fsdp1=True)``): get/set_*_state_dict take FSDP1 models too. ``dcp``
cases put FSDP1 on one side or both one case in three, its state moved through the app
Stateful or patched state dicts (``DcpBody.patched``) to and from any layout, or between
FSDP1 models by the classic recipe.

Everything drawn here is a case the documented API supports (the rules are in
:mod:`fuzz.model.state_dict_rules`); where a draw would break a rule, it falls back to a valid choice
instead of being filtered away, so every draw yields a case. The known upstream deadlock of
``set_state_dict`` with ``broadcast_from_rank0`` (see docs/state_dict.md) stays in the space,
drawn rarely: each hit costs a whole case deadline. So do the known errors, each hit a respawn
of the pool (all in docs/state_dict.md, named by ``known_bug``): ``set_optimizer_state_dict``
with full state dicts for an optimizer without tensor state (SGD without momentum); FSDP1
HYBRID_SHARD with a shard dimension of size 1 (pytorch/pytorch#154888); FSDP1's full state
dicts with offload_to_cpu on CPU; FSDP1 NO_SHARD with a unit of frozen parameters; the
classic FSDP1 DCP recipe with a stateless optimizer, or with a rank that holds no chunk of a
parameter beside the scalars entry; async_save's default stager with FSDP1's ShardedTensors;
and ``FileSystemWriter(cache_staged_state_dict=True)`` without an accelerator.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import TypeVar

from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.model import (
    CUSTOM_FQN_MODIFIERS,
    DEFAULT_FQN_MODIFIERS,
    Api,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Leaf,
    LoadPlannerOptions,
    ModuleTree,
    Options,
    Overwrite,
    RequiresGrad,
    SavePlannerOptions,
    StateDictBody,
    Training,
    Wrapper,
    WriterOptions,
    fsdp1_in_memory_problem,
    fused_problem,
    has_params,
    is_fsdp1,
    is_plain,
    scalar_problem,
    schedule_problem,
    sharded_in_memory_problem,
    takes_schedule,
    tensor_kind,
)
from fuzz.model.state_dict import StagerOptions
from fuzz.model.state_dict_rules import meta_target_problem
from strategies._cases import maybe_spmd, rare_foreach_on_mixed_params, trainings, without_container_units
from strategies._compositions import compositions, disjoint_subset, meshes
from strategies._odds import keep_known, one_in
from strategies._options import torch_has
from strategies._trees import module_trees, without_refused_scalars
from strategies._validation import check_bounds, check_world_size


@st.composite
def layouts(draw: st.DrawFn, tree: ModuleTree, *, world_size: int, fsdp1: bool = False) -> Composition:
    """How a model sits on the ranks: fully_shard (1D or HSDP, with checkpoint; about one in
    SPMD_ODDS that can be one as an SPMD program, where torch has it), any composition of the
    composable APIs, DDP, or a plain model (empty composition); with
    ``fsdp1``, one time in six an FSDP1 layout (fsdp1_layouts), for the APIs that take FSDP1
    models beside the others (get/set_*_state_dict)."""
    check_world_size(world_size)
    kinds = ["fully_shard", "fully_shard", "composable", "ddp", "plain"] + ["fsdp1"] * fsdp1
    kind = draw(st.sampled_from(kinds))
    if kind == "fsdp1":
        comp1: Composition = draw(fsdp1_layouts(tree, world_size=world_size))
        return comp1
    if kind == "plain":
        return Composition()
    if kind == "ddp":
        return Composition(wrapper=Wrapper.DDP)
    # compositions() keeps the known int-reshard / Shard(1) FSDP2 bug rare; no API goes on an
    # nn.ModuleList / nn.ModuleDict block (without_container_units).
    comp: Composition = draw(compositions(tree, world_size=world_size, replicate=kind == "composable"))
    return maybe_spmd(draw, tree, without_container_units(tree, comp))


FSDP1_WRAPPERS = (
    Wrapper.FSDP1_FULL_SHARD,
    Wrapper.FSDP1_SHARD_GRAD_OP,
    Wrapper.FSDP1_NO_SHARD,
    Wrapper.FSDP1_HYBRID_SHARD,
)


@st.composite
def fsdp1_layouts(draw: st.DrawFn, tree: ModuleTree, *, world_size: int) -> Composition:
    """FSDP1 with any sharding strategy (HYBRID_SHARD on a 2D mesh), with or without
    auto-wrapping every block, with checkpoint on submodules. A shard dimension of size 1
    under HYBRID_SHARD meets a known FSDP1 bug (pytorch/pytorch#154888), NO_SHARD with a unit
    of frozen parameters another (fsdp1_frozen_unit): both kept rare."""
    check_world_size(world_size)
    wrapper = draw(st.sampled_from(FSDP1_WRAPPERS))
    mesh: tuple[int, ...] = ()
    if wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        mesh = draw(meshes(world_size).filter(bool))
        if known.fsdp1_shard1(Composition(wrapper=wrapper, mesh=mesh)) and not keep_known(
            draw, known.FSDP1_HSDP_SHARD1
        ):
            mesh = (1, world_size)
    checkpoints = draw(disjoint_subset([p for p in tree.paths() if p], []))
    comp = Composition(wrapper=wrapper, mesh=mesh, auto_wrap=draw(st.booleans()), checkpoints=tuple(checkpoints))
    comp = without_container_units(tree, comp)  # no checkpoint on a container: it has no forward
    if known.fsdp1_frozen_unit(comp, tree) and not keep_known(draw, known.FSDP1_FROZEN_UNIT):
        comp = replace(comp, auto_wrap=False)  # a known FSDP1 bug with a unit of frozen parameters: rarely
    return comp


_DCP = "torch.distributed.checkpoint"


@cache
def _torch_version() -> str:
    """The installed torch's version ("" where torch cannot be imported)."""
    try:
        import torch
    except ImportError:
        return ""
    return str(torch.__version__)


def _present(bug: known.KnownBug) -> bool:
    """Whether the installed torch has ``bug`` (known.present); True where torch is missing."""
    version = _torch_version()
    return not version or known.present(bug, version)


def _writer_options(draw: st.DrawFn) -> WriterOptions:
    """FileSystemWriter's I/O options: a file per item, no fsync, 1 to 3 I/O threads, and how
    many bytes each thread copies ahead (every value must give the same checkpoint)."""
    return WriterOptions(
        single_file_per_rank=draw(st.booleans()),
        sync_files=draw(st.booleans()),
        thread_count=draw(st.sampled_from((1, 2, 3))),
        per_thread_copy_ahead=draw(st.sampled_from((10_000_000, 1, 4096))),
    )


def _planners(draw: st.DrawFn, no_dist: bool) -> tuple[SavePlannerOptions | None, LoadPlannerOptions | None]:
    """A DefaultSavePlanner and a DefaultLoadPlanner passed explicitly, each one case in four."""
    save = load = None
    if one_in(draw, 4):
        save = SavePlannerOptions(
            flatten_sharded_tensors=not one_in(draw, 4),
            dedup_save_to_lowest_rank=not no_dist and draw(st.booleans()),
            enable_plan_caching=torch_has(_DCP, "DefaultSavePlanner", "enable_plan_caching") and draw(st.booleans()),
        )
    if one_in(draw, 4):
        load = LoadPlannerOptions(flatten_sharded_tensors=not one_in(draw, 4), allow_partial_load=draw(st.booleans()))
    return save, load


def _has_frozen(tree: ModuleTree) -> bool:
    return any(getattr(n, "frozen", False) for n in tree.paths().values())


def _optimizer_options(draw: st.DrawFn, tree: ModuleTree) -> tuple[bool, bool]:
    """frozen_in_optimizer (half the trees that have frozen parameters) and empty_group (a
    param group without parameters, one case in four)."""
    return _has_frozen(tree) and draw(st.booleans()), one_in(draw, 4)


_Body = TypeVar("_Body", StateDictBody, DcpBody)


def _requires_grad_schedule(draw: st.DrawFn, body: _Body) -> _Body:
    """Half the bodies that can take one get a requires_grad schedule: one or two leaves
    frozen or unfrozen between steps, before or after the state is taken
    (fuzz.model.RequiresGrad). Each change is drawn among the flips the rules of
    fuzz.model.schedule_problem allow; a schedule that still breaks one is not drawn."""
    if getattr(getattr(body, "save", None), "ignore_frozen_params", False):
        return body
    if not (takes_schedule(body.source) and takes_schedule(body.target)):
        return body
    if not draw(st.booleans()):
        return body
    leaves = {p: n for p, n in body.tree.paths().items() if isinstance(n, Leaf) and has_params(n)}
    flags = {p: not n.frozen for p, n in leaves.items()}
    total = body.training.steps + body.steps_after
    changes: list[RequiresGrad] = []
    when: list[int] = draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=2, unique=True))
    # Half the time where it can be, the first change freezes a leaf that trained before the
    # state is taken (its optimizer state then exists while it is frozen).
    freeze_trained = body.training.steps >= 2 and body.training.set_to_none and draw(st.booleans())
    if freeze_trained:
        when = [draw(st.integers(1, body.training.steps - 1)), *[s for s in when if s >= body.training.steps][:1]]
    for step in sorted(when):
        can = [
            p
            for p, on in sorted(flags.items())
            if (on and body.training.set_to_none) or (not on and (not leaves[p].frozen or body.frozen_in_optimizer))
        ]
        if freeze_trained and not changes:
            can = [p for p in can if flags[p]]
        if not can:
            break
        path = draw(st.sampled_from(can))
        flags[path] = not flags[path]
        changes.append(RequiresGrad(path=path, step=step, trainable=flags[path]))

    def valid(schedule: tuple[RequiresGrad, ...]) -> bool:
        args = (body.tree, body.source, body.target, body.training, body.steps_after, schedule)
        return bool(schedule) and schedule_problem(*args, body.frozen_in_optimizer) is None

    schedule = tuple(changes)
    if not valid(schedule):
        return body
    if known.frozen_state_dropped(replace(body, requires_grad=schedule)) and not keep_known(
        draw, known.FROZEN_OPTIM_STATE_DROPPED
    ):
        # set_optimizer_state_dict drops the state of a parameter frozen at the load that
        # trained before (known.FROZEN_OPTIM_STATE_DROPPED): rarely; else a DCP case that can
        # saves that state but leaves the optimizer out of the load (what is saved is
        # still judged: fuzz.properties.state_dict's taken_optimizer), or the freezes before
        # the save go.
        partial = _without_optimizer_load(body, schedule)
        if partial is not None:
            return partial
        schedule = tuple(c for c in schedule if c.trainable or c.step >= body.training.steps)
        if not valid(schedule):
            return body
    return replace(body, requires_grad=schedule)


def _without_optimizer_load(body: _Body, schedule: tuple[RequiresGrad, ...]) -> _Body | None:
    """A DCP body that saves its optimizer entry but skips it on the load, with ``schedule``;
    None where the body cannot be one (not DCP, the optimizer inside the app entry, a rule)."""
    if not isinstance(body, DcpBody) or DcpItem.OPTIMIZER not in body.entries or DcpItem.APP in body.entries:
        return None
    skip = tuple(e for e in body.entries if e in body.skip or e is DcpItem.OPTIMIZER)
    partial = _valid(body, skip=skip, requires_grad=schedule)
    if partial is None or known.frozen_state_dropped(partial):
        return None
    return partial  # type: ignore[return-value]


@st.composite
def rank_orders(draw: st.DrawFn, n: int, *, world_size: int) -> tuple[tuple[int, ...], ...]:
    """For each rank, the order in which it builds a dict of ``n`` entries (a permutation),
    or () for the same order on every rank."""
    check_world_size(world_size)
    if n < 2 or one_in(draw, 4):
        return ()
    return tuple(tuple(draw(st.permutations(range(n)))) for _ in range(world_size))


def _target(
    draw: st.DrawFn, tree: ModuleTree, source: Composition, world_size: int, *, fsdp1: bool = False
) -> Composition:
    """The same layout as the source a quarter of the time (exact resume), else another one."""
    if one_in(draw, 4):
        return source
    return draw(layouts(tree, world_size=world_size, fsdp1=fsdp1))


def _in_memory_sharded_ok(source: Composition, target: Composition) -> bool:
    return sharded_in_memory_problem(source, target) is None


def _stateful_optimizer(draw: st.DrawFn, training: Training, full_load: bool) -> Training:
    """SGD without momentum keeps no tensor state, which set_optimizer_state_dict cannot load
    from a full state dict (a known torch bug), nor the classic FSDP1 recipe from a
    checkpoint (another): keep those combinations rare."""
    if full_load and known.stateless_optimizer(training) and not keep_known(draw, known.STATELESS_FULL):
        return replace(training, momentum=0.9)
    return training


def _meta_ok(target: Composition, tree: ModuleTree, *, assigns: bool = False) -> bool:
    """A meta-device target (fuzz.model.state_dict_rules.meta_target_problem)."""
    return meta_target_problem(tree, target, assigns=assigns) is None


def _keeping_scalars(
    draw: st.DrawFn, tree: ModuleTree, source: Composition, target: Composition
) -> tuple[Composition, Composition]:
    """Three times in four a side whose API refuses the tree's scalar parameter
    (fuzz.model.scalar_problem: fully_shard, FSDP1) becomes a DDP or plain model, which take
    it; else the case strategies take the scalar away (without_refused_scalars). Most layouts
    shard, so without this a scalar parameter would reach few cases (6 of 200 state_dict
    cases in a 300 s campaign with half the sides kept)."""
    sides = [source, target]
    for i, side in enumerate(sides):
        if scalar_problem(tree, side) is not None and not one_in(draw, 4):
            sides[i] = draw(st.sampled_from([Composition(wrapper=Wrapper.DDP), Composition()]))
    return sides[0], sides[1]


@st.composite
def state_trees(draw: st.DrawFn, *, max_depth: int = 3) -> ModuleTree:
    """The trees of the state-dict and DCP cases: half from the extended world (the models
    people train: token embeddings, a head tied to the embedding, RMSNorm, attention, MLPs,
    non-persistent buffers, bare parameters of rank 0 to 3, nn.ModuleList / nn.ModuleDict
    blocks), half from the first one, whose rare option paths keep their rates. The case
    strategies take a scalar parameter away where a side's API refuses it
    (strategies.without_refused_scalars) and the APIs off containers (layouts)."""
    extended = draw(st.booleans())
    return draw(module_trees(max_depth=max_depth, extended=extended, scalars=extended, containers=extended))


@st.composite
def state_dict_cases(
    draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3, accelerator: bool = False
) -> Case:
    """Cases for ``state_dict``: train, take the state with get_*_state_dict (or FSDP2's
    state_dict), load it into a fresh model under another layout, train both on
    (``accelerator`` changes nothing here: CPU offload is the training properties')."""
    check_world_size(world_size)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    tree = draw(state_trees(max_depth=max_depth))
    if draw(st.sampled_from(["layouts", "layouts", "layouts", "layouts", "fsdp1"])) == "fsdp1":
        return _fsdp1_state_dict_case(draw, tree, world_size, max_steps)
    # get/set_*_state_dict take FSDP1 models too: FSDP1 on either side, or both.
    source = draw(layouts(tree, world_size=world_size, fsdp1=True))
    target = _target(draw, tree, source, world_size, fsdp1=True)
    source, target = _keeping_scalars(draw, tree, source, target)
    tree = without_refused_scalars(tree, source, target)
    fsdp1_side = is_fsdp1(source) or is_fsdp1(target)
    full = draw(st.booleans())
    if not full and not _in_memory_sharded_ok(source, target):
        # In memory a sharded state dict goes only between like layouts on one mesh; the
        # other pairs are what full state dicts are for.
        full = True
    api = draw(st.sampled_from([Api.SPLIT, Api.COMBINED, Api.MODULE]))
    if api is Api.MODULE and (
        full or tensor_kind(source) != "dtensor" or tensor_kind(target) != "dtensor" or fsdp1_side
    ):
        api = Api.SPLIT
    save_offload = draw(st.booleans())
    offload_bug = known.full_offload_gathers(full, save_offload, source, world_size)
    if offload_bug and not keep_known(draw, known.FSDP1_FULL_OFFLOAD):
        save_offload = False  # known FSDP1 offload_to_cpu bugs on CPU (fsdp1_full_offload): rarely
    broadcast = full and draw(st.booleans())
    if known.broadcast_empty_combined(api, broadcast) and not keep_known(draw, known.BROADCAST_EMPTY):
        api = Api.SPLIT  # the known set_state_dict deadlock: rarely
    if full and save_offload:
        broadcast = True  # the state is on rank 0 only
        if known.broadcast_empty_combined(api, broadcast) and not keep_known(draw, known.BROADCAST_EMPTY):
            api = Api.SPLIT
    strict = draw(st.booleans())
    meta = api is not Api.COMBINED and _meta_ok(target, tree, assigns=full) and one_in(draw, 6)
    drop: tuple[int, ...] = ()
    if not strict and not meta:
        drop = tuple(draw(st.lists(st.integers(0, 31), unique=True, max_size=3)))
    # An FSDP1 target loads a full optimizer state through FSDP.optim_state_dict_to_load, not
    # the path of the known stateless bug.
    stateless_bug = known.stateless_full_path(full, target)
    # ignore_frozen_params (a third of the trees with frozen parameters, under the APIs whose
    # get takes options): the frozen parameters are left out, so the load is non-strict.
    ignore_frozen = api in (Api.SPLIT, Api.COMBINED) and _has_frozen(tree) and one_in(draw, 3)
    if ignore_frozen:
        strict, meta = False, False
    training = _stateful_optimizer(draw, draw(trainings(max_steps=max_steps, accumulation=False)), stateless_bug)
    training = rare_foreach_on_mixed_params(draw, training, source, target)
    frozen_in_optimizer, empty_group = _optimizer_options(draw, tree)
    # flatten_optimizer_state_dict, half the time (not with an empty param group: the flat
    # format keys hyperparameters by parameter). With full state dicts set_optimizer_state_dict
    # raises KeyError('param_groups.0.params.0') for any model (known.FLAT_FULL_OPTIM): rare.
    flatten = not empty_group and api is not Api.FSDP1 and draw(st.booleans())
    if flatten and full and not keep_known(draw, known.FLAT_FULL_OPTIM):
        flatten = False
    body = StateDictBody(
        tree=tree,
        source=source,
        target=target,
        training=training,
        # FSDP1 optimizer state is judged by resuming
        steps_after=draw(st.sampled_from((1, 2) if fsdp1_side else (1, 2, 0))),
        api=api,
        save=Options(
            full_state_dict=full,
            cpu_offload=save_offload,
            ignore_frozen_params=ignore_frozen,
            flatten_optimizer_state_dict=flatten,
        ),
        load=Options(
            full_state_dict=full,
            cpu_offload=draw(st.booleans()),
            broadcast_from_rank0=broadcast,
            strict=strict,
            flatten_optimizer_state_dict=flatten,
        ),
        target_meta_init=meta,
        drop=drop,
        frozen_in_optimizer=frozen_in_optimizer,
        empty_group=empty_group,
    )
    body = _requires_grad_schedule(draw, _fused_leaves(draw, body))
    return Case(property="state_dict", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


def _fused_leaves(draw: st.DrawFn, body: StateDictBody) -> StateDictBody:
    """Half the bodies that can take them get one or two fused leaves (a leaf held
    under a child its state dict hides, fuzz.model.StateDictBody.fused), whose method has
    torch's default name or another one passed as StateDictOptions(dsd_fqn_modifiers=...),
    half the time each. Three known bugs keep to rare cases: the optimizer's state of their
    parameters (known.FUSED_OPTIM_KEYS; else only leaves whose parameters the optimizer does
    not hold, frozen ones, are fused, so the model's side is still judged), the other name
    with get_model_state_dict (known.FUSED_CUSTOM_NAME) and frozen fused leaves under
    ignore_frozen_params (known.FUSED_IGNORE_FROZEN)."""
    if not torch_has(f"{_DCP}.state_dict", "StateDictOptions", "dsd_fqn_modifiers") or not one_in(draw, 2):
        return body
    frozen = {p for p, n in body.tree.paths().items() if getattr(n, "frozen", False)}
    leaves = [p for p, n in body.tree.paths().items() if isinstance(n, Leaf) and has_params(n)]
    if not keep_known(draw, known.FUSED_OPTIM_KEYS):
        # rarely the leaves the optimizer holds; else frozen leaves it does not hold
        leaves = [p for p in leaves if p in frozen and not body.frozen_in_optimizer]
    if not leaves:
        return body
    chosen = sorted(draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=2, unique=True)))
    name = draw(st.sampled_from([DEFAULT_FQN_MODIFIERS, CUSTOM_FQN_MODIFIERS]))
    if fused_problem(body.tree, tuple(chosen), (body.source, body.target)):
        return body

    def fuse(paths: list[str], method: str) -> StateDictBody:
        return replace(body, fused=tuple(paths), fqn_modifiers=method)

    if known.fused_custom_name(fuse(chosen, name)) and not keep_known(draw, known.FUSED_CUSTOM_NAME):
        name = DEFAULT_FQN_MODIFIERS
    if known.fused_ignore_frozen(fuse(chosen, name)) and not keep_known(draw, known.FUSED_IGNORE_FROZEN):
        chosen = [p for p in chosen if p not in frozen]
    return fuse(chosen, name) if chosen else body


def _fsdp1_state_dict_case(draw: st.DrawFn, tree: ModuleTree, world_size: int, max_steps: int) -> Case:
    """FSDP1's own state dicts between FSDP1 models: full (any strategies; half of them with
    rank0_only, load.broadcast_from_rank0) or sharded (like layouts only, see
    fsdp1_in_memory_problem); offload_to_cpu from save.cpu_offload."""
    source = draw(fsdp1_layouts(tree, world_size=world_size))
    target = source if one_in(draw, 4) else draw(fsdp1_layouts(tree, world_size=world_size))
    tree = without_refused_scalars(tree, source, target)
    full = draw(st.booleans()) or fsdp1_in_memory_problem(source, target) is not None
    frozen_in_optimizer, empty_group = _optimizer_options(draw, tree)
    body = StateDictBody(
        tree=tree,
        source=source,
        target=target,
        training=draw(trainings(max_steps=max_steps, accumulation=False)),
        steps_after=draw(st.sampled_from((1, 2))),
        api=Api.FSDP1,
        save=Options(full_state_dict=full, cpu_offload=draw(st.booleans())),
        load=Options(full_state_dict=full, broadcast_from_rank0=full and draw(st.booleans())),
        frozen_in_optimizer=frozen_in_optimizer,
        empty_group=empty_group,
    )
    if known.fsdp1_full_offload(body, world_size) and not keep_known(draw, known.FSDP1_FULL_OFFLOAD):
        body = replace(body, save=Options(full_state_dict=True))  # known FSDP1 offload bugs on CPU: rarely
    return Case(property="state_dict", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def checkpoint_entries(draw: st.DrawFn) -> tuple[DcpItem, ...]:
    """The top-level entries of a checkpoint, in a drawn order: the model and optimizer (as
    state dicts, either of them, or one app Stateful wrapping both) beside scalars, a
    counter that runs collectives, and a plain tensor."""
    if draw(st.booleans()):
        core = [DcpItem.APP]
    else:
        core = draw(st.sampled_from([[DcpItem.MODEL, DcpItem.OPTIMIZER], [DcpItem.MODEL], [DcpItem.OPTIMIZER]]))
    extras = draw(
        st.lists(
            st.sampled_from([DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA]),
            unique=True,
            min_size=1 if len(core) == 1 else 0,
        )
    )
    return tuple(draw(st.permutations(core + extras)))


@st.composite
def dcp_cases(
    draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3, accelerator: bool = False
) -> Case:
    """Cases for ``dcp``: train, dcp.save (or async_save) a dict built in a per-rank order,
    dcp.load all or part of it in place into a fresh model under another layout (another
    mesh, composition, or a plain model: DCP reshards), train both on. The model and
    optimizer go in as state dicts, in an app Stateful, or as the objects themselves with
    their state dicts patched to get/set_*_state_dict (``patched``; ``accelerator`` changes
    nothing here). Also: FSDP1 models on
    one side or both, moved through app or patched state dicts to and from any layout, or
    between FSDP1 models by the classic sharded recipe; a save over an earlier checkpoint (FileSystemWriter's
    ``overwrite``), several async saves with the source training while they are in flight
    (sometimes through one FileSystemWriter with cache_staged_state_dict), and per-rank
    checkpoints of a plain model saved and loaded with no_dist."""
    check_world_size(world_size)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    tree = draw(state_trees(max_depth=max_depth))
    kind = draw(st.sampled_from(["layouts", "layouts", "layouts", "fsdp1", "fsdp1", "no_dist"]))
    fsdp1, no_dist = kind == "fsdp1", kind == "no_dist"
    # How an FSDP1 side's state moves: the classic recipe (FSDP1 on both sides), or through
    # the distributed state-dict functions (app, patched), to and from any layout.
    how = ""
    if fsdp1:
        sides = draw(st.sampled_from(["both", "both", "source", "target"]))
        if sides == "both":
            source = draw(fsdp1_layouts(tree, world_size=world_size))
            target = source if one_in(draw, 4) else draw(fsdp1_layouts(tree, world_size=world_size))
            how = draw(st.sampled_from(["classic", "classic", "app", "patched"]))
        else:
            fsdp1_side = draw(fsdp1_layouts(tree, world_size=world_size))
            other = draw(layouts(tree, world_size=world_size))
            source, target = (fsdp1_side, other) if sides == "source" else (other, fsdp1_side)
            how = draw(st.sampled_from(["app", "patched"]))
    elif no_dist:
        source = target = Composition()
    else:
        source = draw(layouts(tree, world_size=world_size))
        target = _target(draw, tree, source, world_size)
        source, target = _keeping_scalars(draw, tree, source, target)
    tree = without_refused_scalars(tree, source, target)
    entries = draw(checkpoint_entries())
    if how in ("classic", "patched") and DcpItem.APP in entries:
        # the model and optimizer entries: FSDP1's own state dicts, or the patched objects
        at = entries.index(DcpItem.APP)
        entries = (*entries[:at], DcpItem.MODEL, DcpItem.OPTIMIZER, *entries[at + 1 :])
    if how == "app" and DcpItem.APP not in entries:
        entries = (*(e for e in entries if e not in (DcpItem.MODEL, DcpItem.OPTIMIZER)), DcpItem.APP)
    if no_dist and DcpItem.COUNTER in entries:
        entries = tuple(e for e in entries if e is not DcpItem.COUNTER) or (DcpItem.MODEL,)
    save_full, load_full = draw(st.booleans()), draw(st.booleans())
    save_offload, load_offload = draw(st.booleans()), draw(st.booleans())
    if how == "classic":
        save_full = load_full = False  # offload is the sharded configs' offload_to_cpu
    if no_dist:
        save_full = load_full = save_offload = load_offload = False
    if known.broadcast_empty_app(entries, load_full, load_offload) and not keep_known(draw, known.BROADCAST_EMPTY):
        load_offload = False  # the known set_state_dict deadlock (through App.load_state_dict): rarely
    module_stateful = (
        DcpItem.MODEL in entries
        and Wrapper.DDP not in (source.wrapper, target.wrapper)
        and not fsdp1
        and not (save_full or load_full)
        and draw(st.booleans())
    )
    # The model and optimizer objects themselves, their state dicts patched (as torch's e2e
    # test does): every FSDP1 case that draws it, a quarter of the others that can.
    patched = how == "patched" or (
        not fsdp1
        and not module_stateful
        and (DcpItem.MODEL in entries or DcpItem.OPTIMIZER in entries)
        and one_in(draw, 4)
    )
    probe = DcpBody(
        tree=tree, source=source, target=target, entries=entries, patched=patched, load_full_state_dict=load_full
    )
    if fsdp1 and known.fsdp1_dcp_empty_shard(probe, world_size) and not keep_known(draw, known.FSDP1_DCP_EMPTY_SHARD):
        # A known dcp.load bug with a rank that holds no chunk of an FSDP1 parameter, beside a
        # list (scalars; the optimizer state dict through app or patched): rarely. Without
        # the scalars entry, or else with a full load (plain tensors, nothing flattened away).
        entries = tuple(e for e in entries if e is not DcpItem.SCALARS) or entries
        if known.fsdp1_dcp_empty_shard(replace(probe, entries=entries), world_size):
            load_full, load_offload = True, False
    orders = draw(rank_orders(len(entries), world_size=world_size))
    # Statefuls whose state_dict runs collectives inside dcp.save (DcpBody.collective_entries)
    gathers = save_full or is_fsdp1(source)
    collective = [
        e
        for e in entries
        if e is DcpItem.COUNTER
        or (e is DcpItem.APP and gathers)
        or (patched and gathers and e in (DcpItem.MODEL, DcpItem.OPTIMIZER))
    ]
    if len(collective) > 1 and orders:
        orders = (orders[0],) * world_size  # dcp.save leaves the order of such Statefuls to us
    skip: tuple[DcpItem, ...] = ()
    if len(entries) > 1 and one_in(draw, 4):
        skip = tuple(draw(st.lists(st.sampled_from(entries), unique=True, min_size=1, max_size=len(entries) - 1)))
    loads_model = any(e in entries and e not in skip for e in (DcpItem.MODEL, DcpItem.APP))
    meta = loads_model and _meta_ok(target, tree) and (is_plain(target) or bool(target.shards)) and one_in(draw, 6)
    drop: tuple[int, ...] = ()
    droppable = (
        DcpItem.MODEL in entries
        and DcpItem.MODEL not in skip
        and not module_stateful
        and not patched
        and not meta
        and not fsdp1
    )
    if droppable and one_in(draw, 4):
        drop = tuple(draw(st.lists(st.integers(0, 31), unique=True, min_size=1, max_size=3)))
    optimizer_loaded = any(e in entries and e not in skip for e in (DcpItem.OPTIMIZER, DcpItem.APP))
    training = draw(trainings(max_steps=max_steps, accumulation=False))
    # Stateless SGD meets a known bug of set_optimizer_state_dict with full state dicts (not
    # into FSDP1, which loads through FSDP.optim_state_dict_to_load), and one of the classic
    # FSDP1 recipe (fsdp1_dcp_stateless): rarely.
    stateless_bug = known.stateless_full_path(load_full, target) or how == "classic"
    training = _stateful_optimizer(draw, training, stateless_bug and optimizer_loaded)
    training = rare_foreach_on_mixed_params(draw, training, source, target)
    steps_after = draw(st.sampled_from((1, 2) if fsdp1 else (1, 2, 0)))
    # async_save(no_dist=True) where this torch takes it: each rank saves alone, asynchronously
    async_save = draw(st.booleans()) and (
        not no_dist or torch_has("torch.distributed.checkpoint", "async_save", "no_dist")
    )
    storage_objects = draw(st.booleans())
    if known.default_stager_copies_sharded(async_save, storage_objects, source, save_full):
        # async_save's default stager cannot copy FSDP1's ShardedTensors (a known torch bug): rarely.
        storage_objects = not keep_known(draw, known.FSDP1_ASYNC_DEFAULT_STAGER)
    # Several async saves with training in flight, half the async cases that can.
    async_saves = 0
    if async_save and not no_dist and steps_after and draw(st.booleans()):
        async_saves = draw(st.integers(1, min(3, training.steps)))
    # The staging cache pins memory, which fails on a host without an accelerator (a known torch
    # bug there, so not often); with one it is a feature to exercise, and the cases that can
    # take it are few already (about 3% of dcp cases): a quarter of them.
    cache_staged = (
        async_saves >= 2 and storage_objects and one_in(draw, known.CACHED_STAGING_NEEDS_ACCELERATOR.odds // 4)
    )
    overwrite = Overwrite.NONE
    if storage_objects and not async_saves and not no_dist:
        # every case that can take it saves over an older checkpoint, half of them refused (a
        # failure shrinks to no earlier checkpoint through storage_objects=False); four in five
        # kept overwrite=False at about 5% of dcp cases, the floor of a useful rate
        overwrite = draw(st.sampled_from([Overwrite.TRUE, Overwrite.FALSE]))
    frozen_in_optimizer, empty_group = _optimizer_options(draw, tree)
    writer = _writer_options(draw) if storage_objects and one_in(draw, 3) else WriterOptions()
    save_planner, load_planner = _planners(draw, no_dist)
    caching = save_planner is not None and save_planner.enable_plan_caching
    if caching and _present(known.PLAN_CACHE_FAILED_SAVE):
        # Torch before 2.13 caches save plans before a save succeeds: a save refused by
        # overwrite=False breaks the next one (known.PLAN_CACHE_FAILED_SAVE): rarely. Other
        # saves with plan caching failed there with the same traceback (async saves; a DDP
        # save beside a partial load), not reduced yet: on such a torch plan caching is drawn
        # only for the known bug's path.
        keep = overwrite is Overwrite.FALSE and not async_save and keep_known(draw, known.PLAN_CACHE_FAILED_SAVE)
        if not keep:
            assert save_planner is not None
            save_planner = replace(save_planner, enable_plan_caching=False)
    # A key the checkpoint lacks (with allow_partial_load half the time, else the documented
    # refusal), and the format_utils conversion: collective round trips without an FSDP1 side.
    plain_apis = not no_dist and not fsdp1
    absent = plain_apis and one_in(draw, 6)
    if absent and load_planner is None and draw(st.booleans()):
        load_planner = LoadPlannerOptions(allow_partial_load=True)
    convert = plain_apis and one_in(draw, 8)
    own_group = not no_dist and one_in(draw, 6)  # process_group=: a gloo group of its own
    body = DcpBody(
        tree=tree,
        source=source,
        target=target,
        entries=entries,
        training=training,
        steps_after=steps_after,
        orders=orders,
        skip=skip,
        drop=drop,
        save_full_state_dict=save_full,
        save_cpu_offload=save_offload,
        load_full_state_dict=load_full,
        load_cpu_offload=load_offload,
        module_stateful=module_stateful,
        patched=patched,
        async_save=async_save,
        storage_objects=storage_objects,
        target_meta_init=meta,
        overwrite=overwrite,
        async_saves=async_saves,
        cache_staged=cache_staged,
        no_dist=no_dist,
        frozen_in_optimizer=frozen_in_optimizer,
        empty_group=empty_group,
        writer=writer,
        save_planner=save_planner,
        load_planner=load_planner,
        absent=absent,
        convert=convert,
        own_group=own_group,
    )
    if known.fsdp1_full_offload(body, world_size) and not keep_known(draw, known.FSDP1_FULL_OFFLOAD):
        # known FSDP1 offload_to_cpu bugs on CPU, met through get_*_state_dict: rarely
        body = replace(body, save_cpu_offload=False, load_cpu_offload=False)
    if plain_apis and one_in(draw, 12):
        body = _torch_save_variant(draw, body, world_size)
    body = _async_options(draw, body, accelerator)
    body = _rank_local(draw, body)
    body = _requires_grad_schedule(draw, body)
    return Case(property="dcp", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


def _valid(body: DcpBody, **changes: object) -> DcpBody | None:
    """``replace(body, **changes)``, or None where the rules refuse it."""
    try:
        return replace(body, **changes)  # type: ignore[arg-type]
    except CaseError:
        return None


def _async_options(draw: st.DrawFn, body: DcpBody, accelerator: bool) -> DcpBody:
    """For async saves, where this torch takes them: an explicit DefaultStager one async save
    in four (pinned memory and non-blocking copies only with an accelerator: on the CPU torch
    ignores the first and refuses the second), and the process-based checkpointer one in 50
    (it starts a checkpointing process per rank: about 8 s a case on a 2-core CPU, against
    about 0.5 s for a dcp case without it, so one in 50 async saves adds about a tenth). Not
    the stager with a sharded save of an FSDP1 source: DefaultStager meets the known bug of
    async_save's default stager with ShardedTensors (known.FSDP1_ASYNC_DEFAULT_STAGER)."""
    if not body.async_save or body.cache_staged:
        return body
    stager: StagerOptions | None = None
    sharded = known.default_stager_copies_sharded(True, False, body.source, body.save_full_state_dict)
    if torch_has(_DCP, "async_save", "async_stager") and not sharded and one_in(draw, 4):
        stager = StagerOptions(
            use_pinned_memory=accelerator and draw(st.booleans()),
            use_shared_memory=draw(st.booleans()),
            use_async_staging=draw(st.booleans()),
            use_non_blocking_copy=accelerator and draw(st.booleans()),
        )
    if (
        stager is not None
        and known.stager_reused(replace(body, stager=stager))
        and _present(known.STAGER_REUSED_AFTER_CLOSE)
    ):
        # torch 2.11 closes the stager after each stage and cannot reuse it (a known bug): rarely
        stager = stager if keep_known(draw, known.STAGER_REUSED_AFTER_CLOSE) else None
    process = torch_has(_DCP, "async_save", "async_checkpointer_type") and one_in(draw, 50)
    return _valid(body, stager=stager, process_checkpointer=process) or _valid(body, stager=stager) or body


def _rank_local(draw: st.DrawFn, body: DcpBody) -> DcpBody:
    """use_collectives=False one case in three among those that take it (DcpBody's rules: each
    rank loads what it saved itself), where this torch's save (async_save) takes it."""
    call = "async_save" if body.async_save else "save"
    if not torch_has(_DCP, call, "use_collectives") or not one_in(draw, 3):
        return body
    return _valid(body, use_collectives=False) or body


def _torch_save_variant(draw: st.DrawFn, body: DcpBody, world_size: int) -> DcpBody:
    """The model (and the extra tensor) torch.save'd by rank 0 in full, loaded with
    BroadcastingTorchSaveReader and DynamicMetaLoadPlanner into plain tensors on every rank:
    a full state dict where the target's own tensors are not plain (DTensors meet a torch
    bug there, DcpBody.torch_save_reader), not offloaded to rank 0. No DCP save options."""
    entries: tuple[DcpItem, ...] = (DcpItem.MODEL, DcpItem.EXTRA) if draw(st.booleans()) else (DcpItem.MODEL,)
    entries = tuple(draw(st.permutations(entries)))
    plain_target = tensor_kind(body.target) == "plain"
    load_full = body.load_full_state_dict or not plain_target
    variant = _valid(
        body,
        entries=entries,
        orders=draw(rank_orders(len(entries), world_size=world_size)),
        skip=(),
        save_full_state_dict=True,
        load_full_state_dict=load_full,
        load_cpu_offload=body.load_cpu_offload and not load_full,
        module_stateful=False,
        async_save=False,
        storage_objects=False,
        overwrite=Overwrite.NONE,
        async_saves=0,
        cache_staged=False,
        writer=WriterOptions(),
        save_planner=None,
        load_planner=None,
        absent=False,
        convert=False,
        own_group=False,
        torch_save_reader=True,
    )
    return variant or body
