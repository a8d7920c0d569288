"""The feature-coverage checklist: what the design asks the suite to exercise, and what it did.

Each :class:`Item` is one feature of the APIs listed under "What it tests" in the design sketch
(``../shared/DESIGN.md``), in one of its five areas (:data:`AREAS`). An item matches
feature-event names, the strings each property's ``features(case)`` emits (``mesh:2x1``,
``variant:reshard_after_forward:int``, ``api:split``...), by a regular expression that must
match the whole name. :func:`coverage` turns a campaign's feature counts into one row per item.

Items the strategies cannot draw on CPU (CPUOffloadPolicy, drawn for accelerator pools only) or
at all yet are listed too, with ``generated=False`` and the name such a case would emit, so a report
shows them as never exercised instead of leaving them out. tests/test_report.py draws cases of
every property and checks both directions: each generated item matches a name that is really
emitted (a renamed feature cannot make an item look unexercised), and no emitted name matches
an item marked not generated (a new feature cannot hide behind a stale "not generated").

A count is a number of feature events, not of cases: a metamorphic case whose base and
variant both use a 1D mesh counts twice for the 1D mesh item.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The areas of the design sketch's "What it tests", in its order.
AREAS = ("fully_shard", "replicate+checkpoint", "FSDP1+DDP", "meshes", "models", "state dicts+DCP")

#: Optional prefix of the training properties' features of a metamorphic variant.
_V = "(?:variant:)?"


@dataclass(frozen=True)
class Item:
    """One checklist entry. ``pattern`` is a regular expression over feature names (matched
    against the whole name); ``generated`` says whether the strategies can draw it at all."""

    id: str
    label: str
    area: str
    pattern: str
    generated: bool = True
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.area not in AREAS:
            raise ValueError(f"item {self.id!r}: area={self.area!r} is not one of {AREAS}")
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def matches(self, feature: str) -> bool:
        return self._regex.fullmatch(feature) is not None


def _item(id: str, label: str, area: str, pattern: str, *, generated: bool = True) -> Item:
    return Item(id=id, label=label, area=area, pattern=pattern, generated=generated)


_FS, _RC, _W, _M, _MO, _SD = AREAS

CHECKLIST: tuple[Item, ...] = (
    # fully_shard (FSDP2)
    _item("fsdp2.applied", "fully_shard applied", _FS, rf"{_V}fully_shard:count:[1-9]|(?:source|target):fully_shard.*"),
    _item("fsdp2.nested", "fully_shard on submodules and the root", _FS, rf"{_V}fully_shard:count:[2-9]"),
    _item("fsdp2.grouped", "fully_shard([a, b]) grouped modules", _FS, rf"{_V}fully_shard:grouped"),
    _item("fsdp2.raf_true", "fully_shard reshard_after_forward=True", _FS, rf"{_V}reshard_after_forward:True"),
    _item("fsdp2.raf_false", "fully_shard reshard_after_forward=False", _FS, rf"{_V}reshard_after_forward:False"),
    _item("fsdp2.raf_int", "fully_shard reshard_after_forward=int", _FS, rf"{_V}reshard_after_forward:int"),
    _item("fsdp2.mp_param_bf16", "MixedPrecisionPolicy param_dtype=bfloat16", _FS, rf"{_V}mp:param_dtype:bfloat16"),
    _item("fsdp2.mp_param_fp16", "MixedPrecisionPolicy param_dtype=float16", _FS, rf"{_V}mp:param_dtype:float16"),
    _item("fsdp2.mp_reduce", "MixedPrecisionPolicy reduce_dtype", _FS, rf"{_V}mp:reduce_dtype:\w+"),
    _item("fsdp2.mp_output", "MixedPrecisionPolicy output_dtype", _FS, rf"{_V}mp:output_dtype:\w+"),
    _item("fsdp2.mp_no_cast", "MixedPrecisionPolicy cast_forward_inputs=False", _FS, rf"{_V}mp:no_cast_forward_inputs"),
    # CPUOffloadPolicy needs an accelerator: drawn for pools with one (nccl) only, never on CPU.
    _item(
        "fsdp2.cpu_offload", "fully_shard CPUOffloadPolicy (accelerator pools)", _FS, rf"{_V}offload", generated=False
    ),
    _item(
        "fsdp2.shard_placement",
        "fully_shard shard_placement_fn (Shard(1))",
        _FS,
        rf"{_V}shard_placement_fn:Shard\(1\)|shard_placement_fn",
    ),
    _item("fsdp2.uneven", "uneven shards", _FS, r"shards:uneven"),
    _item("fsdp2.empty", "empty shards (width < shard size)", _FS, r"shards:empty"),
    _item("fsdp2.meta_load", "meta-device init, then a state-dict load", _FS, r"meta_init"),
    _item(
        "fsdp2.meta_train",
        "meta-device init + lazy init, then training",
        _FS,
        rf"{_V}init:meta",
    ),
    _item("fsdp2.accum_sync", "gradient accumulation, reduce every microbatch", _FS, r"grad_accum:always"),
    _item(
        "fsdp2.no_grad_sync",
        "set_requires_gradient_sync(False) / no_sync()",
        _FS,
        r"grad_accum:no_grad_sync",
    ),
    _item("fsdp2.no_all_reduce", "set_requires_all_reduce(False) (HSDP)", _FS, r"grad_accum:no_all_reduce"),
    _item("fsdp2.frozen", "frozen parameters", _FS, r"param:frozen"),
    _item("fsdp2.unused", "unused parameters (no gradient)", _FS, r"param:unused(?::some-microbatches)?"),
    _item("fsdp2.unfrozen", "parameters unfrozen later in training", _FS, r"param:unfrozen_later"),
    _item("fsdp2.misuse_dim1", "invalid: Shard(1) on an uneven dimension raises", _FS, r"misuse:uneven_shard_dim_1"),
    # replicate and checkpoint, alone and composed with fully_shard
    _item(
        "replicate.root",
        "replicate on the root",
        _RC,
        rf"{_V}replicate:root|(?:source|target):replicate(?::hsdp)?",
    ),
    _item(
        "replicate.sub",
        "replicate on submodules, fully_shard on the rest",
        _RC,
        rf"{_V}replicate:sub|(?:source|target):fully_shard\+replicate(?::hsdp)?",
    ),
    _item("checkpoint.before", "checkpoint before fully_shard", _RC, rf"{_V}checkpoint:before_fully_shard"),
    _item("checkpoint.after", "checkpoint after fully_shard", _RC, rf"{_V}checkpoint:after_fully_shard"),
    _item("checkpoint.state_dict", "checkpoint in a saved / loaded model", _RC, r"activation_checkpoint"),
    _item(
        "replicate.misuse",
        "invalid: replicate after fully_shard raises",
        _RC,
        r"misuse:replicate_after_fully_shard",
    ),
    _item(
        "replicate.options",
        "replicate with DistributedDataParallel's options (buckets, static graph, groups ...)",
        _RC,
        rf"{_V}replicate_opt:(?!ignored_modules)\w+(?::\w+)?",
    ),
    _item(
        "replicate.ignored", "replicate ignored_modules (parameters kept local)", _RC, r"replicate_opt:ignored_modules"
    ),
    _item(
        "checkpoint.options",
        "checkpoint preserve_rng_state / determinism_check / early_stop",
        _RC,
        rf"{_V}checkpoint_opt:(?:preserve_rng_state|determinism_check|early_stop):\w+",
    ),
    _item(
        "checkpoint.selective",
        "selective activation checkpointing (checkpoint context_fn)",
        _RC,
        rf"{_V}checkpoint_opt:context_fn:\w+",
    ),
    _item(
        "checkpoint.misuse_reentrant",
        "invalid: checkpoint(use_reentrant=True) raises",
        _RC,
        r"misuse:checkpoint_use_reentrant",
    ),
    # fully_shard after replicate on one module raises nothing: neither documented nor drawn.
    _item(
        "replicate.fully_shard_after",
        "fully_shard after replicate on one module",
        _RC,
        r"misuse:fully_shard_after_replicate",
        generated=False,
    ),
    # FSDP1 and DDP
    _item("ddp", "DistributedDataParallel", _W, rf"{_V}wrapper:ddp|(?:source|target):ddp"),
    _item(
        "ddp.find_unused",
        "find_unused_parameters=True (DDP, replicate)",
        _W,
        rf"{_V}find_unused_parameters",
    ),
    _item("fsdp1.full_shard", "FSDP1 FULL_SHARD", _W, rf"{_V}wrapper:fsdp1_full_shard(?::auto_wrap)?"),
    _item("fsdp1.shard_grad_op", "FSDP1 SHARD_GRAD_OP", _W, rf"{_V}wrapper:fsdp1_shard_grad_op(?::auto_wrap)?"),
    _item("fsdp1.no_shard", "FSDP1 NO_SHARD", _W, rf"{_V}wrapper:fsdp1_no_shard(?::auto_wrap)?"),
    _item("fsdp1.hybrid_shard", "FSDP1 HYBRID_SHARD", _W, rf"{_V}wrapper:fsdp1_hybrid_shard(?::auto_wrap)?"),
    _item("fsdp1.auto_wrap", "FSDP1 auto-wrap policy", _W, rf"{_V}wrapper:fsdp1_\w+:auto_wrap"),
    _item("fsdp1.state_dict", "FSDP1 model saved or loaded (set_state_dict_type)", _W, r"(?:source|target):fsdp1_\w+"),
    _item(
        "fsdp1.optim_state_dict",
        "FSDP1 optim_state_dict / optim_state_dict_to_load",
        _W,
        r"api:fsdp1_optim_state_dict",
    ),
    # device meshes
    _item("mesh.1d", "1D mesh", _M, rf"{_V}mesh:\d+|(?:source|target):(?:fully_shard|replicate)[^:]*"),
    _item(
        "mesh.hsdp",
        "2D HSDP mesh, replicate and shard > 1",
        _M,
        rf"{_V}mesh:(?:[2-9]|\d\d+)x(?:[2-9]|\d\d+)",
    ),
    _item("mesh.hsdp_shard1", "2D HSDP mesh, shard size 1", _M, rf"{_V}mesh:\d+x1"),
    _item("mesh.hsdp_replicate1", "2D HSDP mesh, replicate size 1", _M, rf"{_V}mesh:1x\d+"),
    _item("mesh.hsdp_state_dict", "HSDP model saved or loaded", _M, r"(?:source|target):[\w+]+:hsdp"),
    _item(
        "mesh.tp",
        "FSDP + tensor parallel (Colwise / RowwiseParallel)",
        _M,
        rf"{_V}tp:\w+",
    ),
    # models as users train them (issue 46): the tree's ingredients, per property that draws them
    _item("model.sequence", "activations with a sequence dimension (B, S, W)", _MO, r"model:sequence"),
    _item("model.tokens", "integer token inputs through an embedding", _MO, r"model:tokens"),
    _item("model.padding_idx", "embedding with padding_idx", _MO, r"leaf:embedding:padding_idx"),
    _item("model.head", "vocabulary output projection", _MO, r"leaf:head(?::no-bias)?"),
    _item("model.cross_entropy", "cross-entropy loss over the vocabulary", _MO, r"loss:cross_entropy"),
    _item("model.tied", "weight tying: one Parameter in two modules (embedding, head)", _MO, r"param:tied"),
    _item(
        "model.tied_misuse",
        "invalid: a tied Parameter in two fully_shard units raises",
        _MO,
        r"misuse:tied_across_units",
    ),
    _item("model.rms_norm", "RMSNorm", _MO, r"leaf:rms_norm"),
    _item("model.mlp", "MLP whose Linears change the width (W -> 3W -> W)", _MO, r"leaf:mlp(?::no-bias)?"),
    _item("model.attention", "attention: q/k/v/o and scaled_dot_product_attention", _MO, r"leaf:attention(?::\w+)?"),
    _item("model.attention_causal", "causal attention", _MO, r"leaf:attention:causal"),
    _item("model.conv_sequence", "conv1d with kernel > 1 over the sequence", _MO, r"leaf:conv1d:kernel>1"),
    _item("model.block_param", "bare parameters on non-leaf modules", _MO, r"block:own-param"),
    _item("model.buffer", "persistent buffers on non-leaf modules", _MO, r"block:buffer"),
    _item("model.param_rank0", "bare scalar parameters (rank 0; replicate / DDP)", _MO, r"param:rank0"),
    _item("model.param_rank2", "bare parameters of rank 2 (a position embedding)", _MO, r"param:rank2"),
    _item("model.param_rank3", "bare parameters of rank 3 (a 3-D weight)", _MO, r"param:rank3"),
    _item(
        "model.scalar_misuse",
        "invalid: fully_shard over a scalar parameter raises",
        _MO,
        r"misuse:scalar_under_fully_shard",
    ),
    _item("model.non_persistent", "non-persistent buffers", _MO, r"block:buffer:non-persistent"),
    _item("model.containers", "ModuleList / ModuleDict containers", _MO, r"block:(?:list|dict)"),
    _item(
        "model.container_misuse",
        "invalid: fully_shard on a ModuleList / ModuleDict raises",
        _MO,
        r"misuse:container_unit",
    ),
    _item("model.shared_module", "submodules called twice in one forward", _MO, r"model:shared:called-twice"),
    _item("model.outputs", "tuple and dict outputs of a block", _MO, r"output:(?:tuple|dict)"),
    _item("model.intermediate_loss", "a loss over an intermediate (a stashed activation)", _MO, r"loss:intermediate"),
    _item(
        "model.multi_forward",
        "several forwards before one backward",
        _MO,
        r"training:forwards:[2-9]",
    ),
    _item("model.clip_grad", "clip_grad_norm_ (over DTensors, FSDP1's method)", _MO, r"training:clip_grad_norm"),
    _item("model.eval", "eval / inference_mode forwards between steps", _MO, r"training:eval:inference_mode"),
    _item("model.reinit", "parameters re-initialised after composing", _MO, r"training:reinit:(?:scale|constant)"),
    _item("model.replaced", "parameters replaced by new ones after composing", _MO, r"training:reinit:replace"),
    # state dicts and distributed checkpoint
    _item("sd.split", "get/set_model_state_dict + get/set_optimizer_state_dict", _SD, r"api:split"),
    _item("sd.combined", "get_state_dict / set_state_dict", _SD, r"api:combined"),
    _item("sd.module", "FSDP2 model.state_dict() / load_state_dict()", _SD, r"api:module"),
    _item(
        "sd.fsdp1_functions",
        "FSDP1 models under get/set_*_state_dict",
        _SD,
        r"(?:split|combined):fsdp1_(?:source|target|both)",
    ),
    _item("sd.full", "full state dict", _SD, r"state_dict:full|save:full|load:full"),
    _item("sd.sharded", "sharded state dict", _SD, r"state_dict:sharded|save:sharded|load:sharded"),
    _item("sd.broadcast", "broadcast_from_rank0", _SD, r"load:broadcast_from_rank0"),
    _item("sd.fsdp1_rank0_only", "FSDP1 FULL_STATE_DICT with rank0_only (its own API)", _SD, r"fsdp1:rank0_only"),
    _item("sd.cpu_offload", "StateDictOptions cpu_offload", _SD, r"(?:save|load):cpu_offload"),
    _item("sd.strict", "strict load", _SD, r"strict"),
    _item("sd.non_strict", "non-strict load", _SD, r"non-strict(?::drop)?"),
    _item("sd.partial", "partial load (keys or entries left out)", _SD, r"non-strict:drop|drop|skip:\w+"),
    _item("sd.resume", "training resumed after the load", _SD, r"steps_after:[1-9]"),
    _item("dcp.save", "DCP save + load", _SD, r"save"),
    _item("dcp.async_save", "DCP async_save + load", _SD, r"async_save"),
    _item("dcp.stateful", "Stateful objects in a checkpoint", _SD, r"entry:(?:app|scalars|counter)|module_stateful"),
    _item(
        "dcp.collective_stateful",
        "Stateful that issues collectives",
        _SD,
        r"entry:counter|collective_statefuls:several",
    ),
    _item("dcp.orders", "per-rank key orderings", _SD, r"orders:differ"),
    _item(
        "dcp.patched",
        "_patch_model_state_dict / _patch_optimizer_state_dict, the objects passed to DCP",
        _SD,
        r"patched",
    ),
    _item(
        "dcp.fsdp1_functions",
        "FSDP1 through DCP with get/set_*_state_dict (app or patched)",
        _SD,
        r"fsdp1:(?:app|patched):(?:source|target|both)",
    ),
    _item("dcp.storage_objects", "FileSystemWriter / FileSystemReader objects", _SD, r"storage:objects"),
    _item("dcp.overwrite", "saving over an existing checkpoint", _SD, r"overwrite:\w+"),
    _item("dcp.reshard_mesh", "load into another mesh", _SD, r"reshard:mesh"),
    _item("dcp.reshard_layout", "load into another composition", _SD, r"reshard:(?:composition|\w+->\w+)"),
    # Save-only / load-only cases exist (DcpMode) but no strategy draws them.
    _item("dcp.reshard_world", "load into another world size", _SD, r"reshard:world_size", generated=False),
    _item("dcp.async_cached", "async_save with cache_staged_state_dict", _SD, r"async:cached"),
    _item("dcp.async_in_flight", "optimizer steps while an async_save is in flight", _SD, r"async:in_flight"),
    _item("dcp.no_dist", "DCP save / load with no process group (no_dist)", _SD, r"no_dist"),
    _item("sd.optim_frozen", "frozen parameters held by the optimizer", _SD, r"frozen:in_optimizer"),
    _item("sd.empty_group", "an empty optimizer param group", _SD, r"param_groups:empty"),
    _item("compile", "torch.compile'd model", _SD, rf"{_V}compile(?::\w+)?"),
)


def _check_ids(items: tuple[Item, ...]) -> None:
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise ValueError(f"checklist item id {item.id!r} is used twice")
        seen.add(item.id)


_check_ids(CHECKLIST)


def coverage(features: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per :data:`CHECKLIST` item, in checklist order: ``id``, ``label``, ``area``,
    ``generated``, ``count`` (sum of the counts of the matching features), ``exercised``
    (count > 0) and ``matched`` (the matching feature names, most frequent first).

    Counts that are not numbers (a hand-edited summary) are taken as 0.
    """
    counts = {str(name): _count(n) for name, n in (features or {}).items()}
    rows = []
    for item in CHECKLIST:
        matched = sorted((n for n in counts if item.matches(n)), key=lambda n: (-counts[n], n))
        total = sum(counts[n] for n in matched)
        rows.append(
            {
                "id": item.id,
                "label": item.label,
                "area": item.area,
                "generated": item.generated,
                "count": total,
                "exercised": total > 0,
                "matched": matched,
            }
        )
    return rows


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return max(int(value), 0)


def coverage_per_property(features_per_property: Mapping[str, Any], area: str | None = None) -> list[dict[str, Any]]:
    """The checklist's rows (of ``area`` only, where given) with ``per_property``: each
    property's count of matching feature events (a campaign's ``summary.json``
    ``features_per_property``), properties by name; ``count`` is their sum."""
    per = {str(p): coverage(f if isinstance(f, Mapping) else {}) for p, f in (features_per_property or {}).items()}
    rows = []
    for i, item in enumerate(CHECKLIST):
        if area is not None and item.area != area:
            continue
        counts = {p: per[p][i]["count"] for p in sorted(per)}
        rows.append(
            {
                "id": item.id,
                "label": item.label,
                "area": item.area,
                "generated": item.generated,
                "per_property": counts,
                "count": sum(counts.values()),
            }
        )
    return rows


def format_per_property(rows: list[dict[str, Any]]) -> str:
    """:func:`coverage_per_property`'s rows as a text table: one column per property, ``-`` for
    an item no strategy draws yet."""
    props = sorted({p for r in rows for p in r["per_property"]})
    width = max([len(r["id"]) for r in rows] + [4])
    lines = ["  ".join([f"{'item':<{width}}", *(f"{p:>15}" for p in props), "  label"])]
    for r in rows:
        cells = [f"{(r['per_property'].get(p, 0) if r['generated'] else '-')!s:>15}" for p in props]
        lines.append("  ".join([f"{r['id']:<{width}}", *cells, "  " + r["label"]]))
    return "\n".join(lines) + "\n"
