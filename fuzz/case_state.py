"""Case bodies of the state-dict and distributed-checkpoint properties, as pure data.

Both bodies train a model under a ``source`` composition, take its state (model and optimizer)
out, put it into a freshly built model and optimizer under a ``target`` composition, and let
both train on:

- :class:`StateDictBody` moves the state in memory through ``get_*_state_dict`` /
  ``set_*_state_dict`` (or FSDP2's own ``state_dict`` / ``load_state_dict``);
- :class:`DcpBody` moves it through ``torch.distributed.checkpoint`` save / async_save / load,
  beside Stateful objects, with the top-level dict built in a different order on each rank.

An empty composition (no fully_shard, no replicate, no wrapper) is a plain model, the same on
every rank, trained data-parallel by hand (gradients all-reduced). The rules below keep out
what the documented API does not support, each with its reason, so that a failing case is a
finding and not a misuse. Like :mod:`fuzz.case`, this module imports only the standard
library and :mod:`fuzz.case`.
"""

from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass, field
from typing import ClassVar

from fuzz.case import (
    MAX_STEPS,
    Body,
    Composition,
    ModuleTree,
    Training,
    Wrapper,
    check_composition,
    check_mesh,
    has_params,
)
from fuzz.errors import CaseError


def dcp_root(driver_pid: int | str) -> str:
    """Where the DCP round trips of the pool of driver ``driver_pid`` keep their checkpoints
    (shared by the ranks, which write there, and the driver, which cleans up at exit)."""
    return os.path.join(tempfile.gettempdir(), f"shardfuzz-dcp-{driver_pid}")


def is_plain(comp: Composition) -> bool:
    """No fully_shard, replicate or wrapper (activation checkpointing may still be applied)."""
    return not comp.shards and not comp.replicates and comp.wrapper is Wrapper.NONE


def tensor_kind(comp: Composition) -> str:
    """What a sharded (not full) state dict of the model holds: ``dtensor`` (fully_shard
    only), ``plain`` (plain model, DDP, replicate only), or ``mixed``."""
    if comp.wrapper is not Wrapper.NONE:
        return "plain" if comp.wrapper is Wrapper.DDP else comp.wrapper.value
    if not comp.shards:
        return "plain"
    return "mixed" if comp.replicates else "dtensor"


def _check_side(comp: Composition, tree: ModuleTree, where: str) -> None:
    if comp.wrapper.value.startswith("fsdp1"):
        # FSDP1 keeps optimizer state as flat local shards: reading it back would take the
        # very API under test (FSDP.optim_state_dict), so these properties leave FSDP1 out.
        raise CaseError(f"{where}.wrapper", f"{comp.wrapper.value} is not covered by the state-dict properties")
    if is_plain(comp):
        if comp.mesh:
            raise CaseError(f"{where}.mesh", "a plain model (no fully_shard) has no mesh")
        for i, path in enumerate(comp.checkpoints):
            if path not in tree.paths():
                raise CaseError(f"{where}.checkpoints[{i}]", f"{path!r} names no module of the tree")
        return
    check_composition(tree, comp, where)


def _check_common(
    tree: ModuleTree, source: Composition, target: Composition, training: Training, steps_after: int, meta: bool
) -> None:
    if not has_params(tree.root):
        raise CaseError("tree", "the tree has no parameters")
    _check_side(source, tree, "source")
    _check_side(target, tree, "target")
    if not 0 <= steps_after <= MAX_STEPS:
        raise CaseError("steps_after", f"steps_after={steps_after} is outside 0..{MAX_STEPS}")
    if training.grad_accum != 1:
        raise CaseError("training.grad_accum", "state-dict cases train one microbatch per step")
    if meta and (target.replicates or target.wrapper is not Wrapper.NONE):
        # DDP (and replicate) broadcast parameter values when applied: there are none on meta.
        raise CaseError("target_meta_init", "a meta-device target takes fully_shard or nothing, not DDP/replicate")
    for s in (*source.shards, *target.shards):
        if s.mixed_precision is not None or s.offload:
            raise CaseError("source.shards", "mixed precision and CPU offload are covered by the training properties")


def _check_drop(drop: tuple[int, ...]) -> None:
    if any(i < 0 for i in drop) or len(set(drop)) != len(drop):
        raise CaseError("drop", f"{list(drop)} must be distinct non-negative positions")


class Api(str, enum.Enum):
    """How the state leaves the source model and enters the target (:class:`StateDictBody`)."""

    SPLIT = "split"  # get/set_model_state_dict and get/set_optimizer_state_dict
    COMBINED = "combined"  # get_state_dict / set_state_dict
    MODULE = "module"  # FSDP2's model.state_dict() / load_state_dict(); the optimizer as SPLIT


@dataclass(frozen=True)
class Options:
    """The ``StateDictOptions`` of a get (``save``) or set (``load``) call."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    broadcast_from_rank0: bool = False
    strict: bool = True


@dataclass(frozen=True)
class StateDictBody(Body):
    """Train under ``source``, move the state in memory into a fresh model under ``target``.

    ``training.steps`` steps before the state is taken, ``steps_after`` more on both models
    after it was loaded (resume equivalence). ``drop`` are positions in the sorted list of the
    model's state-dict keys (modulo its length): those keys are left out of the state that is
    loaded (needs ``load.strict`` False) and keep their fresh values.
    """

    KIND: ClassVar[str] = "state_dict"
    tree: ModuleTree
    source: Composition
    target: Composition
    training: Training = field(default_factory=Training)
    steps_after: int = 1
    api: Api = Api.SPLIT
    save: Options = field(default_factory=Options)
    load: Options = field(default_factory=Options)
    target_meta_init: bool = False
    drop: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        save, load = self.save, self.load
        if save.broadcast_from_rank0 or not save.strict:
            raise CaseError("save", "broadcast_from_rank0 and strict apply to loading (set_*) only")
        # A full state dict holds plain tensors, a sharded one what the model holds (DTensors
        # under fully_shard): set_* must be told which it gets, and in memory a DTensor only
        # goes into a DTensor on the same mesh (resharding across meshes or kinds is what DCP
        # or a full state dict is for; set_model_state_dict refuses it).
        if load.full_state_dict != save.full_state_dict:
            raise CaseError("load.full_state_dict", "must equal save.full_state_dict: both describe the same dict")
        if not save.full_state_dict:
            kinds = (tensor_kind(self.source), tensor_kind(self.target))
            if kinds[0] != kinds[1] or kinds[0] not in ("dtensor", "plain"):
                raise CaseError("save.full_state_dict", f"a sharded state dict cannot go from {kinds[0]} to {kinds[1]}")
            if kinds[0] == "dtensor" and self.source.mesh != self.target.mesh:
                raise CaseError("target.mesh", "a sharded state dict in memory needs the same mesh on both sides")
        if load.broadcast_from_rank0 and not load.full_state_dict:
            raise CaseError("load.broadcast_from_rank0", "needs full_state_dict (documented in StateDictOptions)")
        if save.full_state_dict and save.cpu_offload and not load.broadcast_from_rank0:
            raise CaseError(
                "load.broadcast_from_rank0",
                "full_state_dict with cpu_offload leaves the state on rank 0 only: load it with broadcast_from_rank0",
            )
        if self.api is Api.MODULE and (
            save.full_state_dict or tensor_kind(self.source) != "dtensor" or tensor_kind(self.target) != "dtensor"
        ):
            raise CaseError("api", "FSDP2's own state_dict is sharded: use it between fully_shard'ed models only")
        if self.api is Api.COMBINED and self.target_meta_init:
            # set_state_dict needs the optimizer up front, but a full load into a meta model
            # replaces its parameters, so the optimizer must be built after the model load.
            raise CaseError("api", "a meta-device target loads its model before its optimizer exists: use split")
        if self.drop and load.strict:
            raise CaseError("drop", "leaving keys out of a load needs load.strict=False")
        if self.drop and self.target_meta_init:
            raise CaseError("drop", "a meta-device target has no values for the keys left out of the load")

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size, self.training.steps + self.steps_after

    def validate_for(self, world_size: int) -> None:
        for where, comp in (("source", self.source), ("target", self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)


class Entry(str, enum.Enum):
    """A top-level entry of the dict given to ``dcp.save`` / ``dcp.load``; its key is the value."""

    MODEL = "model"  # get_model_state_dict(model), or the module itself (DcpBody.module_stateful)
    OPTIMIZER = "optimizer"  # get_optimizer_state_dict(model, optimizer)
    APP = "app"  # a Stateful wrapping both: get_state_dict / set_state_dict
    SCALARS = "scalars"  # a Stateful holding Python scalars (int, float, str, bool, list)
    COUNTER = "counter"  # a Stateful whose state_dict and load_state_dict all_reduce on every rank
    EXTRA = "extra"  # a plain tensor, the same on every rank


class DcpMode(str, enum.Enum):
    ROUND_TRIP = "round_trip"  # save, load into a fresh model, compare, train both on
    SAVE_ONLY = "save_only"  # train, save into checkpoint_dir, report what was saved
    LOAD_ONLY = "load_only"  # build fresh, load from checkpoint_dir, report what was loaded


@dataclass(frozen=True)
class DcpBody(Body):
    """Train under ``source``, save through DCP, load into a fresh model under ``target``.

    ``orders[r]`` is the order in which rank ``r`` builds the top-level dict (a permutation of
    the positions in ``entries``; empty: ``entries`` order on every rank). ``skip`` are
    entries left out of the load (a partial load), ``drop`` model keys left out of it (as in
    :class:`StateDictBody`). ``checkpoint_dir`` (only with ``mode`` save-only / load-only) is
    kept after the case, so that another pool, of another world size, can load it.
    ``deadlock`` makes the counter's state_dict all_reduce on rank 0 only, inside dcp.save: a
    hang on purpose, for the test of the pool's hang report (never drawn by the strategies).
    """

    KIND: ClassVar[str] = "dcp"
    tree: ModuleTree
    source: Composition
    target: Composition
    entries: tuple[Entry, ...]
    training: Training = field(default_factory=Training)
    steps_after: int = 1
    orders: tuple[tuple[int, ...], ...] = ()
    skip: tuple[Entry, ...] = ()
    drop: tuple[int, ...] = ()
    save_full_state_dict: bool = False
    save_cpu_offload: bool = False
    load_full_state_dict: bool = False
    load_cpu_offload: bool = False
    module_stateful: bool = False
    async_save: bool = False
    #: FileSystemWriter / FileSystemReader objects instead of checkpoint_id=path.
    storage_objects: bool = False
    target_meta_init: bool = False
    mode: DcpMode = DcpMode.ROUND_TRIP
    checkpoint_dir: str = ""
    deadlock: bool = False

    def __post_init__(self) -> None:
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        entries = self.entries
        if not entries or len(set(entries)) != len(entries):
            raise CaseError("entries", f"{[e.value for e in entries]} must be non-empty and name each entry once")
        if Entry.APP in entries and (Entry.MODEL in entries or Entry.OPTIMIZER in entries):
            raise CaseError("entries", "app holds the model and the optimizer: use it instead of model / optimizer")
        for i, e in enumerate(self.skip):
            if e not in entries:
                raise CaseError(f"skip[{i}]", f"{e.value!r} is not among the entries saved")
        if len(set(self.skip)) != len(self.skip) or len(self.skip) >= len(entries):
            raise CaseError("skip", "must name each entry once and leave at least one entry to load")
        if self.module_stateful:
            if Entry.MODEL not in entries:
                raise CaseError("module_stateful", "applies to the model entry, which is not saved")
            if self.save_full_state_dict or self.load_full_state_dict:
                raise CaseError("module_stateful", "a module's own state_dict has no full_state_dict option")
            if Wrapper.DDP in (self.source.wrapper, self.target.wrapper):
                # DDP's own keys carry a "module." prefix; get_model_state_dict strips it.
                raise CaseError("module_stateful", "DDP's own state_dict keys differ from the plain model's")
        if self.drop and (Entry.MODEL not in entries or Entry.MODEL in self.skip or self.module_stateful):
            raise CaseError("drop", "leaving model keys out needs the model entry loaded as a state dict")
        if self.target_meta_init and not any(e in entries and e not in self.skip for e in (Entry.MODEL, Entry.APP)):
            raise CaseError("target_meta_init", "a meta-device target must load its model")
        if self.drop and self.target_meta_init:
            raise CaseError("drop", "a meta-device target has no values for the keys left out of the load")
        if (self.mode is DcpMode.ROUND_TRIP) == bool(self.checkpoint_dir):
            raise CaseError("checkpoint_dir", "is required by save-only / load-only and refused by round trips")
        if self.deadlock and Entry.COUNTER not in entries:
            raise CaseError("deadlock", "the deadlock is issued by the counter entry, which is not saved")

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size + len(self.entries), self.training.steps + self.steps_after

    def collective_entries(self) -> list[Entry]:
        """Entries whose ``state_dict`` runs collectives when dcp.save calls it: the counter,
        and app with full state dicts (get_state_dict gathers)."""
        out: list[Entry] = [e for e in self.entries if e is Entry.COUNTER]
        if Entry.APP in self.entries and self.save_full_state_dict:
            out.append(Entry.APP)
        return out

    def validate_for(self, world_size: int) -> None:
        for where, comp in (("source", self.source), ("target", self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)
        if self.orders and len(self.orders) != world_size:
            raise CaseError("orders", f"has {len(self.orders)} orders for world_size={world_size}; give one per rank")
        n = len(self.entries)
        for r, order in enumerate(self.orders):
            if sorted(order) != list(range(n)):
                raise CaseError(f"orders[{r}]", f"{list(order)} is not a permutation of 0..{n - 1}")
        # dcp.save calls each Stateful's state_dict in the dict's own order (dcp.load sorts the
        # keys first). Two entries that run collectives, in different orders on different
        # ranks, pair up the wrong collectives; the maintainers chose to leave save's order to
        # the caller (pytorch/pytorch#114304), so such a case is a misuse, not a finding.
        if len(set(self.orders)) > 1 and len(self.collective_entries()) > 1:
            raise CaseError(
                "orders",
                "per-rank orders allow at most one entry whose state_dict runs collectives (counter, full app)",
            )
