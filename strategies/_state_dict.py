"""Strategies for the state-dict and checkpoint properties: layouts, rank orders, cases.

Everything drawn here is a case the documented API supports (the rules are in
:mod:`fuzz.case_state`); where a draw would break a rule, it falls back to a valid choice
instead of being filtered away, so every draw yields a case. The known upstream deadlock of
``set_state_dict`` with ``broadcast_from_rank0`` (see docs/state_dict.md) stays in the space,
drawn rarely: each hit costs a whole case deadline. So does the known AssertionError of
``set_optimizer_state_dict`` with full state dicts for an optimizer without tensor state
(SGD without momentum): each hit costs a respawn of the pool.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import Case, Composition, ModuleTree, Optimizer, Training, Wrapper
from fuzz.case_state import (
    Api,
    DcpBody,
    Entry,
    Options,
    StateDictBody,
    is_plain,
    tensor_kind,
)
from strategies._cases import _rare_foreach_on_mixed_params, trainings
from strategies._compositions import compositions
from strategies._odds import KNOWN_BUG_ODDS, KNOWN_HANG_ODDS, one_in
from strategies._trees import module_trees
from strategies._validation import check_bounds, check_world_size


@st.composite
def layouts(draw: st.DrawFn, tree: ModuleTree, *, world_size: int) -> Composition:
    """How a model sits on the ranks: fully_shard (1D or HSDP, with checkpoint), any
    composition of the composable APIs, DDP, or a plain model (empty composition)."""
    check_world_size(world_size)
    kind = draw(st.sampled_from(["fully_shard", "fully_shard", "composable", "ddp", "plain"]))
    if kind == "plain":
        return Composition()
    if kind == "ddp":
        return Composition(wrapper=Wrapper.DDP)
    # compositions() keeps the known int-reshard / Shard(1) FSDP2 bug rare.
    comp: Composition = draw(compositions(tree, world_size=world_size, replicate=kind == "composable"))
    return comp


@st.composite
def rank_orders(draw: st.DrawFn, n: int, *, world_size: int) -> tuple[tuple[int, ...], ...]:
    """For each rank, the order in which it builds a dict of ``n`` entries (a permutation),
    or () for the same order on every rank."""
    check_world_size(world_size)
    if n < 2 or one_in(draw, 4):
        return ()
    return tuple(tuple(draw(st.permutations(range(n)))) for _ in range(world_size))


def _target(draw: st.DrawFn, tree: ModuleTree, source: Composition, world_size: int) -> Composition:
    """The same layout as the source a quarter of the time (exact resume), else another one."""
    if one_in(draw, 4):
        return source
    return draw(layouts(tree, world_size=world_size))


def _in_memory_sharded_ok(source: Composition, target: Composition) -> bool:
    kinds = (tensor_kind(source), tensor_kind(target))
    if kinds[0] != kinds[1] or kinds[0] not in ("dtensor", "plain"):
        return False
    return kinds[0] != "dtensor" or source.mesh == target.mesh


def _stateful_optimizer(draw: st.DrawFn, training: Training, full_load: bool) -> Training:
    """SGD without momentum keeps no tensor state, which set_optimizer_state_dict cannot load
    from a full state dict (a known torch bug): keep that combination rare."""
    stateless = training.optimizer is Optimizer.SGD and not training.momentum
    if full_load and stateless and not one_in(draw, KNOWN_BUG_ODDS):
        return Training(**{**training.__dict__, "momentum": 0.9})
    return training


def _meta_ok(target: Composition) -> bool:
    return not target.replicates and target.wrapper is Wrapper.NONE


@st.composite
def state_dict_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3) -> Case:
    """Cases for ``state_dict``: train, take the state with get_*_state_dict (or FSDP2's
    state_dict), load it into a fresh model under another layout, train both on."""
    check_world_size(world_size)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    tree = draw(module_trees(max_depth=max_depth))
    source = draw(layouts(tree, world_size=world_size))
    target = _target(draw, tree, source, world_size)
    full = draw(st.booleans())
    if not full and not _in_memory_sharded_ok(source, target):
        # In memory a sharded state dict goes only between like layouts on one mesh; the
        # other pairs are what full state dicts are for.
        full = True
    api = draw(st.sampled_from(Api))
    if api is Api.MODULE and (full or tensor_kind(source) != "dtensor" or tensor_kind(target) != "dtensor"):
        api = Api.SPLIT
    save_offload = draw(st.booleans())
    broadcast = full and draw(st.booleans())
    if api is Api.COMBINED and broadcast and not one_in(draw, KNOWN_HANG_ODDS):
        api = Api.SPLIT  # the known set_state_dict deadlock: rarely
    if full and save_offload:
        broadcast = True  # the state is on rank 0 only
        if api is Api.COMBINED and not one_in(draw, KNOWN_HANG_ODDS):
            api = Api.SPLIT
    strict = draw(st.booleans())
    meta = api is not Api.COMBINED and _meta_ok(target) and one_in(draw, 6)
    drop: tuple[int, ...] = ()
    if not strict and not meta:
        drop = tuple(draw(st.lists(st.integers(0, 31), unique=True, max_size=3)))
    training = _stateful_optimizer(draw, draw(trainings(max_steps=max_steps, accumulation=False)), full)
    training = _rare_foreach_on_mixed_params(draw, training, source, target)
    body = StateDictBody(
        tree=tree,
        source=source,
        target=target,
        training=training,
        steps_after=draw(st.sampled_from((1, 2, 0))),
        api=api,
        save=Options(full_state_dict=full, cpu_offload=save_offload),
        load=Options(
            full_state_dict=full, cpu_offload=draw(st.booleans()), broadcast_from_rank0=broadcast, strict=strict
        ),
        target_meta_init=meta,
        drop=drop,
    )
    return Case(property="state_dict", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)


@st.composite
def checkpoint_entries(draw: st.DrawFn) -> tuple[Entry, ...]:
    """The top-level entries of a checkpoint, in a drawn order: the model and optimizer (as
    state dicts, either of them, or one app Stateful wrapping both) beside scalars, a
    counter that runs collectives, and a plain tensor."""
    if draw(st.booleans()):
        core = [Entry.APP]
    else:
        core = draw(st.sampled_from([[Entry.MODEL, Entry.OPTIMIZER], [Entry.MODEL], [Entry.OPTIMIZER]]))
    extras = draw(
        st.lists(
            st.sampled_from([Entry.SCALARS, Entry.COUNTER, Entry.EXTRA]),
            unique=True,
            min_size=1 if len(core) == 1 else 0,
        )
    )
    return tuple(draw(st.permutations(core + extras)))


@st.composite
def dcp_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3) -> Case:
    """Cases for ``dcp``: train, dcp.save (or async_save) a dict built in a per-rank order,
    dcp.load all or part of it in place into a fresh model under another layout (another
    mesh, composition, or a plain model: DCP reshards), train both on."""
    check_world_size(world_size)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    tree = draw(module_trees(max_depth=max_depth))
    source = draw(layouts(tree, world_size=world_size))
    target = _target(draw, tree, source, world_size)
    entries = draw(checkpoint_entries())
    save_full, load_full = draw(st.booleans()), draw(st.booleans())
    save_offload, load_offload = draw(st.booleans()), draw(st.booleans())
    if Entry.APP in entries and load_full and load_offload and not one_in(draw, KNOWN_HANG_ODDS):
        load_offload = False  # the known set_state_dict deadlock (through App.load_state_dict): rarely
    module_stateful = (
        Entry.MODEL in entries
        and Wrapper.DDP not in (source.wrapper, target.wrapper)
        and not (save_full or load_full)
        and draw(st.booleans())
    )
    orders = draw(rank_orders(len(entries), world_size=world_size))
    collective = [e for e in entries if e is Entry.COUNTER or (e is Entry.APP and save_full)]
    if len(collective) > 1 and orders:
        orders = (orders[0],) * world_size  # dcp.save leaves the order of such Statefuls to us
    skip: tuple[Entry, ...] = ()
    if len(entries) > 1 and one_in(draw, 4):
        skip = tuple(draw(st.lists(st.sampled_from(entries), unique=True, min_size=1, max_size=len(entries) - 1)))
    loads_model = any(e in entries and e not in skip for e in (Entry.MODEL, Entry.APP))
    meta = loads_model and _meta_ok(target) and (is_plain(target) or bool(target.shards)) and one_in(draw, 6)
    drop: tuple[int, ...] = ()
    droppable = Entry.MODEL in entries and Entry.MODEL not in skip and not module_stateful and not meta
    if droppable and one_in(draw, 4):
        drop = tuple(draw(st.lists(st.integers(0, 31), unique=True, min_size=1, max_size=3)))
    optimizer_loaded = any(e in entries and e not in skip for e in (Entry.OPTIMIZER, Entry.APP))
    training = draw(trainings(max_steps=max_steps, accumulation=False))
    training = _stateful_optimizer(draw, training, load_full and optimizer_loaded)
    training = _rare_foreach_on_mixed_params(draw, training, source, target)
    body = DcpBody(
        tree=tree,
        source=source,
        target=target,
        entries=entries,
        training=training,
        steps_after=draw(st.sampled_from((1, 2, 0))),
        orders=orders,
        skip=skip,
        drop=drop,
        save_full_state_dict=save_full,
        save_cpu_offload=save_offload,
        load_full_state_dict=load_full,
        load_cpu_offload=load_offload,
        module_stateful=module_stateful,
        async_save=draw(st.booleans()),
        storage_objects=draw(st.booleans()),
        target_meta_init=meta,
    )
    return Case(property="dcp", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
