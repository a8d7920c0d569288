"""How the DCP program (:mod:`fuzz._rank.dcp`) calls torch.distributed.checkpoint: the storage
writer and reader with the case's I/O options, the save and load planners (a recording planner
that keeps the last save's plan, plan caching cleared between cases), the process group of the
saves, the stagers of async saves and the checkpointer process, ``torch.save`` for the
broadcasting reader, and a load that asks for a key the checkpoint lacks. Each passes only what
differs from torch's defaults (``torch_kwargs``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch
import torch.distributed as dist

from fuzz._rank.context import RankContext
from fuzz._rank.state_dict import (
    torch_kwargs,
)
from fuzz.model import (
    Case,
    DcpBody,
)


def file_writer(body: DcpBody, path: str, **options: Any) -> Any:
    """A FileSystemWriter with ``options`` and the case's I/O options (body.writer), those
    passed only where they differ from torch's defaults."""
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemWriter(path, **options, **torch_kwargs(dcp.FileSystemWriter, body.writer.changed()))


_RECORDING_PLANNER: Any = None


def _recording_planner_class() -> Any:
    """DefaultSavePlanner, recording the items of this rank's local plan (before DCP dedups
    them across ranks), for the check of dedup_save_to_lowest_rank. It changes nothing."""
    global _RECORDING_PLANNER
    if _RECORDING_PLANNER is None:
        from torch.distributed.checkpoint import DefaultSavePlanner

        class RecordingSavePlanner(DefaultSavePlanner):
            local_items: list[list[Any]] = []

            def create_local_plan(self) -> Any:
                plan = super().create_local_plan()
                self.local_items = [plan_index(item.index) for item in self.plan.items]
                return plan

        _RECORDING_PLANNER = RecordingSavePlanner
    return _RECORDING_PLANNER


def plan_index(index: Any) -> list[Any]:
    """A MetadataIndex as JSON: [fqn, offset or None]."""
    return [index.fqn, None if index.offset is None else [int(o) for o in index.offset]]


#: The planner of the case's last save (its local plan's items), or None.
LAST_PLANNER: list[Any] = [None]


def save_planner(body: DcpBody) -> dict[str, Any]:
    """``{"planner": DefaultSavePlanner(...)}`` for a case with save_planner, else {}."""
    if body.save_planner is None:
        return {}
    from torch.distributed.checkpoint import DefaultSavePlanner

    o = body.save_planner
    options = {
        k: v
        for k, v in (
            ("flatten_sharded_tensors", o.flatten_sharded_tensors),
            ("dedup_save_to_lowest_rank", o.dedup_save_to_lowest_rank),
            ("enable_plan_caching", o.enable_plan_caching),
        )
        if v != (k == "flatten_sharded_tensors")
    }
    # The process-based checkpointer pickles the planner to its checkpointing process, which
    # cannot import a class made in a function: there DefaultSavePlanner itself (dedup, which
    # needs the recording, is not drawn with it).
    cls = DefaultSavePlanner if body.process_checkpointer else _recording_planner_class()
    planner = cls(**torch_kwargs(DefaultSavePlanner.__init__, options))
    LAST_PLANNER[0] = planner
    return {"planner": planner}


def _load_planner(body: DcpBody) -> dict[str, Any]:
    """``{"planner": DefaultLoadPlanner(...)}`` for a case with load_planner, else {}."""
    if body.load_planner is None:
        return {}
    from torch.distributed.checkpoint import DefaultLoadPlanner

    o = body.load_planner
    options = {
        k: v
        for k, v in (
            ("flatten_sharded_tensors", o.flatten_sharded_tensors),
            ("allow_partial_load", o.allow_partial_load),
        )
        if v != (k == "flatten_sharded_tensors")
    }
    return {"planner": DefaultLoadPlanner(**torch_kwargs(DefaultLoadPlanner.__init__, options))}


def clear_plan_caches() -> None:
    """enable_plan_caching keeps plans in class attributes of SavePlanner, keyed by the
    planner's class name, for the life of the process. A rank runs many cases (other dicts,
    other groups, no_dist saves of one rank); each case starts from an empty cache, as a
    fresh training job would, so that what it does depends on the case alone."""
    from torch.distributed.checkpoint.planner import SavePlanner

    for name in dir(SavePlanner):
        if name.startswith("_cached_") and isinstance(getattr(SavePlanner, name), dict):
            getattr(SavePlanner, name).clear()


def _group(body: DcpBody) -> dict[str, Any]:
    """``{"process_group": <a gloo group of this rank's own>}`` with own_group, else {}."""
    return {"process_group": async_group(CONTEXT[0])} if body.own_group else {}


#: The rank context of the case in progress (for _group, which makes the group once).
CONTEXT: list[Any] = [None]


def writer_kwargs(body: DcpBody, path: str, overwrite: bool | None = None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"no_dist": True} if body.no_dist else {}
    kwargs.update(_group(body))
    if body.storage_objects:
        options: dict[str, Any] = {} if overwrite is None else {"overwrite": overwrite}
        kwargs["storage_writer"] = file_writer(body, path, **options)
    else:
        kwargs["checkpoint_id"] = path
    kwargs.update(save_planner(body))
    return kwargs


def wait(result: Any) -> None:
    # A Future in torch 2.11; with some stagers newer versions return AsyncSaveResponse.
    future: Any = getattr(result, "upload_completion", result)
    future.result()


def save(body: DcpBody, state: dict[str, Any], path: str, overwrite: bool | None = None) -> None:
    import torch.distributed.checkpoint as dcp

    kwargs = writer_kwargs(body, path, overwrite)
    kwargs.update(collectives(body))
    if body.async_save:
        stager = make_stager(body)
        try:
            wait(dcp.async_save(state, **kwargs, **async_kwargs(body, stager)))
        finally:
            close(stager)
    else:
        dcp.save(state, **kwargs)


def collectives(body: DcpBody) -> dict[str, Any]:
    """``{"use_collectives": False}`` for a rank-local save, else {} (torch's default)."""
    return {} if body.use_collectives else {"use_collectives": False}


def make_stager(body: DcpBody) -> Any:
    """The case's ``DefaultStager(StagingOptions(...))`` (body.stager), or None."""
    if body.stager is None:
        return None
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    o = body.stager
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=o.use_pinned_memory,
            use_shared_memory=o.use_shared_memory,
            use_async_staging=o.use_async_staging,
            use_non_blocking_copy=o.use_non_blocking_copy,
        )
    )


def close(stager: Any) -> None:
    """async_save documents: "If you provide an async_stager, call close() after the last
    checkpoint is saved"."""
    if stager is not None:
        stager.close()


def async_kwargs(body: DcpBody, stager: Any) -> dict[str, Any]:
    """async_save's own options: the explicit stager, the process-based checkpointer."""
    kwargs: dict[str, Any] = {}
    if stager is not None:
        kwargs["async_stager"] = stager
    if body.process_checkpointer:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
    return kwargs


def staged(result: Any) -> None:
    """Wait until async_save's local copy of the state is complete, where it says when
    (AsyncSaveResponse.staging_completion: "indicates when local copy of state_dict is
    complete"; an asynchronous stager): only then may the state change."""
    staging = getattr(result, "staging_completion", None)
    if staging is not None:
        staging.result()


def end_checkpoint_process() -> dict[str, Any]:
    """End this rank's checkpointing process (AsyncCheckpointerType.PROCESS), which torch
    keeps for the life of the rank (a daemon process, started by the first such save): a case
    leaves no process behind, and the next one starts its own, as a fresh training job would.
    torch has no public call for it; this does what the process object's own __del__ does
    (a TERMINATE request, a join, SIGTERM if it is still alive) and forgets it."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if process is None:
        return {"started": False, "alive_after": False}
    executor._CHECKPOINT_PROCESS = None
    child = process._save_process
    try:
        if child.is_alive():
            process._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
            child.join(timeout=10)
    finally:
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)
    return {"started": True, "alive_after": child.is_alive(), "exitcode": child.exitcode}


#: The file rank 0 torch.save's for DcpBody.torch_save_reader, inside the case's directory.
TORCH_SAVE_FILE = "torch_save.pt"


def torch_save(state: dict[str, Any], path: str, ctx: RankContext) -> None:
    """Rank 0 torch.save's the state (the full model state dict, the extra tensor) to a file
    in ``path``, which every rank then loads (torch_save_reader)."""
    # A Stateful (the patched model) is saved as its state dict, as dcp.save would take it
    # (its state_dict may gather: every rank calls it).
    plain = {k: v if isinstance(v, (dict, torch.Tensor)) else v.state_dict() for k, v in state.items()}
    if ctx.rank == 0:
        os.makedirs(path, exist_ok=True)
        torch.save(plain, os.path.join(path, TORCH_SAVE_FILE))
    dist.barrier()


def load(body: DcpBody, state: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp

    if body.torch_save_reader:
        from torch.distributed.checkpoint.format_utils import BroadcastingTorchSaveReader, DynamicMetaLoadPlanner

        dcp.load(
            state,
            storage_reader=BroadcastingTorchSaveReader(),
            planner=DynamicMetaLoadPlanner(),
            checkpoint_id=os.path.join(path, TORCH_SAVE_FILE),
        )
        return
    kwargs: dict[str, Any] = {"no_dist": True} if body.no_dist else {}
    kwargs.update(_load_planner(body))
    kwargs.update(_group(body))
    if body.storage_objects:
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), **kwargs)
    else:
        dcp.load(state, checkpoint_id=path, **kwargs)


#: The key of the tensor the load asks for and the checkpoint lacks (DcpBody.absent).
ABSENT = "absent"
#: What DefaultLoadPlanner raises for it without allow_partial_load.
MISSING_KEY = "Missing key in checkpoint state_dict: " + ABSENT


def load_with_absent(body: DcpBody, case: Case, state: dict[str, Any], path: str) -> dict[str, Any]:
    """dcp.load of ``state`` and one tensor more, ``absent``, that the checkpoint lacks. With
    allow_partial_load the load succeeds and leaves that tensor alone; without it DCP must
    refuse on every rank ("Missing key in checkpoint state_dict: absent"), and then the state
    is loaded again without it."""
    marker = torch.arange(3, dtype=torch.float64) + (case.seed % 13) + 0.5
    state[ABSENT] = marker
    before = [float(v) for v in marker.tolist()]
    refusal: dict[str, str] | None = None
    try:
        load(body, state, path)
    except BaseException as e:  # CheckpointException derives from BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        refusal = {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)[:4000]}
    after = [float(v) for v in state.pop(ABSENT).tolist()]
    if refusal is not None:
        load(body, state, path)
    return {"refusal": refusal, "before": before, "after": after}


#: The process group of the saves that overlap training (made once per rank process).
_ASYNC_GROUP: Any = None


def async_group(ctx: RankContext) -> Any:
    """A gloo group of its own for async saves during which the source trains (and for the
    saves and loads of own_group cases). The upload
    thread runs DCP's collectives (gather / scatter of plans) while the main thread runs the
    training's; on one group the two threads would enqueue them in an order that can differ
    between ranks, and gloo pairs collectives by order. torch's own fix of in-flight staging
    (pytorch/pytorch#145408) saves over dist.new_group(backend="gloo") the same way."""
    global _ASYNC_GROUP
    if _ASYNC_GROUP is None:
        _ASYNC_GROUP = dist.new_group(backend="gloo")
        ctx.extra_groups.append(_ASYNC_GROUP)
    return _ASYNC_GROUP


def directory_digest(path: str) -> str:
    """The names and contents of every file under ``path`` (to show a refused save left it
    alone), read directly rather than through DCP."""
    digest = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()
