"""How the suite exercises each item of the API surface (:mod:`fuzz.api_surface`): :class:`Use` and
the :data:`USES` table, which is data: the features (checklist items of :mod:`fuzz.coverage` and
regular expressions over the feature names each property records) that show a case used an item,
or why it is not drawn. The FSDPModule methods the knobs call are not listed by hand: their
entries are made from the knobs' field metadata (:class:`fuzz.model.Knobs`, ``"torch"``), with
the notes of :data:`_KNOB_NOTES`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from fuzz.coverage import CHECKLIST
from fuzz.model import Knobs

DRAWN = "drawn"
EXERCISED = "exercised, no feature yet"
NOT_DRAWN = "not drawn yet"
ACCELERATOR = "needs an accelerator"
DEPRECATED = "deprecated"
PRIVATE = "private"
UNKNOWN = "unknown"
#: Every status, in the order tables list them.
STATUSES = (DRAWN, EXERCISED, NOT_DRAWN, ACCELERATOR, DEPRECATED, PRIVATE, UNKNOWN)
#: Statuses whose items count as drawn in the share.
DRAWN_STATUSES = (DRAWN, EXERCISED)
#: Statuses whose items a CPU campaign is not meant to draw (the second share leaves them out).
EXCLUDED_STATUSES = (ACCELERATOR, DEPRECATED, PRIVATE)


# --------------------------------------------------------------------------------------------
# How the suite exercises each item


@dataclass(frozen=True)
class Use:
    """How the suite exercises one item. A drawn item names the checklist items of
    :mod:`fuzz.coverage` (``items``) and further feature names (``pattern``, matched against a
    whole name) that show a case used it; ``note`` says what the features cannot (a count that
    includes other APIs' cases, a value that is always passed). ``bound``: ``""`` where the
    count is exact, ``"<="`` where the features are recorded for other uses too (the count is
    an upper bound), ``">="`` where some uses record none of them (a lower bound)."""

    status: str
    items: tuple[str, ...] = ()
    pattern: str = ""
    note: str = ""
    bound: str = ""
    _regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.status not in STATUSES or self.status == UNKNOWN:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES[:-1]}")
        if (self.status == DRAWN) != bool(self.items or self.pattern):
            raise ValueError(f"a {self.status!r} use {'needs' if self.status == DRAWN else 'takes no'} features")
        if self.bound not in ("", "<=", ">=") or (self.bound and self.status != DRAWN):
            raise ValueError(f"bound {self.bound!r}: '', '<=' or '>=', and for drawn items only")
        unknown = [i for i in self.items if i not in _CHECKLIST_IDS]
        if unknown:
            raise ValueError(f"no checklist item {unknown} in fuzz.coverage")
        object.__setattr__(self, "_regex", re.compile(self.pattern) if self.pattern else None)

    def matches(self, feature: str) -> bool:
        if self._regex is not None and self._regex.fullmatch(feature):
            return True
        return any(_CHECKLIST[i].matches(feature) for i in self.items)


_CHECKLIST = {item.id: item for item in CHECKLIST}
_CHECKLIST_IDS = frozenset(_CHECKLIST)


def _drawn(*items: str, pattern: str = "", note: str = "", bound: str = "") -> Use:
    return Use(DRAWN, items=items, pattern=pattern, note=note, bound=bound)


def _exercised(note: str) -> Use:
    return Use(EXERCISED, note=note)


def _not_drawn(note: str = "") -> Use:
    return Use(NOT_DRAWN, note=note)


def _accelerator(note: str) -> Use:
    return Use(ACCELERATOR, note=note)


def _deprecated(note: str) -> Use:
    return Use(DEPRECATED, note=note)


_V = "(?:variant:)?"
_NO_COLLECTIVES = (
    "False: each rank writes its own __<rank>.metadata and dcp.load, finding no global .metadata, reads each "
    "rank's own; drawn where every rank loads what it saved (a plain or full state dict, or the same layout): "
    "across layouts dcp.load silently leaves the parts other ranks saved unloaded (a torch bug, "
    "docs/state_dict.md); no FSDP1, overwrite, absent, convert or dedup (they read the global metadata)"
)
_TORCH_SAVE_READER = (
    "rank 0 torch.save's the full model state dict (and the extra tensor), every rank loads it with "
    "dcp.load(storage_reader=BroadcastingTorchSaveReader(), planner=DynamicMetaLoadPlanner()); tensors only, "
    "into plain tensors (a full state dict, or DDP / replicate / plain models): into DTensors the reader's "
    "broadcasts hang (a torch bug, docs/state_dict.md)"
)
_NO_FLATTEN = (
    "False keeps a nested dict as one pickled object (no resharding, loaded by replacement instead of in "
    "place), which the state dicts here, DTensors inside nested dicts, do not fit; the default only"
)
_WITH_ASYNC = "the feature is recorded for save and async_save alike"
_STATE_DICT_OPTIONS = "the feature is recorded for FSDP1's own API too, which takes no StateDictOptions"
_DCP_ENTRIES = "dcp's {} entries passed as state dicts call it too, and no feature names them"
_REPLICATE_COUNT_FALSE = "the count is of cases with False"
_NEWER_DDP = (
    "drawn where the installed torch's DistributedDataParallel takes it (inspect.signature; torch 2.13 does, "
    "2.11 does not)"
)
_DELAY_BUG = (
    "reachable but too rare to count: strategies draw it only where a replicate call manages two trainable "
    "modules (one to hook, one to delay) and, a torch bug (fuzz.known.DELAY_ALL_REDUCE_ROOT), at the known-bug "
    "odds; none in 3,000 sampled parity cases. The corpus entry parity-mismatch-28f92215865a exercises it"
)

#: Notes on the FSDPModule methods the knobs call (fuzz.model.Knobs' field metadata "torch"), by method;
#: their USES entries are made from the metadata (:func:`_knob_uses`).
_KNOB_NOTES: dict[str, dict[str, str]] = {
    "reshard": {
        "note": (
            "after an explicit unshard, the sharded state checked; also called after each probe forward of a "
            "state_dict or dcp side (fuzz/_rank/state_dict.py:reshard)"
        ),
        "bound": ">=",
    },
    "unshard": {
        "note": "unshard(async_op=True) and wait() before forward, the unsharded state checked (fuzz.model.Knobs)",
    },
    "reset_iter_state": {
        "note": "after a forward aborted by an exception (the documented recovery); must reshard every unit",
    },
    "set_is_last_backward": {
        "note": "with set_reshard_after_backward, per microbatch",
    },
    "set_custom_all_gather": {
        "note": (
            "a comm that performs the default all-gather; numerics unchanged, and the rank checks that it is "
            "called for every unit that ran, with the unit's shard group, into a buffer its allocate returned"
        ),
    },
    "set_custom_reduce_scatter": {
        "note": (
            "a comm that performs the default reduce-scatter; numerics unchanged, and the rank checks the group "
            "and that input and output are buffers its allocate returned"
        ),
    },
    "set_reduce_scatter_unused_params": {
        "note": (
            "only without skipped modules, where every trainable parameter gets a gradient and the zeros it adds "
            "must change nothing; ranks that use different parameters are not drawn yet"
        ),
    },
    "set_reduce_scatter_max_input_buffers": {
        "note": "experimental; 1 to 3 buffers in flight must not change numerics",
    },
    "set_separate_reduce_scatter_group": {
        "note": (
            "experimental; numerics unchanged, and with custom comms the reduce-scatter must run on a group of "
            "its own over the shard ranks"
        ),
    },
    "set_unshard_in_backward": {
        "note": (
            "False on a unit of the first Linear in forward, whose parameters backward does not need "
            "(fuzz.model.Layout.unneeded_in_backward); numerics unchanged, and the rank checks that they stay "
            "sharded"
        ),
    },
    "set_allocate_memory_from_process_group_for_comm": {
        "note": "staging buffers from the process group's allocator (gloo has none: torch.empty); numerics unchanged",
    },
}


def _knob_uses() -> dict[str, Use]:
    """The FSDPModule methods the knobs call, each drawn where a case records its knob's feature
    (``knob:<field>``, with its value for late_reshard_after_forward; ``variant:`` in metamorphic
    cases): one entry per method named in a field's metadata ``"torch"``."""
    out: dict[str, Use] = {}
    for f in dataclasses.fields(Knobs):
        for method in f.metadata.get("torch", ()):
            out[f"FSDPModule.{method}"] = _drawn(pattern=rf"{_V}knob:{f.name}(?::\w+)?", **_KNOB_NOTES.get(method, {}))
    return out


#: Item name -> how the suite exercises it. Items torch has and this does not name are unknown.
USES: dict[str, Use] = {
    **_knob_uses(),
    # FSDPModule (fully_shard's module class)
    "FSDPModule.set_requires_gradient_sync": _drawn(
        "fsdp2.no_grad_sync",
        note="called with True before every microbatch of FSDP2 training; the count is of cases with False and "
        "includes DDP / FSDP1 cases that use no_sync() instead",
        bound="<=",
    ),
    "FSDPModule.set_requires_all_reduce": _drawn(
        "fsdp2.no_all_reduce",
        note="called with True before every microbatch of FSDP2 training; the count is of cases with False",
    ),
    "FSDPModule.set_post_optim_event": _accelerator(
        "an event the all-gather streams wait on; on the CPU there are no streams to order"
    ),
    "FSDPModule.set_reduce_scatter_divide_factor": _deprecated("its docstring: use set_gradient_divide_factor"),
    "FSDPModule.set_symm_mem_for_comm": _accelerator("NCCL symmetric memory"),
    # fully_shard
    "fully_shard(module)": _drawn("fsdp2.applied", note="a list of modules where fsdp2.grouped is recorded"),
    "fully_shard(mesh)": _drawn(
        "fsdp2.applied", note="always passed: a 1D mesh, HSDP's 2D mesh, or the shard dimension of a (shard, tp) mesh"
    ),
    "fully_shard(reshard_after_forward)": _drawn("fsdp2.raf_true", "fsdp2.raf_false", "fsdp2.raf_int"),
    "fully_shard(shard_placement_fn)": _drawn("fsdp2.shard_placement"),
    "fully_shard(mp_policy)": _drawn(pattern=rf"{_V}mp:\w+(?::\w+)?"),
    "fully_shard(offload_policy)": _accelerator("CPUOffloadPolicy moves parameters off an accelerator"),
    "fully_shard(ignored_params)": _drawn(
        pattern=r"fully_shard:ignored_params",
        note="parity only: a module's own parameters stay plain and local (their gradients are not averaged)",
    ),
    "fully_shard(dp_mesh_dims)": _drawn(
        pattern=rf"{_V}fully_shard:dp_mesh_dims",
        note="parity and metamorphic, 1D mesh: parameters and buffers replicated DTensors on the mesh first, each "
        "rank's batch its part of a global batch (Shard(0)); the reference is the plain model's average over "
        "ranks, the gradient of the global mean loss (HSDP's [Shard(0), Shard(0)] batch is what DTensor's "
        "operators refuse yet)",
    ),
    # replicate, and DistributedDataParallel's parameters, which receive its **kwargs
    "replicate(module)": _drawn("replicate.root", "replicate.sub"),
    "replicate(ignored_modules)": _drawn(
        "replicate.ignored",
        note="parity only: the ignored modules' gradients stay local, in the reference too; contract: their "
        "parameters are plain tensors replicate does not collect and DDP does not manage",
    ),
    "replicate(device_id)": _drawn(
        pattern=rf"{_V}replicate_opt:device_id", note="torch.device of the rank (device_ids None on the CPU)"
    ),
    "replicate(device_ids)": _accelerator("passed on every replicate: [device] on GPU ranks, None on the CPU"),
    "replicate(output_device)": _accelerator("the device of a GPU module's output"),
    "replicate(dim)": _drawn(
        pattern=rf"{_V}replicate_opt:dim",
        note="dim=1: DDP scatters inputs along dim only over several devices of one process, which a "
        "single-device module never does; numerics unchanged",
    ),
    "replicate(broadcast_buffers)": _deprecated("DistributedDataParallel since 2.13: use forward_sync_buffers"),
    "replicate(init_sync)": _drawn(pattern=rf"{_V}replicate_opt:init_sync:False", note=_REPLICATE_COUNT_FALSE),
    "replicate(process_group)": _drawn(
        pattern=rf"{_V}replicate_opt:group:process_group", note="a group of every rank (dist.new_group)"
    ),
    "replicate(bucket_cap_mb)": _drawn(
        pattern=rf"{_V}replicate_opt:bucket_cap_mb", note="0.0001 to 1 MiB: one bucket per few parameters here"
    ),
    "replicate(find_unused_parameters)": _drawn(
        "ddp.find_unused",
        note="the feature is recorded for DDP and replicate alike; the count includes DDP cases",
        bound="<=",
    ),
    "replicate(check_reduction)": _deprecated("DistributedDataParallel: 'This argument is deprecated'"),
    "replicate(gradient_as_bucket_view)": _drawn(pattern=rf"{_V}replicate_opt:gradient_as_bucket_view"),
    "replicate(static_graph)": _drawn(
        pattern=rf"{_V}replicate_opt:static_graph",
        note="the modules left out in and around the replicated one are the same on every microbatch (its "
        "documented condition); unused parameters then need no find_unused_parameters",
    ),
    "replicate(delay_all_reduce_named_params)": _not_drawn(_DELAY_BUG),
    "replicate(param_to_hook_all_reduce)": _not_drawn(_DELAY_BUG),
    "replicate(mixed_precision)": Use(PRIVATE, note="its type is torch.nn.parallel.distributed._MixedPrecision"),
    "replicate(device_mesh)": _drawn(pattern=rf"{_V}replicate_opt:group:device_mesh", note="a 1D mesh over every rank"),
    "replicate(skip_all_reduce_unused_params)": _drawn(
        pattern=rf"{_V}replicate_opt:skip_all_reduce_unused_params",
        note="the unused parameters the same throughout training, as documented (else a hang)",
    ),
    "replicate(bucket_cap_mb_list)": _drawn(pattern=rf"{_V}replicate_opt:bucket_cap_mb_list", note=_NEWER_DDP),
    "replicate(batched_grad_copy)": _drawn(pattern=rf"{_V}replicate_opt:batched_grad_copy", note=_NEWER_DDP),
    "replicate(forward_sync_buffers)": _drawn(
        pattern=rf"{_V}replicate_opt:forward_sync_buffers:(?:True|False)",
        note=_NEWER_DDP + "; replicate's DDP holds a ParameterList, which has no buffers to sync",
    ),
    # checkpoint (composable activation checkpointing)
    "checkpoint(module)": _drawn("checkpoint.before", "checkpoint.after", "checkpoint.state_dict"),
    "checkpoint(use_reentrant)": _drawn(
        "checkpoint.misuse_reentrant", note="True is a misuse (invalid): NotImplementedError on every rank"
    ),
    "checkpoint(preserve_rng_state)": _drawn(
        pattern=rf"{_V}checkpoint_opt:preserve_rng_state:False",
        note="False only where no dropout runs in a checkpointed module; the count is of cases with False",
    ),
    "checkpoint(context_fn)": _drawn(
        "checkpoint.selective",
        note="create_selective_checkpoint_contexts: matmuls MUST_SAVE, the rest PREFER_RECOMPUTE (a policy "
        "function or the list of ops)",
    ),
    "checkpoint(determinism_check)": _drawn(pattern=rf"{_V}checkpoint_opt:determinism_check:(?:default|none)"),
    "checkpoint(debug)": _drawn(
        pattern=rf"{_V}checkpoint_opt:debug",
        note="a torch bug (fuzz.known.CHECKPOINT_DEBUG: composable checkpoint always refuses it), so drawn rarely",
    ),
    "checkpoint(early_stop)": _drawn(pattern=rf"{_V}checkpoint_opt:early_stop:(?:True|False)"),
    # distributed checkpoint
    "dcp.save(state_dict)": _drawn("dcp.save"),
    "dcp.save(checkpoint_id)": _drawn(pattern="storage:checkpoint_id", note=_WITH_ASYNC, bound="<="),
    "dcp.save(storage_writer)": _drawn("dcp.storage_objects", note=_WITH_ASYNC, bound="<="),
    "dcp.save(planner)": _drawn(pattern="save_planner", note=_WITH_ASYNC, bound="<="),
    "dcp.save(process_group)": _drawn(pattern="process_group:own", note=_WITH_ASYNC, bound="<="),
    "dcp.save(no_dist)": _drawn("dcp.no_dist"),
    "dcp.save(use_collectives)": _drawn(pattern="use_collectives:false:save", note=_NO_COLLECTIVES),
    "dcp.async_save(state_dict)": _drawn("dcp.async_save"),
    "dcp.async_save(checkpoint_id)": _drawn(pattern="storage:checkpoint_id", note=_WITH_ASYNC, bound="<="),
    "dcp.async_save(storage_writer)": _drawn("dcp.storage_objects", "dcp.async_cached", note=_WITH_ASYNC, bound="<="),
    "dcp.async_save(planner)": _drawn(pattern="save_planner", note=_WITH_ASYNC, bound="<="),
    "dcp.async_save(process_group)": _drawn(
        "dcp.async_in_flight",
        pattern="process_group:own",
        note="saves that overlap training pass a gloo group of their own; process_group:own is recorded for "
        "save and async_save alike",
        bound="<=",
    ),
    "dcp.async_save(async_checkpointer_type)": _drawn(
        pattern="async_checkpointer:process",
        note="the count is of cases with PROCESS, one async save in 50: its checkpointing process per rank (spawned, "
        "with a gloo group of its own) costs about 8 s a case on a 2-core CPU; ended after each case",
    ),
    "dcp.async_save(async_stager)": _drawn(
        pattern="async_stager",
        note="an explicit DefaultStager(StagingOptions(...)) one async save in four, closed after the case's last "
        "save; pinned memory and non-blocking copies only with an accelerator",
    ),
    "dcp.async_save(no_dist)": _drawn(
        pattern=r"no_dist:async_save", note="half the no_dist round trips, where this torch's async_save takes it"
    ),
    "dcp.async_save(use_collectives)": _drawn(pattern="use_collectives:false:async_save", note=_NO_COLLECTIVES),
    "dcp.load(state_dict)": _drawn(pattern=r"load:(?:full|sharded)", note="every dcp case loads"),
    "dcp.load(checkpoint_id)": _drawn(pattern="storage:checkpoint_id"),
    "dcp.load(storage_reader)": _drawn("dcp.storage_objects"),
    "dcp.load(planner)": _drawn(pattern="load_planner"),
    "dcp.load(process_group)": _drawn(pattern="process_group:own"),
    "dcp.load(no_dist)": _drawn("dcp.no_dist"),
    "FileSystemWriter(path)": _drawn("dcp.storage_objects", "dcp.async_cached"),
    "FileSystemWriter(single_file_per_rank)": _drawn(
        pattern="writer:single_file_per_rank", note="the count is of cases with False (a file per item)"
    ),
    "FileSystemWriter(sync_files)": _drawn(pattern="writer:sync_files", note="the count is of cases with False"),
    "FileSystemWriter(thread_count)": _drawn(pattern="writer:thread_count", note="the count is of cases with 2 or 3"),
    "FileSystemWriter(per_thread_copy_ahead)": _drawn(
        pattern="writer:per_thread_copy_ahead",
        note="the count is of cases with a value other than 10 MB; on the CPU there is no device copy to run ahead",
    ),
    "FileSystemWriter(cache_staged_state_dict)": _drawn("dcp.async_cached"),
    "FileSystemWriter(overwrite)": _drawn("dcp.overwrite"),
    "FileSystemWriter(serialization_format)": _not_drawn(
        "SAFETENSORS (with the safetensors package installed) writes a checkpoint that no documented reader loads: "
        "FileSystemReader, dcp.load's reader for it, reads tensors with torch.load (UnpicklingError 'Weights only "
        "load failed ... Unsupported operand'), and HuggingFaceStorageReader reads *.safetensors files, not "
        "FileSystemWriter's __<rank>_<n>.distcp; the parameter is not in FileSystemWriter's docstring (it is "
        "HuggingFaceStorageWriter's hook); the default (torch.save) only"
    ),
    "FileSystemReader(path)": _drawn(
        "dcp.storage_objects",
        note="FSDP1's classic recipe (load_sharded_optimizer_state_dict) makes one too, and no feature names it",
        bound=">=",
    ),
    "DefaultSavePlanner(flatten_state_dict)": _not_drawn(_NO_FLATTEN),
    "DefaultSavePlanner(flatten_sharded_tensors)": _drawn(
        pattern="save_planner:flatten_sharded_tensors:false", note="the count is of cases with False"
    ),
    "DefaultSavePlanner(dedup_replicated_tensors)": _deprecated("ignored, with a warning that says so"),
    "DefaultSavePlanner(dedup_save_to_lowest_rank)": _drawn(pattern="save_planner:dedup_save_to_lowest_rank"),
    "DefaultSavePlanner(enable_plan_caching)": _drawn(pattern="save_planner:enable_plan_caching"),
    "DefaultLoadPlanner(flatten_state_dict)": _not_drawn(_NO_FLATTEN),
    "DefaultLoadPlanner(flatten_sharded_tensors)": _drawn(
        pattern="load_planner:flatten_sharded_tensors:false", note="the count is of cases with False"
    ),
    "DefaultLoadPlanner(allow_partial_load)": _drawn(
        pattern="load_planner:allow_partial_load",
        note="the count is of cases with True; absent:refused counts loads without it that must refuse",
    ),
    # policies and options
    "MixedPrecisionPolicy.param_dtype": _drawn(pattern=rf"{_V}mp:param_dtype:\w+"),
    "MixedPrecisionPolicy.reduce_dtype": _drawn("fsdp2.mp_reduce"),
    "MixedPrecisionPolicy.output_dtype": _drawn("fsdp2.mp_output"),
    "MixedPrecisionPolicy.cast_forward_inputs": _drawn("fsdp2.mp_no_cast", note="the count is of cases with False"),
    "CPUOffloadPolicy.pin_memory": _accelerator("pins the CPU copies of an accelerator's parameters"),
    "StateDictOptions.full_state_dict": _drawn("sd.full", note=_STATE_DICT_OPTIONS, bound="<="),
    "StateDictOptions.cpu_offload": _drawn("sd.cpu_offload", note=_STATE_DICT_OPTIONS, bound="<="),
    "StateDictOptions.ignore_frozen_params": _drawn(pattern="save:ignore_frozen_params"),
    "StateDictOptions.keep_submodule_prefixes": _deprecated("its docstring; it goes with the deprecated submodules"),
    "StateDictOptions.strict": _drawn(
        "sd.strict", "sd.non_strict", pattern="drop", note=_STATE_DICT_OPTIONS, bound="<="
    ),
    "StateDictOptions.broadcast_from_rank0": _drawn("sd.broadcast"),
    "StateDictOptions.flatten_optimizer_state_dict": _drawn(pattern="flatten_optimizer_state_dict"),
    "StateDictOptions.dsd_fqn_modifiers": _drawn(
        pattern="fused(:dsd_fqn_modifiers)?",
        note="not in StateDictOptions' docstring: the name of the method by which a module whose state-dict hooks "
        "hide a child says so (pytorch/pytorch#146557); the count is of cases with such modules, whose method has "
        "the default name ('fused') or the one the option passes ('fused:dsd_fqn_modifiers'); only "
        "set_model_state_dict reads the option (a known bug)",
    ),
    # torch.distributed.checkpoint.state_dict
    "state_dict.get_model_state_dict": _drawn(
        pattern="api:split|patched", note=_DCP_ENTRIES.format("model"), bound=">="
    ),
    "state_dict.set_model_state_dict": _drawn(
        pattern="api:split|patched", note=_DCP_ENTRIES.format("model"), bound=">="
    ),
    "state_dict.get_optimizer_state_dict": _drawn(
        pattern="api:(?:split|module)|patched", note=_DCP_ENTRIES.format("optimizer"), bound=">="
    ),
    "state_dict.set_optimizer_state_dict": _drawn(
        pattern="api:(?:split|module)|patched", note=_DCP_ENTRIES.format("optimizer"), bound=">="
    ),
    "state_dict.get_state_dict": _drawn("sd.combined", pattern="entry:app"),
    "state_dict.set_state_dict": _drawn("sd.combined", pattern="entry:app"),
    # format utilities
    "format_utils.dcp_to_torch_save": _drawn(pattern="format_utils:convert"),
    "format_utils.torch_save_to_dcp": _drawn(pattern="format_utils:convert"),
    "format_utils.BroadcastingTorchSaveReader": _drawn(
        pattern="format_utils:broadcasting_torch_save_reader", note=_TORCH_SAVE_READER
    ),
    "format_utils.DynamicMetaLoadPlanner": _drawn(
        pattern="format_utils:broadcasting_torch_save_reader", note="with BroadcastingTorchSaveReader (its N.B.)"
    ),
}
