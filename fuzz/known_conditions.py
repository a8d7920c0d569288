"""The predicates the known bugs' conditions are made of (:attr:`fuzz.known_record.KnownBug.condition`),
over the model's data. Strategies call them on the parts they draw one by one, to keep a known
bug rare (``strategies._odds.keep_known``); the records in :mod:`fuzz.known_bugs` combine them into
the condition over a whole case. Each names the record it stands for (``:data:`NAME```, a record
of :mod:`fuzz.known_bugs`).

Imports only the standard library and the model.
"""

from __future__ import annotations

from fuzz.known_record import compositions
from fuzz.model import (
    DEFAULT_FQN_MODIFIERS,
    PARAM_LEAVES,
    AccumSync,
    Api,
    Block,
    Body,
    Case,
    Compile,
    Composition,
    ContextFn,
    DcpBody,
    DcpItem,
    Dtype,
    Layout,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Overwrite,
    StateDictBody,
    Training,
    Wrapper,
    contains,
    fsdp1_gathers,
    has_leaf,
    has_params,
    is_ancestor,
    is_fsdp1,
    owns_params,
    tensor_kind,
    trained_then_frozen,
)

# --------------------------------------------------------------------------- conditions: training


def int_reshard_dim1(comp: Composition) -> bool:
    """:data:`INT_RESHARD_DIM1`: a fully_shard unit with an int reshard_after_forward whose
    parameters are placed Shard(1)."""
    return any(not isinstance(s.reshard_after_forward, bool) and s.shard_dim for s in comp.shards)


def foreach_over_mixed(training: Training, comps: tuple[Composition, ...]) -> bool:
    """:data:`FOREACH_MIXED` where the foreach kernels may run: ``foreach`` True, or None (foreach
    on CUDA, a loop on CPU) over fully_shard (DTensor) and replicate (plain) parameters together."""
    return training.foreach is not False and any(c.shards and c.replicates for c in comps)


def shard1(comp: Composition) -> bool:
    """A (replicate, shard) mesh whose shard dimension has size 1: a degenerate setup that takes
    its own code paths (FSDP1 falls back to NO_SHARD there: :data:`FSDP1_HSDP_SHARD1`)."""
    return bool(comp.mesh) and comp.mesh[1] == 1


def fsdp1_shard1(comp: Composition) -> bool:
    """:data:`FSDP1_HSDP_SHARD1`: FSDP1 HYBRID_SHARD whose shard dimension has size 1 (and more
    than one replica): it falls back to NO_SHARD and never averages gradients across the
    replicas."""
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[1] == 1 and comp.mesh[0] > 1


def frozen_int_reshard_unit(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`FROZEN_INT_RESHARD`: a fully_shard unit with an int reshard_after_forward manages
    only frozen parameters (modules inside a nested unit or a replicate are not its own)."""
    layout = Layout(tree, comp)
    return any(
        u.api == "fully_shard"
        and not isinstance(comp.shards[u.index].reshard_after_forward, bool)
        and layout.frozen_only(u)
        for u in layout.units
    )


def int_reshard_inference(comp: Composition, training: Training) -> bool:
    """:data:`FROZEN_INT_RESHARD` met through an inference forward: a fully_shard unit with an int
    reshard_after_forward, and ``Training.eval_forward``. The inference forward after a step
    leaves the unit in its post-forward state (no backward follows to reshard it), and the
    parameters read then are that state's DTensors."""
    return training.eval_forward and any(not isinstance(s.reshard_after_forward, bool) for s in comp.shards)


def unfrozen_unresharded_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`UNFROZEN_UNRESHARDED`: a leaf unfrozen later lies in a fully_shard unit whose
    reshard_after_forward is not True, inside an outermost fully_shard unit (one no other
    encloses) that holds only frozen parameters at the start. Such an outermost unit (under a
    replicate'd root) is an FSDP2 root whose output needs no gradient, so FSDP2 never queues its
    post-backward callback: its units keep their unsharded parameters registered after
    backward, and requires_grad_(True) on a sharded parameter (the one the optimizer holds)
    never reaches them."""
    unfrozen = {u.path for u in training.unfreeze}
    return any(p in unfrozen for p in unresharded_frozen(tree, comp))


def frozen_unit_run_twice_checkpointed(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`FROZEN_UNIT_RECOMPUTED_UNRESHARDED`: a composable fully_shard unit that manages only
    frozen parameters runs more than once in one forward (a block with ``repeat`` at or above it)
    and lies at or under a checkpointed module. FSDP2 leaves such a unit unsharded after
    backward although reshard_after_backward is True (docs/known_bugs.md)."""
    if comp.wrapper is not Wrapper.NONE or not comp.checkpoints:
        return False
    layout = Layout(tree, comp)
    twice = {p for p in layout.paths if _runs_twice(layout, p)}
    for unit in layout.units:
        if unit.api != "fully_shard" or not layout.frozen_only(unit):
            continue
        for member in unit.members:
            if member in twice and any(contains(ck, member) for ck in comp.checkpoints):
                return True
    return False


def grouped_member_run_twice(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`GROUPED_MEMBER_REUSED`: a fully_shard unit over several modules (``group``), one of
    which runs more than once in one forward (a block with ``repeat`` above it). Torch 2.11 tracks
    a group's forward by the set of its modules still to run: a member that runs again after the
    set emptied unshards the unit and leaves it unsharded after forward, or runs with its
    parameters sharded (docs/known_bugs.md)."""
    if comp.wrapper is not Wrapper.NONE or not any(s.group for s in comp.shards):
        return False
    layout = Layout(tree, comp)
    return any(_runs_twice(layout, member) for s in comp.shards if s.group for member in s.paths)


def _runs_twice(layout: Layout, path: str) -> bool:
    """Whether the module at ``path`` runs more than once in one forward: a block above it
    (its parent or further up) calls each child twice (``Block.repeat``)."""
    parts = path.split(".") if path else []
    for i in range(len(parts)):
        parent = layout.paths.get(".".join(parts[:i]))
        if isinstance(parent, Block) and parent.repeat:
            return True
    return False


def unresharded_frozen(tree: ModuleTree, comp: Composition) -> list[str]:
    """The modules whose parameters :data:`UNFROZEN_UNRESHARDED` leaves unsharded after backward:
    those of a fully_shard unit with reshard_after_forward not True inside an outermost unit
    that holds only frozen parameters. The optimizer holding one of them (frozen or unfrozen
    later) meets the bug: training never reaches it, and get_optimizer_state_dict finds no name
    for it (KeyError)."""
    layout = Layout(tree, comp)
    shards = [u for u in layout.units if u.api == "fully_shard"]
    out: list[str] = []
    for top in shards:
        if not layout.outermost(top):
            continue
        subtree = [p for p, n in layout.paths.items() if top.covers(p) and owns_params(n)]
        if not subtree or not all(_frozen_leaf(layout.paths[p]) for p in subtree):
            continue
        for unit in shards:
            if comp.reshard_after_forward(comp.shards[unit.index]) is True:
                continue
            for member in unit.members:
                if top.covers(member):
                    out += layout.owned_by(unit, member)
    return out


def unused_no_all_reduce(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`UNUSED_NO_ALL_REDUCE`: under fully_shard with set_requires_all_reduce(False), a
    module holding parameters is left out of some but not all microbatches of a step."""
    return (
        bool(comp.shards)
        and training.accum_sync is AccumSync.NO_ALL_REDUCE
        and training.unused_on_some_microbatches(tree)
    )


def fsdp1_unfrozen_in_frozen_unit(tree: ModuleTree, comp: Composition, training: Training, world_size: int = 2) -> bool:
    """:data:`FSDP1_UNFROZEN_FROZEN_UNIT`: a leaf unfrozen later belongs to an FSDP1 unit that
    does not shard (NO_SHARD, or a strategy FSDP1 turns into NO_SHARD: HYBRID_SHARD with a
    shard group of one, FULL_SHARD / SHARD_GRAD_OP on one rank) whose parameters are all
    frozen at wrapping (auto-wrapping makes every block a unit of its own). After the first
    backward such a unit leaves its parameters registered as plain tensor views, so
    requires_grad_(True) on the Parameter the optimizer holds never reaches what forward uses:
    the leaf is never trained. (Unfreezing the module's attribute instead fails FSDP1's
    post-backward assertion on ``_post_backward_hook_state``.)"""
    unsharded = is_fsdp1(comp) and not fsdp1_gathers(comp, world_size)
    if not unsharded or not comp.auto_wrap or not training.unfreeze:
        return False
    paths = tree.paths()
    return any(_frozen_fsdp1_unit(paths[later.path.rpartition(".")[0]]) for later in training.unfreeze)


def fsdp1_compiled_with_sharded_grads(comp: Composition, training: Training, world_size: int) -> bool:
    """:data:`FSDP1_COMPILE_SHARDED_GRAD`: a compiled model under FSDP1 whose parameters are
    sharded runs a forward while they hold gradients (a later microbatch of an accumulated
    step, or a later step after zero_grad(set_to_none=False)). A recompilation of the wrapped
    module's forward then (the training programs remove a hook after the first forward, which
    recompiles it; a smaller batch does the same) fakeifies the unsharded parameter views with
    the sharded gradient of their flat parameter and fails inside Dynamo."""
    if training.compile is Compile.NONE or not fsdp1_gathers(comp, world_size):
        return False
    return training.grad_accum > 1 or (not training.set_to_none and training.steps > 1)


#: Reduce dtypes FSDP2 treats as overflow risks (pre- and post-divides instead of one division).
_OVERFLOW_RISK_DTYPES = (Dtype.FLOAT16, Dtype.FLOAT64)


def spmd_tp_conv(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`DTENSOR_CONV_PARTIAL`: an SPMD program with tensor parallelism over a tree with a
    conv1d leaf, which may take a rowwise pair's Partial output (or an activation of it) as input."""
    return comp.spmd and bool(comp.tp) and has_leaf(tree.root, LeafKind.CONV1D)


def spmd_mse_loss(comp: Composition) -> bool:
    """:data:`DTENSOR_MSE_LOSS`: an SPMD program whose loss is F.mse_loss of the DTensors."""
    return comp.spmd and comp.spmd_mse_loss


def divide_factor_twice(comp: Composition, training: Training, world_size: int) -> bool:
    """:data:`DIVIDE_FACTOR_TWICE`: a gradient divide factor other than 1 on units whose shard
    group has a single rank (an HSDP mesh of shard size 1, or one data-parallel rank), where
    FSDP2's divide factors are not None: force-sum reductions, or a reduce dtype (the
    policy's reduce_dtype, else its param_dtype, else the parameters') of float16 / float64."""
    factor = comp.knobs.gradient_divide_factor
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    if factor is None or factor == 1.0 or shard_size != 1 or not comp.shards:
        return False
    if comp.knobs.force_sum_reduction:
        return True
    for spec in comp.shards:
        mp = spec.mixed_precision
        reduce = (mp.reduce_dtype or mp.param_dtype) if mp is not None else None
        if (reduce or training.dtype) in _OVERFLOW_RISK_DTYPES:
            return True
    return False


def never_run_under_no_sync(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`MP_NEVER_RUN_NO_SYNC` and :data:`MP_UNIFORM_GRAD_DTYPE`: a module holding
    parameters is left out of the first forward while gradients accumulate without sync under a
    MixedPrecisionPolicy with a reduce_dtype: FSDP2's post-backward then reads the unsharded
    parameter of a unit that never ran (``AttributeError ... to_accumulated_grad_if_needed``),
    or, where the unit ran without that parameter, gets gradients of two dtypes on the syncing
    microbatch (``AssertionError ... expects uniform gradient dtype``)."""
    paths = tree.paths()
    return (
        training.accum_sync is AccumSync.NO_GRAD_SYNC
        and any(s.mixed_precision is not None and s.mixed_precision.reduce_dtype is not None for s in comp.shards)
        and any(has_params(paths[p]) for p in training.skipped_at(0, 0))
    )


def unfrozen_in_frozen_mp_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`MP_FROZEN_AT_LAZY_INIT`: a leaf unfrozen later belongs to a fully_shard unit with a
    param_dtype whose own parameters are all frozen at the start: FSDP2 takes a unit's original
    and reduce dtypes from its trainable parameters at lazy init (FSDPParamGroup._init_mp_dtypes),
    so it never casts such a unit's low-precision gradient back ("attempting to assign a
    gradient with dtype BFloat16 to a tensor with grad_dtype Float")."""
    layout = Layout(tree, comp)
    unfrozen = {u.path for u in training.unfreeze}
    for unit in layout.units:
        if unit.api != "fully_shard":
            continue
        mp = comp.shards[unit.index].mixed_precision
        if mp is None or mp.param_dtype is None:
            continue
        if layout.frozen_only(unit) and any(p in unfrozen for p in layout.owned_by(unit)):
            return True
    return False


def group_recomputed_in_part(comp: Composition) -> bool:
    """:data:`GROUP_FORCED_IN_RECOMPUTE`: a grouped fully_shard unit with an output_dtype, a
    module of which a checkpoint region recomputes (the group is incomplete in backward until
    every module has run again, for good where some is not recomputed), and a fully_shard unit
    strictly inside a checkpoint region (recomputed outside its backward state, it claims the
    forward root and force-completes that group, casting its own output to the group's
    output_dtype)."""
    grouped = [
        s
        for s in comp.shards
        if s.group and s.mixed_precision is not None and s.mixed_precision.output_dtype is not None
    ]
    partial = any(contains(c, m) for s in grouped for m in s.paths for c in comp.checkpoints)
    return partial and any(is_ancestor(c, m) for c in comp.checkpoints for m in comp.sharded_paths)


def checkpoint_debug(comp: Composition) -> bool:
    """checkpoint(debug=True) on some checkpointed module (:data:`CHECKPOINT_DEBUG`)."""
    return bool(comp.checkpoints) and comp.checkpoint_options.debug


def selective_over_unit(comp: Composition) -> bool:
    """A selective checkpoint over a region that may hold an FSDP unit (:data:`SAC_OVER_FSDP_UNIT`:
    it fails where the unit's state differs between forward and recomputation): a fully_shard
    unit inside it, or FSDP1 with auto_wrap, whose units (every block) emit the same
    record_function markers (``FullyShardedDataParallel._post_forward`` in the recomputation;
    the README's main job met it so, FSDP1 SHARD_GRAD_OP under no_sync)."""
    if comp.checkpoint_options.context_fn is ContextFn.NONE or not comp.checkpoints:
        return False
    if comp.wrapper.value.startswith("fsdp1") and comp.auto_wrap:
        return True
    return any(contains(c, p) for c in comp.checkpoints for p in comp.sharded_paths)


def delayed_all_reduce(comp: Composition) -> bool:
    """replicate with delay_all_reduce_named_params (:data:`DELAY_ALL_REDUCE_ROOT`)."""
    return bool(comp.replicates) and comp.replicate_options.delay_all_reduce


def stager_reused(body: Body) -> bool:
    """An explicit DefaultStager given to more than one async_save (:data:`STAGER_REUSED_AFTER_CLOSE`)."""
    return isinstance(body, DcpBody) and body.stager is not None and body.async_saves >= 2


def delayed_not_float32(comp: Composition, training: Training) -> bool:
    """Delayed all-reduce over parameters that are not float32 (:data:`DELAY_BUFFER_FLOAT32`)."""
    return delayed_all_reduce(comp) and training.dtype is not Dtype.FLOAT32


def compiled_unfreeze_ignored(comp: Composition, training: Training) -> bool:
    """torch.compile with aot_eager over a composition whose fully_shard ignored_params include a
    module unfrozen later (:data:`COMPILED_UNFREEZE_PLAIN`)."""
    return training.compile is Compile.AOT_EAGER and any(u.path in comp.shard_ignored for u in training.unfreeze)


def _frozen_leaf(node: object) -> bool:
    return isinstance(node, Leaf) and node.frozen


def _frozen_fsdp1_unit(node: object) -> bool:
    """A block FSDP1's auto-wrapping makes a unit of, whose parameters are all frozen (a block
    without its own scale whose parameter leaves are all frozen)."""
    if not isinstance(node, Block) or owns_params(node):
        return False
    leaves = [c for c in node.children if isinstance(c, Leaf) and c.kind in PARAM_LEAVES]
    return bool(leaves) and all(c.frozen for c in leaves)


# --------------------------------------------------------------------------- conditions: state


def fsdp1_hsdp_2d(comp: Composition) -> bool:
    """:data:`FSDP1_HSDP_OPTIMIZER_LOAD`:
    FSDP1 HYBRID_SHARD over more than one replica and more than one shard. Its sharded state
    dict holds DTensors over the 2-D mesh; DCP's ``load_sharded_optimizer_state_dict`` lays the
    optimizer state out as chunks over the whole world instead, so the classic FSDP1 recipe
    loads wrong optimizer state into it (docs/known_bugs.md)."""
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[0] > 1 and comp.mesh[1] > 1


def fsdp1_shard1_full_offload_load(body: Body) -> bool:
    """:data:`FSDP1_HSDP_RANK0_BROADCAST`: a full state dict with cpu_offload or
    broadcast_from_rank0 is loaded into an FSDP1 HYBRID_SHARD model whose shard dimension has
    size 1 (for either option torch passes FSDP1's optimizer config rank0_only=True, which
    broadcasts from global rank 0 in a group of the rank alone)."""
    if isinstance(body, DcpBody):
        return body.load_full_state_dict and body.load_cpu_offload and fsdp1_shard1(body.target)
    if isinstance(body, StateDictBody):
        rank0_only = body.load.cpu_offload or body.load.broadcast_from_rank0
        return body.load.full_state_dict and rank0_only and fsdp1_shard1(body.target)
    return False


def fsdp1_full_offload(body: Body, world_size: int) -> bool:
    """:data:`FSDP1_FULL_OFFLOAD`: whether a case meets two torch bugs of FSDP1's FULL_STATE_DICT with offload_to_cpu on
    CPU, where the "offload" copies nothing: ``model.state_dict()`` clones the parameters
    from an unsharded buffer that has been freed already (SIGSEGV in the post-state-dict
    hook's param_hook, or garbage), and ``FSDP.optim_state_dict`` (offload_to_cpu is
    FullOptimStateDictConfig's default) returns every tensor state of a parameter as a view
    of one all-gather buffer, which the next state's all-gather overwrites (exp_avg comes
    back equal to exp_avg_sq). Both need parameters sharded over more than one rank (FSDP1
    gathers nothing under NO_SHARD or a shard group of one). get_*_state_dict with
    full_state_dict and cpu_offload take an FSDP1 model's state the same way (offload_to_cpu,
    with rank0_only), so split and combined meet them too, and so do DCP cases that take an
    FSDP1 side's state through the app entry or patched state dicts: the source's when saved,
    the fresh target's when dcp.load asks it for the state dict to load into."""
    if isinstance(body, DcpBody):
        if body.classic_fsdp1:
            return False
        saves = full_offload_gathers(body.save_full_state_dict, body.save_cpu_offload, body.source, world_size)
        loads = full_offload_gathers(body.load_full_state_dict, body.load_cpu_offload, body.target, world_size)
        return saves or loads
    if not isinstance(body, StateDictBody):
        return False
    return full_offload_gathers(body.save.full_state_dict, body.save.cpu_offload, body.source, world_size)


def full_offload_gathers(full: bool, cpu_offload: bool, comp: Composition, world_size: int) -> bool:
    """:func:`fsdp1_full_offload` for one side, over the parts a strategy draws one by one: a
    full state dict with cpu_offload of an FSDP1 model that shards over more than one rank."""
    return full and cpu_offload and fsdp1_gathers(comp, world_size)


def fsdp1_dcp_stateless(body: Body) -> bool:
    """:data:`FSDP1_DCP_STATELESS`:
    whether a case meets a torch bug of the classic FSDP1 recipe: an optimizer without state
    (SGD without momentum) leaves no entry for its empty "state" in the checkpoint, so
    load_sharded_optimizer_state_dict returns a dict without "state", which
    FSDP.optim_state_dict_to_load refuses (ValueError)."""
    if not isinstance(body, DcpBody) or not is_fsdp1(body.target) or not body.classic_fsdp1:
        return False
    loaded = DcpItem.OPTIMIZER in body.entries and DcpItem.OPTIMIZER not in body.skip
    return loaded and stateless_optimizer(body.training)


def fsdp1_dcp_empty_shard(body: Body, world_size: int) -> bool:
    """:data:`FSDP1_DCP_EMPTY_SHARD`:
    whether a case meets a torch bug of dcp.load with FSDP1's sharded state dict: a rank
    that holds no chunk of a parameter (FSDP1 chunks dim 0, the tree's width, into
    world_size pieces with torch.chunk, which makes fewer pieces when the width is small)
    flattens the ShardedTensor away, the planner takes the key missing on that rank for a
    sign of a checkpoint older than 2.4 and flattens the whole dict the old way, and then a
    value that the old way keys differently, a list (the scalars entry's history, an optimizer
    state dict's param_groups), is "Missing key in checkpoint state_dict". The sharded state
    dicts get_*_state_dict take of such a model (app, patched) hold the same ShardedTensors,
    its optimizer's too, and the optimizer state dict loaded with them (app, patched) holds
    param_groups."""
    if not isinstance(body, DcpBody) or tensor_kind(body.target) != "sharded_tensor" or body.load_full_state_dict:
        return False
    loaded = [e for e in body.entries if e not in body.skip]
    optimizer = DcpItem.APP in loaded or (body.patched and DcpItem.OPTIMIZER in loaded)
    if not (DcpItem.MODEL in loaded or optimizer) or not (DcpItem.SCALARS in loaded or optimizer):
        return False
    width = body.tree.width
    chunk = -(-width // world_size)
    return -(-width // chunk) < world_size


def fsdp1_async_default_stager(body: Body) -> bool:
    """:data:`FSDP1_ASYNC_DEFAULT_STAGER`: dcp.async_save without a storage writer stages with
    its DefaultStager, which deep-copies the state dict calling ``data_ptr()`` on every tensor,
    which ShardedTensor (FSDP1 FULL_SHARD / SHARD_GRAD_OP sharded state dicts) does not
    support."""
    if not isinstance(body, DcpBody):
        return False
    return default_stager_copies_sharded(body.async_save, body.storage_objects, body.source, body.save_full_state_dict)


def default_stager_copies_sharded(async_save: bool, storage_objects: bool, source: Composition, full: bool) -> bool:
    """:func:`fsdp1_async_default_stager` over the parts a strategy draws one by one."""
    return async_save and not storage_objects and not full and tensor_kind(source) == "sharded_tensor"


def stateless_optimizer(training: Training) -> bool:
    """An optimizer that keeps no tensor state (SGD without momentum): the optimizer of
    :data:`STATELESS_FULL` and :data:`FSDP1_DCP_STATELESS`."""
    return training.optimizer is Optimizer.SGD and not training.momentum


def fsdp1_frozen_unit(comp: Composition, tree: ModuleTree) -> bool:
    """:data:`FSDP1_FROZEN_UNIT`: FSDP1 NO_SHARD with auto-wrapping makes a unit whose parameters
    are all frozen (a block without its own scale whose parameter leaves are all frozen;
    auto-wrapping puts every block in a unit of its own). After a training step such a unit
    leaves its parameters registered as plain tensor views, and FSDP1's state_dict hooks then
    raise AssertionError "FSDP assumes ... is in the state_dict"."""
    if comp.wrapper is not Wrapper.FSDP1_NO_SHARD or not comp.auto_wrap:
        return False
    return any(_frozen_fsdp1_unit(n) for n in tree.paths().values())


def hsdp_optimizer_load(body: Body) -> bool:
    """:data:`FSDP1_HSDP_OPTIMIZER_LOAD`: the classic FSDP1 recipe loads the optimizer into FSDP1
    HYBRID_SHARD over a 2-D mesh."""
    return (
        isinstance(body, DcpBody)
        and fsdp1_hsdp_2d(body.target)
        and body.classic_fsdp1
        and DcpItem.OPTIMIZER in body.entries
        and DcpItem.OPTIMIZER not in body.skip
    )


def broadcast_empty(body: Body) -> bool:
    """:data:`BROADCAST_EMPTY`: set_state_dict with broadcast_from_rank0 where ranks other than 0
    pass an empty model state dict (get_state_dict with full_state_dict and cpu_offload returns
    one there): the combined API with broadcast_from_rank0, or the app Stateful loading a full,
    offloaded state dict."""
    if isinstance(body, StateDictBody):
        return broadcast_empty_combined(body.api, body.load.broadcast_from_rank0)
    if isinstance(body, DcpBody):
        loaded = tuple(e for e in body.entries if e not in body.skip)
        return broadcast_empty_app(loaded, body.load_full_state_dict, body.load_cpu_offload)
    return False


def broadcast_empty_combined(api: Api, broadcast_from_rank0: bool) -> bool:
    """:func:`broadcast_empty` of a state_dict case, over its drawn parts."""
    return api is Api.COMBINED and broadcast_from_rank0


def broadcast_empty_app(loaded: tuple[DcpItem, ...], full: bool, cpu_offload: bool) -> bool:
    """:func:`broadcast_empty` of a dcp case, over its drawn parts: the app Stateful among the
    loaded entries takes a full, offloaded state dict."""
    return DcpItem.APP in loaded and full and cpu_offload


def frozen_state_dropped(body: Body) -> bool:
    """:data:`FROZEN_OPTIM_STATE_DROPPED`: a stateful optimizer loaded through
    set_optimizer_state_dict (every path but FSDP1's own) while a parameter that trained
    before the save is frozen."""
    if not isinstance(body, (StateDictBody, DcpBody)) or stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        loaded = body.api is not Api.FSDP1
    else:
        loaded = (
            any(e in body.entries and e not in body.skip for e in (DcpItem.OPTIMIZER, DcpItem.APP))
            and not body.classic_fsdp1
        )
    return loaded and bool(trained_then_frozen(body))


def fused_in_optimizer(body: Body) -> bool:
    """:data:`FUSED_OPTIM_KEYS`: a state-dict case whose fused leaves have parameters the
    optimizer holds (trainable in the tree, or frozen ones handed to it too)."""
    if not isinstance(body, StateDictBody) or not body.fused:
        return False
    paths = body.tree.paths()
    return body.frozen_in_optimizer or any(not getattr(paths[p], "frozen", False) for p in body.fused)


def fused_custom_name(body: Body) -> bool:
    """:data:`FUSED_CUSTOM_NAME`: fused leaves whose method has another name than the default,
    with the model state taken by get_model_state_dict or get_state_dict."""
    return (
        isinstance(body, StateDictBody)
        and bool(body.fused)
        and body.fqn_modifiers != DEFAULT_FQN_MODIFIERS
        and body.api in (Api.SPLIT, Api.COMBINED)
    )


def fused_ignore_frozen(body: Body) -> bool:
    """:data:`FUSED_IGNORE_FROZEN`: get_model_state_dict(ignore_frozen_params=True) over a fused
    leaf frozen in the tree (a requires_grad schedule is not drawn with ignore_frozen_params)."""
    if not isinstance(body, StateDictBody) or not body.save.ignore_frozen_params:
        return False
    paths = body.tree.paths()
    return any(getattr(paths[p], "frozen", False) for p in body.fused)


def plan_cache_failed_save(body: Body) -> bool:
    """:data:`PLAN_CACHE_FAILED_SAVE`: a save with plan caching refused by overwrite=False (the
    case then saves again with the same planner class)."""
    return (
        isinstance(body, DcpBody)
        and body.save_planner is not None
        and body.save_planner.enable_plan_caching
        and body.overwrite is Overwrite.FALSE
    )


def stateless_full(body: Body) -> bool:
    """:data:`STATELESS_FULL`: an optimizer without tensor state (SGD without momentum) loaded
    from a full state dict through set_optimizer_state_dict (an FSDP1 target loads through
    FSDP.optim_state_dict_to_load instead, which is not this bug's path)."""
    if not isinstance(body, (StateDictBody, DcpBody)):
        return False
    if not stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        return stateless_full_path(body.load.full_state_dict, body.target) and body.api is not Api.FSDP1
    loaded = [e for e in body.entries if e not in body.skip]
    return stateless_full_path(body.load_full_state_dict, body.target) and (
        DcpItem.APP in loaded or DcpItem.OPTIMIZER in loaded
    )


def flat_full_optimizer(body: object) -> bool:
    """:data:`FLAT_FULL_OPTIM`: an in-memory optimizer load with full state dicts and
    flatten_optimizer_state_dict (through set_optimizer_state_dict or set_state_dict)."""
    return (
        isinstance(body, StateDictBody)
        and body.api is not Api.FSDP1
        and body.load.full_state_dict
        and body.load.flatten_optimizer_state_dict
    )


def stateless_full_path(full: bool, target: Composition) -> bool:
    """Whether a full optimizer state reaches the target through set_optimizer_state_dict's
    path of :data:`STATELESS_FULL` (an FSDP1 target takes FSDP.optim_state_dict_to_load)."""
    return full and not is_fsdp1(target)


# --------------------------------------------------------------------------- conditions over a whole case


def foreach_over_mixed_case(case: Case) -> bool:
    """:func:`foreach_over_mixed` over every composition of a case together."""
    training = getattr(case.body, "training", None)
    return isinstance(training, Training) and foreach_over_mixed(training, tuple(compositions(case)))


def optimizer_holds_unresharded(body: Body) -> bool:
    """:data:`UNFROZEN_UNRESHARDED` in a state-dict case: the optimizer holds frozen parameters,
    some of which the source composition leaves unsharded after backward."""
    return (
        isinstance(body, (StateDictBody, DcpBody))
        and body.frozen_in_optimizer
        and bool(unresharded_frozen(body.tree, body.source))
    )


def fsdp1_frozen_source(body: Body) -> bool:
    """:data:`FSDP1_FROZEN_UNIT` on a state-dict case's source side."""
    return isinstance(body, (StateDictBody, DcpBody)) and fsdp1_frozen_unit(body.source, body.tree)


def cache_staged(body: Body) -> bool:
    """:data:`CACHED_STAGING_NEEDS_ACCELERATOR`: FileSystemWriter(cache_staged_state_dict=True)."""
    return isinstance(body, DcpBody) and body.cache_staged
