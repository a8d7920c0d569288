"""Strategies for the options of ``replicate`` and ``checkpoint`` calls
(:class:`fuzz.model.ReplicateOptions`, :class:`fuzz.model.CheckpointOptions`).

An option is drawn only where the installed torch takes it: ``replicate`` hands its keyword
arguments to ``DistributedDataParallel``, whose parameters differ between torch versions
(``bucket_cap_mb_list``, ``batched_grad_copy`` and ``forward_sync_buffers`` are in 2.13, not in
2.11), and composable ``checkpoint`` reads its options from ``**kwargs``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import replace
from functools import cache
from typing import Any

from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.model import (
    CheckpointOptions,
    Composition,
    ContextFn,
    DeterminismCheck,
    Layout,
    ModuleTree,
    ReplicateGroup,
    ReplicateOptions,
    check_composition,
    has_dropout,
    is_ancestor,
)
from strategies._odds import keep_known


def _source(module: str, attr: str) -> str:
    try:
        return inspect.getsource(inspect.unwrap(getattr(importlib.import_module(module), attr)))
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


@cache
def replicate_takes(option: str) -> bool:
    """Whether the installed torch's ``replicate`` takes ``option``: a parameter of its own, a
    keyword its source reads (``device_id``), or a parameter of ``DistributedDataParallel``,
    which receives the rest. False where torch cannot be imported."""
    try:
        from torch.distributed._composable import replicate
        from torch.nn.parallel import DistributedDataParallel

        if option in inspect.signature(replicate).parameters:
            return True
        if option in inspect.signature(DistributedDataParallel).parameters:
            return True
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    return f'"{option}"' in _source("torch.distributed._composable.replicate", "replicate")


@cache
def checkpoint_takes(option: str) -> bool:
    """Whether the installed torch's composable ``checkpoint`` reads ``option`` from its keyword
    arguments (``kwargs.pop("option", ...)``); ``context_fn`` also needs selective
    checkpointing (``create_selective_checkpoint_contexts``)."""
    if option == "context_fn":
        try:
            from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: F401
        except ImportError:
            return False
    return f'"{option}"' in _source("torch.distributed._composable.checkpoint_activation", "checkpoint")


@cache
def fully_shard_refuses_shared() -> bool:
    """Whether the installed torch's fully_shard refuses a parameter that two units manage
    (``FSDPState._validate_no_duplicate_params``, torch 2.13; torch 2.11 raised nothing)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        return False
    return hasattr(FSDPState, "_validate_no_duplicate_params")


def _valid(tree: ModuleTree, comp: Composition) -> bool:
    try:
        check_composition(tree, comp)
    except CaseError:
        return False
    return True


@st.composite
def _ignored_modules(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> tuple[str, ...]:
    """Modules under replicated ones whose parameters replicate would manage, disjoint, each
    kept only where every replicate call still has a trainable parameter to manage."""
    layout = Layout(tree, comp)
    candidates = [
        p for p in tree.paths() if any(is_ancestor(r, p) and layout.manages_under(r, p) for r in comp.replicates)
    ]
    if not candidates:
        return ()
    chosen: tuple[str, ...] = ()
    for path in draw(st.lists(st.sampled_from(candidates), unique=True, min_size=1, max_size=2)):
        trial = (*chosen, path)
        if _valid(tree, replace(comp, replicate_options=ReplicateOptions(ignored_modules=trial))):
            chosen = trial
    return chosen


@st.composite
def replicate_options(draw: st.DrawFn, tree: ModuleTree, comp: Composition, *, local: bool = True) -> ReplicateOptions:
    """Options for the replicate calls of ``comp`` (about half of them each, where torch takes
    them). ``local``: also ``ignored_modules``, whose gradients are not averaged by design (the
    parity reference leaves them local too; metamorphic variants must not change numerics)."""
    fields: dict[str, Any] = {}

    def maybe(name: str, values: st.SearchStrategy[Any]) -> None:
        if replicate_takes(name):
            fields[name] = draw(values)

    # Bucket capacities in MiB: these models' parameters take a few hundred bytes, so fractions
    # of a MiB (0.0001 is about 100 bytes) spread them over several buckets; 0 gives each its own.
    maybe("bucket_cap_mb", st.sampled_from([None, 0.0001, 0.001, 1.0]))
    maybe("bucket_cap_mb_list", st.sampled_from([(), (0.0001, 0.001), (0.0, 0.0001), (1.0,)]))
    maybe("gradient_as_bucket_view", st.booleans())
    maybe("static_graph", st.booleans())
    maybe("init_sync", st.booleans())
    maybe("dim", st.sampled_from([0, 1]))
    if replicate_takes("process_group") and replicate_takes("device_mesh"):
        fields["group"] = draw(st.sampled_from(ReplicateGroup))
    maybe("device_id", st.booleans())
    maybe("forward_sync_buffers", st.sampled_from([None, True, False]))
    maybe("batched_grad_copy", st.booleans())
    maybe("skip_all_reduce_unused_params", st.booleans())
    if local and draw(st.sampled_from([False, True, True])):
        fields["ignored_modules"] = draw(_ignored_modules(tree, comp))
    # delay_all_reduce (delay_all_reduce_named_params + param_to_hook_all_reduce) meets a torch
    # bug under replicate (known.DELAY_ALL_REDUCE_ROOT: the delayed parameters are reduced
    # twice, racing): rarely, where some replicate call has a plan.
    # Only with the default bucket caps: torch 2.11 hands the delayed parameters' broadcast
    # (_broadcast_coalesced, whose buffer_size is an int) the raw cap, a TypeError for a float
    # (DDP types bucket_cap_mb_list as list[int]; 2.13 rounds it down), and a case's caps are
    # floats (ReplicateOptions).
    caps = [fields.get("bucket_cap_mb"), *fields.get("bucket_cap_mb_list", ())]
    default_caps = all(c is None for c in caps)
    if (
        replicate_takes("delay_all_reduce_named_params")
        and default_caps
        and keep_known(draw, known.DELAY_ALL_REDUCE_ROOT)
    ):
        trial = replace(comp, replicate_options=ReplicateOptions(**fields, delay_all_reduce=True))
        if _valid(tree, trial):
            fields["delay_all_reduce"] = True
    return ReplicateOptions(**fields)


def _dropout_checkpointed(tree: ModuleTree, comp: Composition) -> bool:
    paths = tree.paths()
    return any(has_dropout(paths[path]) for path in comp.checkpoints)


@st.composite
def checkpoint_options(draw: st.DrawFn, tree: ModuleTree, comp: Composition) -> CheckpointOptions:
    """Options for the checkpoint calls of ``comp`` (about half of them each, where torch takes
    them): ``preserve_rng_state=False`` only where no dropout runs inside a checkpointed module;
    ``context_fn`` over a fully_shard unit and ``debug`` rarely (torch bugs, see below)."""
    fields: dict[str, Any] = {}
    if checkpoint_takes("preserve_rng_state") and not _dropout_checkpointed(tree, comp):
        fields["preserve_rng_state"] = draw(st.booleans())
    # context_fn over a region holding a fully_shard unit meets a torch bug
    # (known.SAC_OVER_FSDP_UNIT): there rarely
    if checkpoint_takes("context_fn"):
        over_unit = known.selective_over_unit(
            replace(comp, checkpoint_options=CheckpointOptions(context_fn=ContextFn.SAVE_MATMULS))
        )
        if not over_unit or keep_known(draw, known.SAC_OVER_FSDP_UNIT):
            fields["context_fn"] = draw(st.sampled_from(ContextFn))
    if checkpoint_takes("determinism_check"):
        fields["determinism_check"] = draw(st.sampled_from([None, DeterminismCheck.DEFAULT, DeterminismCheck.NONE]))
    # debug=True: composable checkpoint always hands torch.utils.checkpoint a context_fn of its
    # own, which refuses debug (known.CHECKPOINT_DEBUG): rarely
    if checkpoint_takes("debug") and keep_known(draw, known.CHECKPOINT_DEBUG):
        fields["debug"] = True
    if checkpoint_takes("early_stop"):
        fields["early_stop"] = draw(st.sampled_from([None, True, False]))
    return CheckpointOptions(**fields)


@cache
def torch_has(module: str, attr: str, parameter: str) -> bool:
    """Whether the installed torch's ``module.attr`` takes ``parameter`` (a dataclass field
    counts): options a torch lacks are not drawn (the GPU hosts run an older torch than the CPU
    hosts). False where torch cannot be imported."""
    try:
        obj = getattr(importlib.import_module(module), attr)
        return parameter in inspect.signature(obj).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


def has_dp_mesh_dims() -> bool:
    """Whether this torch's fully_shard takes ``dp_mesh_dims``: SPMD programs
    (:attr:`fuzz.model.Composition.spmd`) run only where it does."""
    return torch_has("torch.distributed.fsdp", "fully_shard", "dp_mesh_dims")
