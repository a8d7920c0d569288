"""What a state_dict or dcp case exercises, as feature names (``features(case)`` of the two
properties, counted in a campaign's summary): the tree (fuzz.model.tree_features), the layouts
on both sides, the requires_grad schedule, the optimizer's parameters, the API and options of
the move.
"""

from __future__ import annotations

from fuzz import known
from fuzz.model import (
    DEFAULT_FQN_MODIFIERS,
    Api,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    ModuleTree,
    Overwrite,
    StateDictBody,
    is_fsdp1,
    is_plain,
    tensor_kind,
    tree_features,
)
from fuzz.properties.parity import SPMD_FEATURE
from fuzz.properties.state_dict_checks import (
    where_of,
)


def _layout_features(source: Composition, target: Composition) -> list[str]:
    out = [f"source:{where_of(source)}", f"target:{where_of(target)}"]
    if source == target:
        out.append("reshard:none")
    elif source.mesh != target.mesh and not is_plain(source) and not is_plain(target):
        out.append("reshard:mesh")
    elif tensor_kind(source) != tensor_kind(target):
        out.append(f"reshard:{tensor_kind(source)}->{tensor_kind(target)}")
    else:
        out.append("reshard:composition")
    for comp in (source, target):
        if any(s.shard_dim for s in comp.shards):
            out.append("shard_placement_fn")
        if comp.checkpoints:
            out.append("activation_checkpoint")
        if comp.spmd:
            out.append(SPMD_FEATURE)
        if comp.auto_wrap:
            out.append("fsdp1:auto_wrap")
        if known.fsdp1_shard1(comp):
            out.append("fsdp1:hybrid_shard1")
    return out


def _schedule_features(body: StateDictBody | DcpBody) -> list[str]:
    """requires_grad:freeze / :unfreeze, and :before_save / :after_save for where a change falls."""
    out = []
    for c in body.requires_grad:
        out.append("requires_grad:" + ("unfreeze" if c.trainable else "freeze"))
        out.append("requires_grad:" + ("before_save" if c.step < body.training.steps else "after_save"))
    return out


def _optimizer_features(tree: ModuleTree, frozen_in_optimizer: bool, empty_group: bool) -> list[str]:
    out = []
    if any(getattr(n, "frozen", False) for n in tree.paths().values()):
        out.append("frozen:in_optimizer" if frozen_in_optimizer else "frozen:model_only")
    if empty_group:
        out.append("param_groups:empty")
    return out


def features_state_dict(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, StateDictBody)
    s, ld = body.save, body.load
    out = [
        f"api:{body.api.value}",
        "state_dict:full" if s.full_state_dict else "state_dict:sharded",
        f"optimizer:{body.training.optimizer.value}",
        f"param_groups:{body.training.param_groups}",
        f"steps_after:{min(body.steps_after, 2)}",
    ]
    out += [f"save:{n}" for n, on in (("cpu_offload", s.cpu_offload),) if on]
    # FSDP1's own API reads broadcast_from_rank0 as its configs' rank0_only (fsdp1:rank0_only)
    broadcast = ld.broadcast_from_rank0 and body.api is not Api.FSDP1
    out += [f"load:{n}" for n, on in (("cpu_offload", ld.cpu_offload), ("broadcast_from_rank0", broadcast)) if on]
    out.append("strict" if ld.strict else "non-strict" + (":drop" if body.drop else ""))
    if s.ignore_frozen_params:
        out.append("save:ignore_frozen_params")
    if s.flatten_optimizer_state_dict:
        out.append("flatten_optimizer_state_dict")
    if body.fused:
        # dsd_fqn_modifiers: the option passed (a method of another name than torch's default)
        out.append("fused" if body.fqn_modifiers == DEFAULT_FQN_MODIFIERS else "fused:dsd_fqn_modifiers")
    if body.api is Api.FSDP1 and ld.broadcast_from_rank0:
        out.append("fsdp1:rank0_only")
    if body.target_meta_init:
        out.append("meta_init")
    fsdp1_sides = [side for side, comp in (("source", body.source), ("target", body.target)) if is_fsdp1(comp)]
    if fsdp1_sides and body.api is not Api.FSDP1:
        # get/set_*_state_dict on FSDP1 models: e.g. split:fsdp1_source, combined:fsdp1_both
        out.append(f"{body.api.value}:fsdp1_{'both' if len(fsdp1_sides) == 2 else fsdp1_sides[0]}")
    out += _optimizer_features(body.tree, body.frozen_in_optimizer, body.empty_group) + _schedule_features(body)
    out += tree_features(body.tree, case.world_size)
    return sorted(set(out + _layout_features(body.source, body.target)))


def features_dcp(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, DcpBody)
    out = [f"entry:{e.value}" for e in body.entries]
    out.append("orders:differ" if len(set(body.orders)) > 1 else "orders:same")
    out.append("async_save" if body.async_save else "save")
    out.append("storage:objects" if body.storage_objects else "storage:checkpoint_id")
    out.append(f"save:{'full' if body.save_full_state_dict else 'sharded'}")
    out.append(f"load:{'full' if body.load_full_state_dict else 'sharded'}")
    out += ["save:cpu_offload"] * body.save_cpu_offload + ["load:cpu_offload"] * body.load_cpu_offload
    out += [f"skip:{e.value}" for e in body.skip]
    if body.drop:
        out.append("drop")
    if body.module_stateful:
        out.append("module_stateful")
    if body.target_meta_init:
        out.append("meta_init")
    if len(body.collective_entries()) > 1:
        out.append("collective_statefuls:several")
    if body.patched:
        out.append("patched")
    fsdp1_sides = [side for side, comp in (("source", body.source), ("target", body.target)) if is_fsdp1(comp)]
    if fsdp1_sides:
        # how an FSDP1 side's state moves: e.g. fsdp1:app:target, fsdp1:patched:both, fsdp1:classic:both
        how = "classic" if body.classic_fsdp1 else "patched" if body.patched else "app"
        out.append(f"fsdp1:{how}:{'both' if len(fsdp1_sides) == 2 else fsdp1_sides[0]}")
    if body.classic_fsdp1 and DcpItem.OPTIMIZER in body.entries:
        out.append(f"api:{Api.FSDP1.value}")
    if body.overwrite is not Overwrite.NONE:
        out.append(f"overwrite:{body.overwrite.value}")
    if body.reloads_elsewhere():
        out.append("reload:one_rank")
        if body.reloads_in_half_world(case.world_size):
            out.append("reload:half_world")
    if body.async_saves:
        out.append("async:in_flight")
        out.append(f"async:saves:{body.async_saves}")
    if body.cache_staged:
        out.append("async:cached")
    if body.no_dist:
        out.append("no_dist")
        if body.async_save:
            out.append("no_dist:async_save")
    out += _optimizer_features(body.tree, body.frozen_in_optimizer, body.empty_group) + _schedule_features(body)
    out += _dcp_option_features(body) + tree_features(body.tree, case.world_size)
    return sorted(set(out + _layout_features(body.source, body.target)))


def _dcp_option_features(body: DcpBody) -> list[str]:
    """FileSystemWriter's I/O options, the planners' options, absent keys, format_utils."""
    out = [f"writer:{name}" for name in body.writer.changed()]
    sp, lp = body.save_planner, body.load_planner
    if sp is not None:
        out.append("save_planner")
        out += ["save_planner:dedup_save_to_lowest_rank"] * sp.dedup_save_to_lowest_rank
        out += ["save_planner:enable_plan_caching"] * sp.enable_plan_caching
        out += ["save_planner:flatten_sharded_tensors:false"] * (not sp.flatten_sharded_tensors)
    if lp is not None:
        out.append("load_planner")
        out += ["load_planner:allow_partial_load"] * lp.allow_partial_load
        out += ["load_planner:flatten_sharded_tensors:false"] * (not lp.flatten_sharded_tensors)
    if body.absent:
        out.append("absent:allowed" if lp is not None and lp.allow_partial_load else "absent:refused")
    if body.convert:
        out.append("format_utils:convert")
    if body.own_group:
        out.append("process_group:own")
    if body.stager is not None:
        out += body.stager.features()
    if body.process_checkpointer:
        out.append("async_checkpointer:process")
    if not body.use_collectives:
        out.append("use_collectives:false:" + ("async_save" if body.async_save else "save"))
    if body.torch_save_reader:
        out.append("format_utils:broadcasting_torch_save_reader")
    return out
