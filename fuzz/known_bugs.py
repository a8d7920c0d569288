"""The known torch bugs: one :class:`~fuzz.known_record.KnownBug` record per bug, with its condition,
its tag and the checks it renames. Every list the registry keeps (:mod:`fuzz.known`) is derived
from :data:`RECORDS`, in the order the records are written here: the order in which
:func:`fuzz.known.known_bug` names the first bug a state-dict case meets (the training bugs its
sides meet first, then the state-dict and DCP bugs), the tags of a mismatch are written and, the
last met first, the state-dict judges rename a mismatch (the optimizer load's mechanisms after
the setups).

Adding a bug: a record here (its condition over the predicates of :mod:`fuzz.known_conditions`,
written there if none fits), its corpus entry (``"bug": "<id>"``) and its doc
(``docs/known_bugs.md`` or ``docs/state_dict.md``).

Imports only the standard library, the model and the other known_* modules.
"""

from __future__ import annotations

from fuzz.known_conditions import (
    broadcast_empty,
    cache_staged,
    checkpoint_debug,
    compiled_unfreeze_ignored,
    delayed_all_reduce,
    delayed_not_float32,
    divide_factor_twice,
    flat_full_optimizer,
    foreach_over_mixed_case,
    frozen_int_reshard_unit,
    frozen_state_dropped,
    frozen_unit_run_twice_checkpointed,
    fsdp1_async_default_stager,
    fsdp1_compiled_with_sharded_grads,
    fsdp1_dcp_empty_shard,
    fsdp1_dcp_stateless,
    fsdp1_frozen_source,
    fsdp1_full_offload,
    fsdp1_shard1,
    fsdp1_shard1_full_offload_load,
    fsdp1_unfrozen_in_frozen_unit,
    fused_custom_name,
    fused_ignore_frozen,
    fused_in_optimizer,
    group_recomputed_in_part,
    grouped_member_run_twice,
    hsdp_optimizer_load,
    int_reshard_dim1,
    int_reshard_inference,
    never_run_under_no_sync,
    optimizer_holds_unresharded,
    plan_cache_failed_save,
    selective_over_unit,
    shard1,
    spmd_mse_loss,
    spmd_tp_conv,
    stager_reused,
    stateless_full,
    unfrozen_in_frozen_mp_unit,
    unfrozen_unresharded_unit,
    unused_no_all_reduce,
)
from fuzz.known_record import (
    ALL_CHECKS,
    KNOWN_HANG_ODDS,
    OPTIMIZER_CHECKS,
    SAVE_CALL,
    AnyOf,
    KnownBug,
    OfBody,
    OfCase,
    OfComposition,
    OfTraining,
    OfTree,
    OfTreeAndTraining,
)

INT_RESHARD_DIM1 = KnownBug(
    "fully_shard-int-reshard-shard-dim-1",
    "fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out, "
    "or (a dim-1 size the post-forward mesh splits unevenly) as_strided out of bounds in to_sharded_post_forward",
    relation="none found after eight phrasings (the error texts and frames, the two options, the symptom); "
    "see_also: the pull requests that added shard_placement_fn and the int reshard_after_forward",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#137496", "pytorch/pytorch#118017"),
    condition=OfComposition(int_reshard_dim1),
)
#: The records, by the names callers use. Corpus entries name them by ``id``.
FSDP1_HSDP_SHARD1 = KnownBug(
    "fsdp1-hybrid-shard-dim-1",
    "FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#154888",
    relation="same bug",
    ends_ranks=False,
    tag=":shard1",
    condition=OfComposition(fsdp1_shard1),
    tag_setup=OfComposition(shard1),
    renames=ALL_CHECKS,
)
FSDP1_FROZEN_UNIT = KnownBug(
    "fsdp1-no-shard-frozen-unit-state-dict",
    "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises "
    "'FSDP assumes ... is in the state_dict'",
    upstream="pytorch/pytorch#85831",
    relation="related",
    docs="docs/state_dict.md",
    condition=OfBody(fsdp1_frozen_source),
)
FSDP1_HSDP_RANK0_BROADCAST = KnownBug(
    "fsdp1-hsdp-shard1-rank0-broadcast",
    "set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 "
    "broadcasts from global rank 0 in a one-rank group",
    upstream="pytorch/pytorch#155680",
    relation="same line",
    state="open; #128444 (same path) was fixed only in part by pull request #128446",
    see_also=("pytorch/pytorch#128444",),
    # get_group_rank's ValueError is what any rank taken for the wrong group's raises
    conditional=True,
    condition=OfBody(fsdp1_shard1_full_offload_load),
)
FSDP1_FULL_OFFLOAD = KnownBug(
    "fsdp1-full-state-dict-offload-to-cpu",
    "FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), "
    "optim_state_dict aliases the gathered states",
    symptoms=frozenset({"crash", "mismatch"}),
    upstream="pytorch/pytorch#188989",
    relation="same root cause for the model state dict (to_cpu frees a CPU buffer); none found for the "
    "optimizer's aliasing",
    state="closed; its fix (pull request #188990) is not in torch 2.13",
    see_also=("pytorch/pytorch#188990", "Lightning-AI/pytorch-lightning#21804"),
    docs="docs/state_dict.md",
    condition=OfCase(lambda case: fsdp1_full_offload(case.body, case.world_size), saving=True),
)
FSDP1_DCP_STATELESS = KnownBug(
    "fsdp1-dcp-stateless-optimizer",
    "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the "
    "dict without 'state'",
    relation="none found after four phrasings (the KeyError, optim_state_dict_to_load, stateless SGD, the "
    "function); see_also: FSDP1 leaving empty state out of its flattened optimizer state dict",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#88353",),
    docs="docs/state_dict.md",
    condition=OfBody(fsdp1_dcp_stateless),
)
FSDP1_DCP_EMPTY_SHARD = KnownBug(
    "dcp-load-empty-sharded-tensor-pre-2.4-guess",
    "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner "
    "guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'",
    upstream="pytorch/pytorch#163480",
    relation="same bug (pull request: _flatten_sharded_tensors drops the empty ShardedTensor, the load "
    "planner takes its key for missing and falls back to the pre-2.4 key format); related: the same "
    "condition through another path, and the pre-2.4 fallback's pull request (see_also)",
    state="closed unmerged (a test was asked for); present in torch 2.13.0",
    see_also=("pytorch/pytorch#137327", "pytorch/pytorch#108869", "pytorch/pytorch#134158"),
    docs="docs/state_dict.md",
    condition=OfCase(lambda case: fsdp1_dcp_empty_shard(case.body, case.world_size), saving=True),
)
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug(
    "async_save-default-stager-sharded-tensor",
    "dcp.async_save's default stager calls data_ptr() on ShardedTensors",
    relation="none found after five phrasings; related: async_save of FSDP state with 0-d tensors, and the "
    "stager's pull request, and ShardedTensor staging added to the path FileSystemWriter takes only (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#131976", "pytorch/pytorch#155192", "pytorch/pytorch#156092"),
    docs="docs/state_dict.md",
    condition=OfBody(fsdp1_async_default_stager),
)
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug(
    "filesystemwriter-cache-staged-pin-memory",
    "FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host "
    "without an accelerator",
    relation="none found after four phrasings (the option, pinning, CPU-only hosts, the error text)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#189991", "pytorch/pytorch#159994"),
    docs="docs/state_dict.md",
    condition=OfBody(cache_staged),
)
#: Met with an accelerator only (without one, the bug above comes first): no case condition.
CACHED_STAGING_PINNED_METADATA = KnownBug(
    "filesystemwriter-cache-staged-pinned-metadata",
    "a checkpoint staged by FileSystemWriter(cache_staged_state_dict=True) records pin_memory=True; the "
    "classic FSDP1 load_sharded_optimizer_state_dict then refuses its unpinned ShardedTensors",
    relation="none found after four phrasings (pin_memory in the metadata, the option, the load function, "
    "init_from_local_shards)",
    state="present in torch 2.13.0",
    docs="docs/state_dict.md",
)
BROADCAST_EMPTY = KnownBug(
    "set_state_dict-broadcast-empty",
    "set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict",
    symptoms=frozenset({"hang", "crash", "exception"}),
    upstream="pytorch/pytorch#157781",
    relation="same symptom",
    state="open",
    see_also=("pytorch/pytorch#158836",),
    odds=KNOWN_HANG_ODDS,
    docs="docs/state_dict.md",
    condition=OfBody(broadcast_empty),
)
STATELESS_FULL = KnownBug(
    "set_optimizer_state_dict-full-stateless",
    "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'",
    upstream="pytorch/pytorch#133415",
    relation="same symptom: a stateless optimizer through the distributed state dict, closed by the pull "
    "request in see_also, yet the full_state_dict path still raises in torch 2.13.0",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#135535", "pytorch/pytorch#192225"),
    docs="docs/state_dict.md",
    condition=OfBody(stateless_full),
)
FLAT_FULL_OPTIM = KnownBug(
    "set_optimizer_state_dict-flat-full-keyerror",
    "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises "
    "KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local "
    "state dict with the flatten option still on, so the loaded and the local dicts have different keys",
    relation="none found after four phrasings; two other flatten bugs are in see_also",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#192224", "pytorch/pytorch#192225"),
    docs="docs/state_dict.md",
    condition=OfBody(flat_full_optimizer),
)
FUSED_CUSTOM_NAME = KnownBug(
    "dsd-fqn-modifiers-name-ignored-on-get",
    "get_model_state_dict / get_state_dict ignore StateDictOptions(dsd_fqn_modifiers=...): they map the "
    "model's state-dict keys to FQNs through a method of the default name (_fqn_modifiers), so for a module "
    "whose state-dict hooks hide a child and whose method has the name the option gives, _get_fqns raises "
    "AttributeError ('<module> object has no attribute <key atom>'). Only set_model_state_dict reads the "
    "option. Any model, sharded or not",
    relation="none found after four phrasings (dsd_fqn_modifiers with get_model_state_dict, the "
    "AttributeError in _get_fqns, a custom fqn modifiers name, the option ignored); see_also: the pull "
    "request that added the option",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    docs="docs/state_dict.md",
    # nn.Module.__getattr__'s AttributeError is any missing attribute's
    conditional=True,
    condition=OfBody(fused_custom_name),
)
FUSED_IGNORE_FROZEN = KnownBug(
    "dsd-fqn-modifiers-ignore-frozen-keyerror",
    "get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen parameter of a module "
    "whose state-dict hooks hide a child (declared through its fqn modifiers method): it pops the "
    "parameter's named_parameters name ('0.fused.weight'), which the state dict, keyed '0.weight', lacks",
    relation="none found after four phrasings (the KeyError in _get_model_state_dict, ignore_frozen_params "
    "with a state-dict hook, with fqn modifiers, frozen parameters of a wrapped module); see_also: the pull "
    "request that added the modifiers",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    docs="docs/state_dict.md",
    conditional=True,
    condition=OfBody(fused_ignore_frozen),
)
FUSED_OPTIM_KEYS = KnownBug(
    "dsd-fqn-modifiers-optimizer-keys",
    "a module whose state-dict hooks hide a child, declared through its fqn modifiers method "
    "(StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that child's parameters by "
    "named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks them up by the model state "
    "dict's ('0.weight'), so a get/set round trip of the optimizer fails: strict raises RuntimeError "
    "'Missing optimizer state for parameter', non-strict drops that state, flattened raises KeyError "
    "'param_groups.<fqn>.lr'. Any model, sharded or not",
    symptoms=frozenset({"exception", "mismatch"}),
    relation="none found after five phrasings (the RuntimeError's text, dsd_fqn_modifiers / _fqn_modifiers "
    "with the optimizer, a state-dict hook renaming keys, the round trip of get/set_optimizer_state_dict, "
    "FusionEmbedding); see_also: the pull request that added the modifiers to the model state dict only",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    ends_ranks=False,
    tag=":fused-optimizer-keys",
    docs="docs/state_dict.md",
    # what a load with the keys missing leads to shows up in the optimizer's own code too
    conditional=True,
    condition=OfBody(fused_in_optimizer),
    renames=OPTIMIZER_CHECKS,
    renamed_at="set_optimizer_state_dict",
)
PLAN_CACHE_FAILED_SAVE = KnownBug(
    "dcp-plan-cache-after-failed-save",
    "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) "
    "refusing an existing checkpoint) leaves its plans cached; the next save with that planner class "
    "raises TypeError 'NoneType' object is not iterable in _create_global_plan",
    upstream="pytorch/pytorch#176289",
    relation="same bug (pull request: save plan caching during validation failures)",
    state="fixed in torch 2.13 (plans are cached only after a successful save); present in torch 2.11",
    fixed_in="2.13",
    docs="docs/state_dict.md",
    condition=OfBody(plan_cache_failed_save),
)
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug(
    "fsdp1-hsdp-load_sharded_optimizer_state_dict",
    "load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in "
    "FSDP1 HYBRID_SHARD over a 2-D mesh",
    symptoms=frozenset({"mismatch"}),
    relation="none found after four phrasings; related: a review there notes that this function does not "
    "know the right rank and world size (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#111096", "pytorch/pytorch#145978"),
    ends_ranks=False,
    tag=":fsdp1-hsdp-load_sharded_optimizer_state_dict",
    condition=OfBody(hsdp_optimizer_load),
    renames=OPTIMIZER_CHECKS,
    renamed_at=SAVE_CALL,
)
FROZEN_OPTIM_STATE_DROPPED = KnownBug(
    "set_optimizer_state_dict-frozen-state-dropped",
    "set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) "
    "when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts "
    "with fresh optimizer state (get_optimizer_state_dict saved it)",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#192202",
    relation="same bug",
    state="open; fix pull request #192307 open, not in torch 2.13.0",
    see_also=("pytorch/pytorch#192307",),
    ends_ranks=False,
    tag=":frozen-optimizer-state-dropped",
    docs="docs/state_dict.md",
    # a mismatch: no respawn, no deadline spent
    odds=4,
    condition=OfBody(frozen_state_dropped),
    renames=OPTIMIZER_CHECKS,
    renamed_at="set_optimizer_state_dict",
)
FROZEN_INT_RESHARD = KnownBug(
    "fully_shard-frozen-int-reshard",
    "a fully_shard unit with an int reshard_after_forward left in its post-forward state (a frozen unit "
    "under a replicate'd root after backward, or any such unit after an inference forward): under uneven "
    "sharding the post-forward DTensor's full_tensor() is wrong",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings (frozen unit, replicate root, int reshard, post-backward "
    "callback), eight more, and two of the mechanism (the post-forward DTensor's values under uneven "
    "sharding, to_sharded_post_forward's slice of the padded all-gather output); see_also: FSDP1's resharding "
    "of frozen parameters, the FSDP-based replicate, "
    "and parameters left post-forward after backward under set_unshard_in_backward(False); three more for "
    "the inference forward (int reshard_after_forward with inference, the post-forward DTensor after an eval "
    "forward, FSDP2 parameters wrong after an eval forward): the option's pull request, whose review says "
    "these DTensors are only meant for FSDP's all-gather, not for reading (see_also)",
    state="present in torch 2.13.0 (and 2.11.0, where a campaign met its inference form)",
    see_also=("pytorch/pytorch#101982", "pytorch/pytorch#158207", "pytorch/pytorch#144800", "pytorch/pytorch#118017"),
    ends_ranks=False,
    tag=":frozen-int-reshard",
    condition=AnyOf(
        OfTree(frozen_int_reshard_unit),
        OfTreeAndTraining(lambda tree, comp, training, _: int_reshard_inference(comp, training)),
    ),
    tags_through_base=True,
)
UNFROZEN_UNRESHARDED = KnownBug(
    "fully_shard-unfrozen-unresharded",
    "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf "
    "unfrozen later never trains (KeyError in get_optimizer_state_dict)",
    symptoms=frozenset({"mismatch", "exception"}),
    relation="none found after four phrasings (the KeyError, unfreezing, reshard_after_forward=False, the "
    "final callback), and seven more; see_also: frozen parameters' optimizer state dropped by DCP (another "
    "mechanism), and an optimizer holding other parameter objects than the module (another trigger)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#192202", "pytorch/pytorch#149029", "pytorch/pytorch#149205"),
    ends_ranks=False,
    tag=":unfrozen-unresharded",
    condition=AnyOf(
        OfBody(optimizer_holds_unresharded),
        OfTreeAndTraining(lambda tree, comp, training, _: unfrozen_unresharded_unit(tree, comp, training)),
    ),
    tags_through_base=True,
)
FROZEN_UNIT_RECOMPUTED_UNRESHARDED = KnownBug(
    "fully_shard-frozen-unit-recomputed-unresharded",
    "a fully_shard unit of frozen parameters that runs twice in one forward inside a checkpointed region "
    "stays unsharded after backward although reshard_after_backward is True; unfrozen later (through the "
    "sharded parameter), its registered unsharded parameters keep requires_grad=False in the next forward "
    "and the recomputation raises CheckpointError 'Recomputed values ... different metadata'; so does, "
    "without unfreezing, a second forward before one backward (the region recomputed twice in it)",
    # Wrong memory, no wrong number: only the after-backward memory contract sees it, and a
    # numeric mismatch in such a case is not this bug (fuzz.known.explains); its exception
    # form needs a leaf of the unit unfrozen later.
    symptoms=frozenset({"contract", "exception"}),
    relation="none found after five phrasings (FSDP2, checkpoint, a module called twice, frozen parameters, "
    "not resharded after backward), and three for the exception form (the CheckpointError text with FSDP2 and a "
    "frozen parameter, unfreezing an FSDP2 parameter before a recomputation, requires_grad not reaching the "
    "unsharded parameter); related: FSDP1's fixes for frozen parameters used more than once, and FSDP1's "
    "requires_grad change lost while a FlatParameter stays unsharded",
    state="present in torch 2.13.0 (the exception form found on torch 2.11)",
    see_also=("pytorch/pytorch#110948", "pytorch/pytorch#95805", "pytorch/pytorch#105371"),
    ends_ranks=False,
    conditional=True,
    condition=OfTree(frozen_unit_run_twice_checkpointed),
)
GROUPED_MEMBER_REUSED = KnownBug(
    "fully_shard-grouped-member-reused",
    "fully_shard([a, b]) (one unit over two modules) where a module of the group runs again after "
    "every module of the group has run in that forward: the unit stays unsharded after forward although "
    "reshard_after_forward is True, or the module runs with its parameters sharded (mixed torch.Tensor "
    "and DTensor), and FSDP warns that a module that ran did not run forward",
    symptoms=frozenset({"contract", "exception"}),
    upstream="pytorch/pytorch#183702",
    relation="related: the same trigger, a grouped module reused later in the same iteration (there an "
    "out-of-bounds storage in backward, open); the force-completion of incomplete groups at the forward "
    "root and the unshard gated on the group's state rather than on the modules still to run (pull "
    "request #180428) are in torch 2.13, where this reproducer passes",
    state="present in torch 2.11 (device, CPU, gloo); torch 2.13.0 passes its reproducer",
    see_also=("pytorch/pytorch#180428", "pytorch/pytorch#127786"),
    fixed_in="2.13",
    ends_ranks=False,
    # its exception (linear's mixed Tensor and DTensor) is raised by any module given a sharded
    # parameter; the contracts (sharded after forward, all-gathered in backward) by other bugs
    conditional=True,
    condition=OfTree(grouped_member_run_twice),
)
UNUSED_NO_ALL_REDUCE = KnownBug(
    "fully_shard-unused-no-all-reduce",
    "HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient",
    symptoms=frozenset({"mismatch", "exception"}),
    relation="none found after five phrasings; related: the option's pull request and the gradient "
    "accumulation finalization work on the same deferred-reduction path (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#126166", "pytorch/pytorch#196640", "pytorch/pytorch#197620"),
    ends_ranks=False,
    tag=":unused-no-all-reduce",
    # its exception form (a changing set of used parameters: foreach_reduce adds reduce-scatter
    # outputs of two sizes) has foreach_reduce's RuntimeError, which other bugs raise too
    conditional=True,
    condition=OfTreeAndTraining(lambda tree, comp, training, _: unused_no_all_reduce(tree, comp, training)),
)
MP_NEVER_RUN_NO_SYNC = KnownBug(
    "fully_shard-reduce-dtype-no-sync-never-run",
    "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran "
    "forward has no '_unsharded_param' in the root's post-backward",
    upstream="pytorch/pytorch#194058",
    relation="same bug (pull request)",
    state="closed; the fix is not in torch 2.13",
    condition=OfTreeAndTraining(lambda tree, comp, training, _: never_run_under_no_sync(tree, comp, training)),
)
MP_UNIFORM_GRAD_DTYPE = KnownBug(
    "fully_shard-reduce-dtype-no-sync-uniform-grad-dtype",
    "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused "
    "on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'",
    upstream="pytorch/pytorch#196996",
    relation="same bug",
    state="open; an earlier fix (pull request #160279) is not in torch 2.13",
    see_also=("pytorch/pytorch#160279", "pytorch/pytorch#190627"),
    condition=OfTreeAndTraining(lambda tree, comp, training, _: never_run_under_no_sync(tree, comp, training)),
)
MP_FROZEN_AT_LAZY_INIT = KnownBug(
    "fully_shard-mp-frozen-at-lazy-init",
    "MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its "
    "low-precision gradient is never cast back",
    upstream="pytorch/pytorch#186998",
    relation="same bug",
    state="closed, yet still present in torch 2.13.0 (fix pull request #187376 not in 2.13)",
    see_also=("pytorch/pytorch#187376",),
    # Not conditional: its condition (unfrozen_in_frozen_mp_unit) is narrower than the bug (the
    # main campaign met its exact message in a case outside it). foreach_reduce's RuntimeError of
    # fully_shard-unused-no-all-reduce, conditional, is charged there first where a case meets it.
    condition=OfTreeAndTraining(lambda tree, comp, training, _: unfrozen_in_frozen_mp_unit(tree, comp, training)),
)
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug(
    "fsdp1-no-shard-unfrozen-in-frozen-unit",
    "FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#85831",
    relation="related",
    see_also=("pytorch/pytorch#104148", "pytorch/pytorch#105371"),
    ends_ranks=False,
    tag=":unfrozen-frozen-unit",
    condition=OfTreeAndTraining(fsdp1_unfrozen_in_frozen_unit),
)
FOREACH_MIXED = KnownBug(
    "foreach-mixed-dtensor-tensor",
    "foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise",
    upstream="pytorch/pytorch#183207",
    relation="same symptom (reached there through ignored_params)",
    condition=OfCase(foreach_over_mixed_case),
)
FSDP1_COMPILE_SHARDED_GRAD = KnownBug(
    "fsdp1-compile-recompile-sharded-grad",
    "torch.compile over FSDP1 (use_orig_params=True, sharded): a recompilation of the wrapped module's forward "
    "while its parameters hold sharded gradients (the suite's trees, a contract hook removed or a smaller "
    "last batch; not every recompilation: an nn.Sequential variant passes) raises InternalTorchDynamoError "
    "'attempting to assign a gradient of size ...'",
    upstream="pytorch/pytorch#111317",
    relation="same symptom (a comment there: SHARD_GRAD_OP, use_orig_params=True, float32)",
    state="open",
    see_also=("pytorch/pytorch#93288",),
    condition=OfTraining(fsdp1_compiled_with_sharded_grads),
)
DIVIDE_FACTOR_TWICE = KnownBug(
    "fully_shard-divide-factor-single-shard-twice",
    "set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with "
    "set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided "
    "by f twice (once where the single-rank branch copies the input, once more as the post-divide)",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings; the single-rank division came with the first pull request in "
    "see_also, and a later one reworks that branch without the post-divide; an older wrong scale with a "
    "divide factor under HSDP had another cause, fixed before this branch existed",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#167178", "pytorch/pytorch#196348", "pytorch/pytorch#195732", "pytorch/pytorch#155903"),
    ends_ranks=False,
    tag=":divide-factor-twice",
    training_only=True,
    condition=OfTraining(divide_factor_twice),
)
CHECKPOINT_DEBUG = KnownBug(
    "checkpoint-debug-always-refused",
    "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with "
    "non-default context_fn' on the first forward whatever the caller passes: it always hands "
    "torch.utils.checkpoint a context_fn of its own",
    upstream="pytorch/pytorch#185285",
    relation="same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier "
    "attempt in see_also)",
    state="not in torch 2.13.0",
    see_also=("pytorch/pytorch#175338",),
    conditional=True,
    condition=OfComposition(checkpoint_debug),
)
GROUP_FORCED_IN_RECOMPUTE = KnownBug(
    "fully_shard-group-force-completed-in-recompute",
    "grouped fully_shard([a, b]) with an output_dtype, one member recomputed by activation checkpointing: the "
    "group stays incomplete in backward, and a fully_shard unit recomputed inside another checkpoint region "
    "claims the forward root and force-completes that group, casting its own output to the group's "
    "output_dtype (CheckpointError: recomputed values have different metadata than during the forward pass; "
    "where nothing saved changes dtype, wrong gradients); also where the whole group is recomputed and the "
    "unit sits in its later module",
    symptoms=frozenset({"exception", "mismatch"}),
    ends_ranks=False,
    tag=":group-recompute-cast",
    relation="none found after four phrasings; related: the partial group forward support that added the "
    "force-completion at the forward root, a recomputation dtype mismatch fixed before torch 2.13, a grouped "
    "module reused in one iteration (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#180426", "pytorch/pytorch#180428", "pytorch/pytorch#159359", "pytorch/pytorch#183702"),
    conditional=True,
    condition=OfComposition(group_recomputed_in_part),
)
SAC_OVER_FSDP_UNIT = KnownBug(
    "selective-checkpoint-over-fully_shard-unit",
    "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region "
    "holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded "
    "by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's "
    "record_function markers and raises 'profiler._record_function_enter_new.default invocation index "
    "N encountered during backward but not found in storage'",
    upstream="pytorch/pytorch#196862",
    relation="same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)",
    state="the fix pull request is not in torch 2.13.0; torch 2.11 passes its case (device run, CPU)",
    see_also=("pytorch/pytorch#185178", "pytorch/torchtitan#3427"),
    conditional=True,
    introduced_in="2.13",
    condition=OfComposition(selective_over_unit),
)
DELAY_ALL_REDUCE_ROOT = KnownBug(
    "ddp-delay-all-reduce-root-params-reduced-twice",
    "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed "
    "parameter of the root module itself stays in the reducer too (the reducer leaves out "
    "f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is registered "
    "twice; with static_graph=True it is all-reduced twice, racing, and its gradient is wrong now and "
    "then; every parameter replicate() hands DDP is one (an nn.ParameterList's)",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings; the option came with the pull request in see_also. Wider than "
    "the delay: the same name (f'{module_name}.{name}') makes DDP._set_params_and_buffers_to_ignore_for_model "
    "miss root-level parameters with no delayed all-reduce at all. Narrower than a wrong gradient each time: "
    "without static_graph the root's delayed parameters are registered twice, but their gradients were right "
    "in 5 of 5 runs (an independent reproduction); the wrong gradients need static_graph=True. The condition "
    "keeps every delayed all-reduce under replicate (the double registration is there either way)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#95669",),
    ends_ranks=False,
    tag=":delay-all-reduce",
    races=True,
    # most cases that meet it pass, so it costs little to draw
    odds=4,
    condition=OfComposition(delayed_all_reduce),
)
COMPILED_UNFREEZE_PLAIN = KnownBug(
    "compile-unfrozen-plain-param-no-recompile",
    "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was "
    "compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the "
    "parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#139476",
    relation="same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)",
    state="present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there); pull "
    "request #177158 checks requires_grad on the guards' dict-tag fast path",
    fixed_in="2.13",
    ends_ranks=False,
    tag=":compiled-unfreeze",
    condition=OfTraining(lambda comp, training, _: compiled_unfreeze_ignored(comp, training)),
)
DELAY_BUFFER_FLOAT32 = KnownBug(
    "ddp-delay-all-reduce-float32-buffer",
    "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters "
    "that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and "
    "_clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with "
    "grad_dtype 'Double''",
    relation="none found after three phrasings (the error text, the buffer, the option); the option came "
    "with the pull request in see_also",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#95669",),
    condition=OfTraining(lambda comp, training, _: delayed_not_float32(comp, training)),
)
STAGER_REUSED_AFTER_CLOSE = KnownBug(
    "default-stager-reused-after-close",
    "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes "
    "its StateDictStager after every stage, which empties its copy dispatch table, and the next stage "
    "raises KeyError: <class 'type'> in deepcopy_with_tensor_offload",
    upstream="pytorch/pytorch#183413",
    relation="same bug (a regression of the pull request in see_also, which added the close)",
    state="present in torch 2.11; torch 2.13.0 stages again after a close",
    see_also=("pytorch/pytorch#170431", "pytorch/torchtitan#3476"),
    fixed_in="2.13",
    docs="docs/state_dict.md",
    condition=OfBody(stager_reused),
)
DTENSOR_CONV_PARTIAL = KnownBug(
    "dtensor-conv-partial-input-backward",
    "DTensor convolution runs the local op on its inputs as they are, not redistributed to the placements its "
    "sharding propagation chose (convolution_handler ignores needs_redistribute): a Partial input (a "
    "rowwise-parallel output) gives a local partial result labelled Replicate (wrong values, no error) and "
    "backward raises 'Can not redistribute from R to P(sum)'; a [Shard(0), Partial] input raises ValueError "
    "'Tensor dim 0 is already sharded on mesh dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a "
    "channel-sharded input (Shard(1)) raises the local conv's RuntimeError 'expected input[...] to have 2 "
    "channels, but got 1'",
    symptoms=frozenset({"exception", "mismatch"}),
    tag=":conv-partial",
    upstream="pytorch/pytorch#186129",
    relation="related: an open pull request whose description names the same handler defect (the handler runs "
    "the local op on still-sharded local tensors) for another layout, depthwise convolutions with a "
    "channel-sharded weight; none found for these layouts after seven phrasings (the error texts with "
    "convolution_backward and with convolution, DTensor conv1d with a partial input, the handler's "
    "redistribute, the convolution's single-dimension strategy, convolution_handler's dim_map, a "
    "channel-sharded conv1d input); related (see_also): the same handler's wrong grad_input placement for a "
    "spatially sharded input and its fix, whose strategies filter out layouts the handler's dim_map cannot "
    "represent; a grad_input of None",
    state="present in torch 2.13.0 (the pull request is open)",
    see_also=(
        "pytorch/pytorch#191926",
        "pytorch/pytorch#192147",
        "pytorch/pytorch#142278",
    ),
    # the frames are DTensor.redistribute's, DTensorSpec.dim_map's and OpOverload.__call__'s, which
    # any misuse of redistribute, any op given a dimension sharded twice and any op's own error
    # raise in
    conditional=True,
    condition=OfTree(spmd_tp_conv),
)
DTENSOR_MSE_LOSS = KnownBug(
    "dtensor-mse-loss-backward-local-count",
    "F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the global mean, but "
    "aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its decomposition at the "
    "global shape and runs the op on each rank's shard, which divides by the shard's element count: "
    "every gradient is the true one times the number of shards of the batch",
    symptoms=frozenset({"mismatch"}),
    relation="none found after ten phrasings (DTensor mse_loss backward gradient, mse_loss_backward sharding "
    "strategy, a DTensor loss's gradient multiplied by the world size over a sharded batch, decomposition "
    "sharding propagation and numel of a local shard, among them); related, not the same: nll_loss with "
    "weights over a sharded batch (a wrong forward value), DTensor.mean with uneven shards, loss parallel "
    "refusing 'mean' on N-D meshes; the decomposition-based propagation came with the last pull request",
    state="present in torch 2.13.0 and 2.11.0 (its torch-only reproducer in docs/known_bugs.md, on CPU)",
    see_also=("pytorch/pytorch#185167", "pytorch/pytorch#162692", "pytorch/pytorch#180936", "pytorch/pytorch#171652"),
    ends_ranks=False,
    tag=":mse-loss",
    training_only=True,
    condition=OfComposition(spmd_mse_loss),
)


#: Every record, in the order written above (a module's names keep the order they were bound in).
RECORDS: tuple[KnownBug, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, KnownBug))
