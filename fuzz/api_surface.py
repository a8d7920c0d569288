"""The API surface: what torch offers of the APIs under test, and how much of it the suite draws.

The items are read from the installed torch at run time, never from a hand list (:data:`SOURCES`
names where to look): the public methods of ``FSDPModule``; the parameters of ``fully_shard``,
``replicate``, ``checkpoint``, ``dcp.save`` / ``async_save`` / ``load``, ``FileSystemWriter``,
``FileSystemReader``, ``DefaultSavePlanner`` and ``DefaultLoadPlanner``; the fields of
``MixedPrecisionPolicy``, ``CPUOffloadPolicy`` and ``StateDictOptions``; the public functions
of ``torch.distributed.checkpoint.state_dict``; the names ``format_utils`` exports. Where a
function takes ``**kwargs``, its keyword arguments are the keys its source reads from them
(``kwargs.pop("use_reentrant", ...)``) and, for ``replicate``, the parameters of
``DistributedDataParallel``, which receives them.

:data:`USES` says how the suite exercises each item: the features (the names each property's
``features(case)`` records, counted in ``summary.json`` under ``features``) that show a case
used it, given as checklist items of :mod:`fuzz.coverage` and regular expressions, or why it
is not drawn. An item torch has and :data:`USES` does not know is ``unknown``; an entry of
:data:`USES` for an item this torch lacks (an older or newer torch) is listed as stale. An
unlisted name that starts with an underscore is ``private``.

torch is imported inside functions only: ``python -m fuzz`` starts without it. docs/api_surface.md
describes the table.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fuzz.coverage import CHECKLIST

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
# Where the surface is read from


@dataclass(frozen=True)
class Source:
    """One place in torch the surface is read from.

    ``kind``: ``methods`` (public methods of a class), ``parameters`` (of a function or a
    class's constructor), ``fields`` (of a dataclass), ``functions`` (public functions defined
    in a module), ``exports`` (a module's ``__all__``). ``kwargs_to``: (module, name) of the
    callable a function hands its ``**kwargs`` to; its parameters become the function's."""

    group: str
    module: str
    attr: str = ""
    kind: str = "parameters"
    kwargs_to: tuple[str, str] | None = None


_FSDP = "torch.distributed.fsdp"
_COMPOSABLE = "torch.distributed._composable"
_DCP = "torch.distributed.checkpoint"
_SD = "torch.distributed.checkpoint.state_dict"

SOURCES: tuple[Source, ...] = (
    Source("FSDPModule", _FSDP, "FSDPModule", "methods"),
    Source("fully_shard", _FSDP, "fully_shard"),
    Source("replicate", _COMPOSABLE, "replicate", kwargs_to=("torch.nn.parallel", "DistributedDataParallel")),
    Source("checkpoint", _COMPOSABLE, "checkpoint"),
    Source("dcp.save", _DCP, "save"),
    Source("dcp.async_save", _DCP, "async_save"),
    Source("dcp.load", _DCP, "load"),
    Source("FileSystemWriter", _DCP, "FileSystemWriter"),
    Source("FileSystemReader", _DCP, "FileSystemReader"),
    Source("DefaultSavePlanner", _DCP, "DefaultSavePlanner"),
    Source("DefaultLoadPlanner", _DCP, "DefaultLoadPlanner"),
    Source("MixedPrecisionPolicy", _FSDP, "MixedPrecisionPolicy", "fields"),
    Source("CPUOffloadPolicy", _FSDP, "CPUOffloadPolicy", "fields"),
    Source("StateDictOptions", _SD, "StateDictOptions", "fields"),
    Source("state_dict", _SD, "", "functions"),
    Source("format_utils", "torch.distributed.checkpoint.format_utils", "", "exports"),
)


@dataclass(frozen=True)
class SurfaceItem:
    """One item of the surface: ``name`` as tables show it (``FSDPModule.reshard``,
    ``dcp.save(planner)``, ``MixedPrecisionPolicy.param_dtype``), its source's group, and its
    kind (method, parameter, keyword, field, function, class)."""

    name: str
    group: str
    kind: str


@dataclass(frozen=True)
class Surface:
    """The surface one torch offers: its items, and the sources it lacks (``problems``)."""

    torch_version: str
    items: tuple[SurfaceItem, ...]
    problems: tuple[str, ...] = ()


def _load(module: str, attr: str) -> Any:
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _methods(cls: Any) -> list[tuple[str, str]]:
    """Public methods of a class other than nn.Module's (FSDPModule's instances are modules too;
    nn.Module's own methods are not its surface)."""
    from torch import nn

    inherited = set(dir(nn.Module))
    return [
        (n, "method")
        for n in dir(cls)
        if not n.startswith("_") and n not in inherited and callable(getattr(cls, n, None))
    ]


def _keyword_reads(fn: Callable[..., Any], kwargs_name: str) -> list[str]:
    """The keys ``fn``'s source reads from its ``**kwargs`` (``kwargs.pop("x")``, ``.get``,
    ``kwargs["x"]``, ``"x" in kwargs``), in order of appearance; [] without source."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return []
    found: list[tuple[int, int, str]] = []

    def is_kwargs(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == kwargs_name

    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_kwargs(node.func.value):
            if node.func.attr in ("pop", "get", "setdefault") and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_kwargs(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Compare)
            and len(node.comparators) == 1
            and is_kwargs(node.comparators[0])
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
        ):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((key.lineno, key.col_offset, key.value))
    out: list[str] = []
    for _, _, name in sorted(found):
        if name not in out:
            out.append(name)
    return out


def _parameters(source: Source, obj: Any) -> list[tuple[str, str]]:
    sig = inspect.signature(obj)
    out: list[tuple[str, str]] = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if p.kind is not inspect.Parameter.VAR_KEYWORD:
            out.append((p.name, "parameter"))
            continue
        keywords = _keyword_reads(obj, p.name)
        if source.kwargs_to is not None:
            forwarded = inspect.signature(_load(*source.kwargs_to)).parameters.values()
            keywords += [
                q.name
                for q in forwarded
                if q.name not in ("self", "module")
                and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            ]
        if not keywords:
            out.append((f"**{p.name}", "keyword"))
        out += [(k, "keyword") for k in dict.fromkeys(keywords) if k not in {n for n, _ in out}]
    return out


def _read(source: Source) -> list[SurfaceItem]:
    obj = _load(source.module, source.attr)
    if source.kind == "methods":
        return [SurfaceItem(f"{source.group}.{n}", source.group, k) for n, k in _methods(obj)]
    if source.kind == "fields":
        return [SurfaceItem(f"{source.group}.{f.name}", source.group, "field") for f in dataclasses.fields(obj)]
    if source.kind == "functions":
        names = [
            n
            for n, v in vars(obj).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == obj.__name__
        ]
        return [SurfaceItem(f"{source.group}.{n}", source.group, "function") for n in sorted(names)]
    if source.kind == "exports":
        names = list(getattr(obj, "__all__", ()))
        return [
            SurfaceItem(
                f"{source.group}.{n}", source.group, "class" if inspect.isclass(getattr(obj, n)) else "function"
            )
            for n in names
            if hasattr(obj, n) and not n.startswith("_")
        ]
    return [SurfaceItem(f"{source.group}({n})", source.group, k) for n, k in _parameters(source, obj)]


def read_surface(sources: Iterable[Source] = SOURCES) -> Surface:
    """The surface of the installed torch. A source this torch lacks (or that cannot be read) is
    named in ``problems``; the others are read all the same."""
    try:
        import torch
    except ImportError as e:
        return Surface("none", (), (f"torch cannot be imported: {e}",))
    items: list[SurfaceItem] = []
    problems: list[str] = []
    for source in sources:
        where = f"{source.module}.{source.attr}" if source.attr else source.module
        try:
            items += _read(source)
        except (ImportError, AttributeError) as e:
            problems.append(f"{source.group}: {where} is not in this torch ({type(e).__name__}: {e})")
        except (TypeError, ValueError) as e:
            problems.append(f"{source.group}: {where} cannot be introspected ({type(e).__name__}: {e})")
    return Surface(str(torch.__version__), tuple(items), tuple(problems))


@lru_cache(maxsize=1)
def installed_surface() -> Surface:
    """:func:`read_surface` of the installed torch, read once per process."""
    return read_surface()


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

#: Item name -> how the suite exercises it. Items torch has and this does not name are unknown.
USES: dict[str, Use] = {
    # FSDPModule (fully_shard's module class)
    "FSDPModule.reshard": _drawn(
        pattern=rf"{_V}knob:explicit_unshard",
        note="after an explicit unshard, the sharded state checked; also called after each probe forward of a "
        "state_dict or dcp side (fuzz/_rank/state_dict.py:reshard)",
        bound=">=",
    ),
    "FSDPModule.unshard": _drawn(
        pattern=rf"{_V}knob:explicit_unshard",
        note="unshard(async_op=True) and wait() before forward, the unsharded state checked (fuzz.model.Knobs)",
    ),
    "FSDPModule.reset_iter_state": _drawn(
        pattern=rf"{_V}knob:abort_and_reset",
        note="after a forward aborted by an exception (the documented recovery); must reshard every unit",
    ),
    "FSDPModule.set_is_last_backward": _drawn(
        pattern=rf"{_V}knob:reshard_after_backward_last", note="with set_reshard_after_backward, per microbatch"
    ),
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
    "FSDPModule.set_reshard_after_forward": _drawn(pattern=rf"{_V}knob:late_reshard_after_forward:(?:True|False)"),
    "FSDPModule.set_reshard_after_backward": _drawn(pattern=rf"{_V}knob:reshard_after_backward_last"),
    "FSDPModule.set_modules_to_forward_prefetch": _drawn(pattern=rf"{_V}knob:forward_prefetch"),
    "FSDPModule.set_modules_to_backward_prefetch": _drawn(pattern=rf"{_V}knob:backward_prefetch"),
    "FSDPModule.set_custom_all_gather": _drawn(
        pattern=rf"{_V}knob:custom_all_gather",
        note="a comm that performs the default all-gather; numerics unchanged, and the rank checks that it is called "
        "for every unit that ran, with the unit's shard group, into a buffer its allocate returned",
    ),
    "FSDPModule.set_custom_reduce_scatter": _drawn(
        pattern=rf"{_V}knob:custom_reduce_scatter",
        note="a comm that performs the default reduce-scatter; numerics unchanged, and the rank checks the group and "
        "that input and output are buffers its allocate returned",
    ),
    "FSDPModule.set_all_reduce_hook": _drawn(pattern="knob:all_reduce_hook_scale"),
    "FSDPModule.set_post_optim_event": _accelerator(
        "an event the all-gather streams wait on; on the CPU there are no streams to order"
    ),
    "FSDPModule.set_reduce_scatter_divide_factor": _deprecated("its docstring: use set_gradient_divide_factor"),
    "FSDPModule.set_gradient_divide_factor": _drawn(pattern="knob:gradient_divide_factor"),
    "FSDPModule.set_force_sum_reduction_for_comms": _drawn(pattern=rf"{_V}knob:force_sum_reduction"),
    "FSDPModule.set_reduce_scatter_unused_params": _drawn(
        pattern=rf"{_V}knob:reduce_scatter_unused",
        note="only without skipped modules, where every trainable parameter gets a gradient and the zeros it adds "
        "must change nothing; ranks that use different parameters are not drawn yet",
    ),
    "FSDPModule.set_reduce_scatter_max_input_buffers": _drawn(
        pattern=rf"{_V}knob:rs_max_buffers", note="experimental; 1 to 3 buffers in flight must not change numerics"
    ),
    "FSDPModule.set_separate_reduce_scatter_group": _drawn(
        pattern=rf"{_V}knob:separate_rs_group",
        note="experimental; numerics unchanged, and with custom comms the reduce-scatter must run on a group of "
        "its own over the shard ranks",
    ),
    "FSDPModule.set_unshard_in_backward": _drawn(
        pattern=rf"{_V}knob:no_unshard_in_backward",
        note="False on a unit of the first Linear in forward, whose parameters backward does not need "
        "(fuzz.model.Layout.unneeded_in_backward); numerics unchanged, and the rank checks that they stay sharded",
    ),
    "FSDPModule.set_allocate_memory_from_process_group_for_comm": _drawn(
        pattern=rf"{_V}knob:pg_allocator",
        note="staging buffers from the process group's allocator (gloo has none: torch.empty); numerics unchanged",
    ),
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


def _leaf_name(name: str) -> str:
    """``reshard`` of ``FSDPModule.reshard``, ``_extensions`` of ``FileSystemWriter(_extensions)``."""
    m = re.fullmatch(r"[^(]*\((.*)\)", name)
    return m.group(1) if m else name.rsplit(".", 1)[-1]


def _use_of(name: str, uses: Mapping[str, Use]) -> Use | None:
    if name in uses:
        return uses[name]
    if _leaf_name(name).startswith("_"):
        return Use(PRIVATE, note="its name starts with an underscore")
    return None


# --------------------------------------------------------------------------------------------
# The table


def _count(value: Any) -> int:
    """A feature count as fuzz.coverage reads it: not a number (a hand-edited summary) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return max(int(value), 0)


def api_coverage(
    features: Mapping[str, Any] | None = None,
    *,
    surface: Surface | None = None,
    uses: Mapping[str, Use] | None = None,
) -> dict[str, Any]:
    """The API-surface table, as JSON: ``torch`` (its version), ``rows`` (one per item, in
    the order torch gives them: ``name``, ``group``, ``kind``, ``status``, ``note``, ``bound``
    (see :class:`Use`), and for drawn items ``count`` and ``matched``, the feature names
    counted, most frequent first; ``count`` is None without ``features``), ``stale`` (entries of ``uses`` for items this
    torch lacks), ``problems`` (sources this torch lacks), ``statuses`` (items per status),
    ``drawn`` / ``total`` / ``share`` and ``drawable`` / ``drawable_share`` (the share among
    items that are not private, deprecated or accelerator-only), and ``groups`` (per group:
    ``drawn``, ``total``).

    ``features``: a campaign's feature counts (summary.json ``features``); None for the table
    without counts. ``surface`` and ``uses`` default to the installed torch and :data:`USES`."""
    surface = installed_surface() if surface is None else surface
    uses = USES if uses is None else uses
    counts = None if features is None else {str(n): _count(c) for n, c in features.items()}
    rows: list[dict[str, Any]] = []
    for item in surface.items:
        use = _use_of(item.name, uses)
        row: dict[str, Any] = {
            "name": item.name,
            "group": item.group,
            "kind": item.kind,
            "status": UNKNOWN if use is None else use.status,
            "note": "" if use is None else use.note,
            "bound": "" if use is None else use.bound,
        }
        if use is not None and use.status == DRAWN:
            if counts is None:
                row["count"], row["matched"] = None, []
            else:
                matched = sorted((n for n in counts if use.matches(n)), key=lambda n: (-counts[n], n))
                row["count"], row["matched"] = sum(counts[n] for n in matched), matched
        rows.append(row)
    names = {item.name for item in surface.items}
    total = len(rows)
    drawn = sum(r["status"] in DRAWN_STATUSES for r in rows)
    drawable = sum(r["status"] not in EXCLUDED_STATUSES for r in rows)
    groups: dict[str, dict[str, int]] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"drawn": 0, "total": 0})
        g["total"] += 1
        g["drawn"] += r["status"] in DRAWN_STATUSES
    return {
        "torch": surface.torch_version,
        "rows": rows,
        "stale": sorted(n for n in uses if n not in names) if surface.items else [],
        "problems": list(surface.problems),
        "statuses": {s: sum(r["status"] == s for r in rows) for s in STATUSES},
        "drawn": drawn,
        "total": total,
        "share": drawn / total if total else 0.0,
        "drawable": drawable,
        "drawable_share": drawn / drawable if drawable else 0.0,
        "groups": groups,
    }


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def summary_lines(table: Mapping[str, Any]) -> list[str]:
    """The shares and the counts per status, in words."""
    st = table["statuses"]
    lines = [
        f"drawn: {table['drawn']} of {table['total']} items ({_percent(table['share'])}): "
        f"{st[DRAWN]} shown by features, {st[EXERCISED]} exercised without a feature yet",
        f"drawn among the {table['drawable']} items that are not private, deprecated or accelerator-only: "
        f"{_percent(table['drawable_share'])}",
        "; ".join(f"{s}: {st[s]}" for s in STATUSES[2:]),
    ]
    if table["stale"]:
        lines.append(f"listed in fuzz.api_surface.USES but not in torch {table['torch']}: {', '.join(table['stale'])}")
    lines += [f"not read: {p}" for p in table["problems"]]
    return lines


def _count_text(row: Mapping[str, Any]) -> str:
    """A row's count as tables show it: ``-`` where there is none, ``<=N`` / ``>=N`` for bounds."""
    return "-" if row.get("count") is None else f"{row.get('bound', '')}{row['count']}"


def format_table(table: Mapping[str, Any]) -> str:
    """The table as text for the command line: item, status, count (``-`` without a
    campaign, or for items that are not drawn), note; then the shares per group and overall."""
    header = ("item", "status", "count", "note")
    body = [
        (
            r["name"],
            r["status"],
            _count_text(r),
            r["note"],
        )
        for r in table["rows"]
    ]
    widths = [max([len(header[i])] + [len(row[i]) for row in body]) for i in range(3)]
    lines = [f"API surface of torch {table['torch']} (read from torch at run time): {table['total']} items", ""]
    for row in (header, *body):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3])
    lines.append("")
    gw = max([len(g) for g in table["groups"]] + [5])
    for g, n in table["groups"].items():
        lines.append(f"{g.ljust(gw)}  {n['drawn']:3d} of {n['total']:3d} drawn")
    lines.append("")
    lines += summary_lines(table)
    return "\n".join(lines).rstrip() + "\n"


def html_section(table: Mapping[str, Any]) -> str:
    """The table as a section of the report page (fuzz.report's styles; every text escaped)."""

    def e(value: Any) -> str:
        return html.escape(str(value), quote=True)

    head = "<tr><th>item</th><th>status</th><th class=n>count</th><th>note</th></tr>"
    body = []
    for r in table["rows"]:
        cls = "" if r["status"] in DRAWN_STATUSES else ' class="never"'
        count = e(_count_text(r))
        body.append(
            f"<tr{cls}><td><code>{e(r['name'])}</code></td><td>{e(r['status'])}</td>"
            f"<td class=n>{count}</td><td class=small>{e(r['note'])}</td></tr>"
        )
    words = "".join(f"<div>{e(line)}</div>" for line in summary_lines(table))
    return (
        f"<h2>API surface of torch {e(table['torch'])} ({table['drawn']} of {table['total']} items drawn, "
        f"{_percent(table['share'])})</h2><div class=card>{words}</div><table>{head}{''.join(body)}</table>"
    )


#: The keys of a table from :func:`api_coverage` that the renderers read.
_TABLE_KEYS = frozenset(
    (
        "torch",
        "rows",
        "stale",
        "problems",
        "statuses",
        "drawn",
        "total",
        "share",
        "drawable",
        "drawable_share",
        "groups",
    )
)


def report_section(summary: Mapping[str, Any]) -> str:
    """The report page's section for a campaign ``summary``: its ``api_surface`` table where it
    holds one (summary.json written with it), else the table computed from its ``features``
    against the installed torch."""
    table = summary.get("api_surface")
    if not (isinstance(table, Mapping) and set(table) >= _TABLE_KEYS):
        raw = summary.get("features")
        table = api_coverage(raw if isinstance(raw, Mapping) else {})
    return html_section(table)
