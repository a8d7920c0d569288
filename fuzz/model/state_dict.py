"""Case bodies of the state-dict and distributed-checkpoint properties, as pure data.

Both bodies train a model under a ``source`` composition, take its state (model and optimizer)
out, put it into a freshly built model and optimizer under a ``target`` composition, and let
both train on:

- :class:`StateDictBody` moves the state in memory through ``get_*_state_dict`` /
  ``set_*_state_dict`` (which take FSDP1 models too, so state moves between FSDP1 and the
  other APIs), FSDP2's own ``state_dict`` / ``load_state_dict``, or FSDP1's own state dicts;
- :class:`DcpBody` moves it through ``torch.distributed.checkpoint`` save / async_save / load,
  beside Stateful objects, with the top-level dict built in a different order on each rank;
  the model and optimizer go in as state dicts, in an app Stateful, or as the objects
  themselves with state dicts patched to get/set_*_state_dict (FSDP1 models too, to and from
  any layout), or as FSDP1's own state dicts between FSDP1 models (the classic recipe).

An empty composition (no fully_shard, no replicate, no wrapper) is a plain model, the same on
every rank, trained data-parallel by hand (gradients all-reduced). The rules keep out what the
documented API does not support, each with its reason, so that a failing case is a finding and
not a misuse: those over a side, the state-dict moves and the requires_grad schedules in
:mod:`fuzz.model.state_dict_rules`, the bodies' own in their ``_check_*`` methods here. This
module imports only the standard library and the model.
"""

from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass, field, fields
from typing import ClassVar

from fuzz.errors import CaseError
from fuzz.model.case import Body
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.rules import check_mesh
from fuzz.model.state_dict_rules import (
    CUSTOM_FQN_MODIFIERS,
    DEFAULT_FQN_MODIFIERS,
    RequiresGrad,
    check_common,
    check_drop,
    check_frozen_in_optimizer,
    fsdp1_in_memory_problem,
    fused_problem,
    is_fsdp1,
    is_plain,
    schedule_problem,
    sharded_in_memory_problem,
    tensor_kind,
    trainable_at,
)
from fuzz.model.training import Training
from fuzz.model.tree import Block, ModuleTree


def dcp_root(driver_pid: int | str) -> str:
    """Where the DCP round trips of the pool of driver ``driver_pid`` keep their checkpoints
    (shared by the ranks, which write there, and the driver, which cleans up at exit)."""
    return os.path.join(tempfile.gettempdir(), f"shardfuzz-dcp-{driver_pid}")


def _check_schedule(body: StateDictBody | DcpBody) -> None:
    problem = schedule_problem(
        body.tree,
        body.source,
        body.target,
        body.training,
        body.steps_after,
        body.requires_grad,
        body.frozen_in_optimizer,
    )
    if problem:
        raise CaseError(*problem)


def trained_then_frozen(body: StateDictBody | DcpBody) -> list[str]:
    """Leaves that trained during some step before the state was taken and are frozen when it
    is loaded (the target replays the changes made before the save)."""
    steps = body.training.steps
    at_load = trainable_at(body.tree, body.requires_grad, steps - 1)
    trained = {p for s in range(steps) for p, on in trainable_at(body.tree, body.requires_grad, s).items() if on}
    return sorted(p for p in trained if not at_load[p])


class Api(str, enum.Enum):
    """How the state leaves the source model and enters the target (:class:`StateDictBody`)."""

    SPLIT = "split"  # get/set_model_state_dict and get/set_optimizer_state_dict (any models, FSDP1 too)
    COMBINED = "combined"  # get_state_dict / set_state_dict (any models, FSDP1 too)
    MODULE = "module"  # FSDP2's model.state_dict() / load_state_dict(); the optimizer as SPLIT
    #: FSDP1: FSDP.set_state_dict_type (SHARDED_STATE_DICT, or FULL_STATE_DICT with
    #: save.full_state_dict), model.state_dict() / load_state_dict(), FSDP.optim_state_dict and
    #: optim.load_state_dict(FSDP.optim_state_dict_to_load(...)); save.cpu_offload is the
    #: configs' offload_to_cpu. load.broadcast_from_rank0 (full only) is the configs'
    #: rank0_only, on save and load: the state is taken on rank 0 alone; the model's reaches
    #: the other ranks as a file would (broadcast_object_list), the optimizer's through
    #: optim_state_dict_to_load's own broadcast from rank 0.
    FSDP1 = "fsdp1_optim_state_dict"


@dataclass(frozen=True)
class Options:
    """The ``StateDictOptions`` of a get (``save``) or set (``load``) call.

    ``ignore_frozen_params`` (get only: "the returned state_dict won't contain any frozen
    parameters"); ``flatten_optimizer_state_dict`` (the optimizer state dict as one flat dict
    keyed ``state.<fqn>.<key>`` / ``param_groups.<fqn>.<key>``, on get and on set)."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    broadcast_from_rank0: bool = False
    strict: bool = True
    ignore_frozen_params: bool = False
    flatten_optimizer_state_dict: bool = False


@dataclass(frozen=True)
class StateDictBody(Body):
    """Train under ``source``, move the state in memory into a fresh model under ``target``.

    ``training.steps`` steps before the state is taken, ``steps_after`` more on both models
    after it was loaded (resume equivalence). ``drop`` are positions in the sorted list of the
    model's state-dict keys (modulo its length): those keys are left out of the state that is
    loaded (needs ``load.strict`` False) and keep their fresh values.

    ``frozen_in_optimizer`` hands the frozen parameters to the optimizer too (they get no
    gradient, so no state); ``empty_group`` adds a param group without parameters, with its
    own lr. Both optimizers of a case are built the same way.
    """

    KIND: ClassVar[str] = "state_dict"
    PROGRAM: ClassVar[str] = "fuzz._rank.state_dict:run_state_dict"
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
    frozen_in_optimizer: bool = False
    empty_group: bool = False
    #: Leaves frozen and unfrozen between steps (:class:`RequiresGrad`).
    requires_grad: tuple[RequiresGrad, ...] = ()
    #: Parameter leaves built as fused modules on both sides: each held under a child that
    #: its state dict hides (``0.weight`` for the parameter ``0.fused.weight``), with a
    #: method named ``fqn_modifiers`` that says so; get/set_*_state_dict are told that name
    #: (``StateDictOptions.dsd_fqn_modifiers``) where it is not torch's default.
    fused: tuple[str, ...] = ()
    fqn_modifiers: str = DEFAULT_FQN_MODIFIERS

    def __post_init__(self) -> None:
        # a meta-device target's full load assigns (fuzz._rank.state_dict's _put)
        assigns = self.load.full_state_dict
        check_common(
            self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init, assigns
        )
        self._check_fused()
        check_drop(self.drop)
        check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        save, load = self.save, self.load
        if self.requires_grad and save.ignore_frozen_params:
            # Which parameters are frozen when the state is taken depends on the schedule:
            # not drawn together yet.
            raise CaseError("save.ignore_frozen_params", "not drawn with a requires_grad schedule")
        if save.broadcast_from_rank0 or not save.strict:
            raise CaseError("save", "broadcast_from_rank0 and strict apply to loading (set_*) only")
        self._check_frozen_and_flat()
        if self.api is Api.FSDP1:
            if not (is_fsdp1(self.source) and is_fsdp1(self.target)):
                # FSDP.set_state_dict_type and FSDP.optim_state_dict work on FSDP1 models only.
                raise CaseError("target.wrapper", "fsdp1_optim_state_dict: from an FSDP1 model to an FSDP1 model")
            self._check_fsdp1()
            return
        # get/set_*_state_dict take FSDP1 models too (under FSDP.state_dict_type, as torch's
        # own e2e test_e2e_save_and_load does), so split and combined move state between FSDP1
        # and the other APIs.
        # A full state dict holds plain tensors, a sharded one what the model holds (DTensors
        # under fully_shard): set_* must be told which it gets, and in memory a DTensor only
        # goes into a DTensor on the same mesh (resharding across meshes or kinds is what DCP
        # or a full state dict is for; set_model_state_dict refuses it).
        if load.full_state_dict != save.full_state_dict:
            raise CaseError("load.full_state_dict", "must equal save.full_state_dict: both describe the same dict")
        if not save.full_state_dict:
            problem = sharded_in_memory_problem(self.source, self.target)
            if problem:
                field_ = "target.mesh" if "mesh" in problem else "save.full_state_dict"
                raise CaseError(field_, problem)
        if load.broadcast_from_rank0 and not load.full_state_dict:
            raise CaseError("load.broadcast_from_rank0", "needs full_state_dict (documented in StateDictOptions)")
        if save.full_state_dict and save.cpu_offload and not load.broadcast_from_rank0:
            raise CaseError(
                "load.broadcast_from_rank0",
                "full_state_dict with cpu_offload leaves the state on rank 0 only: load it with broadcast_from_rank0",
            )
        if self.api is Api.MODULE and (
            save.full_state_dict
            or tensor_kind(self.source) != "dtensor"
            or tensor_kind(self.target) != "dtensor"
            # an FSDP1 model's own state_dict is FSDP1's state_dict_type (Api.FSDP1)
            or is_fsdp1(self.source)
            or is_fsdp1(self.target)
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

    def _check_fused(self) -> None:
        if self.fqn_modifiers not in (DEFAULT_FQN_MODIFIERS, CUSTOM_FQN_MODIFIERS):
            names = [DEFAULT_FQN_MODIFIERS, CUSTOM_FQN_MODIFIERS]
            raise CaseError("fqn_modifiers", f"{self.fqn_modifiers!r} is not one of {names}")
        if not self.fused:
            if self.fqn_modifiers != DEFAULT_FQN_MODIFIERS:
                raise CaseError("fqn_modifiers", "names the fused leaves' method: needs fused leaves")
            return
        if self.api is Api.FSDP1:
            raise CaseError("fused", "FSDP1's own state dict API takes no StateDictOptions")
        problem = fused_problem(self.tree, self.fused, (self.source, self.target))
        if problem:
            raise CaseError(*problem)

    def _check_frozen_and_flat(self) -> None:
        """ignore_frozen_params and flatten_optimizer_state_dict."""
        save, load = self.save, self.load
        if load.ignore_frozen_params:
            raise CaseError("load.ignore_frozen_params", "is documented for the state dict get_* returns only")
        if save.ignore_frozen_params:
            if self.api not in (Api.SPLIT, Api.COMBINED):
                raise CaseError("save.ignore_frozen_params", "is a get_model_state_dict / get_state_dict option")
            if any(getattr(n, "frozen", False) for n in self.tree.paths().values()):
                # The state dict lacks the frozen parameters, which keep their fresh values.
                if load.strict:
                    raise CaseError("load.strict", "a state dict without the frozen parameters loads non-strict")
                if self.target_meta_init:
                    raise CaseError("target_meta_init", "a meta-device target has no values for frozen parameters")
        if save.flatten_optimizer_state_dict != load.flatten_optimizer_state_dict:
            raise CaseError("load.flatten_optimizer_state_dict", "must equal save's: both describe the same dict")
        if save.flatten_optimizer_state_dict:
            if self.api is Api.FSDP1:
                raise CaseError("save.flatten_optimizer_state_dict", "is a get/set_*_state_dict option")
            if self.empty_group:
                # The flat dict keys hyperparameters by parameter (param_groups.<fqn>.lr): a
                # group without parameters has no place in it.
                raise CaseError(
                    "empty_group", "a flattened optimizer state dict has no place for a group without params"
                )

    def _check_fsdp1(self) -> None:
        save, load = self.save, self.load
        if load.full_state_dict != save.full_state_dict:
            raise CaseError("load.full_state_dict", "must equal save.full_state_dict: both describe the same dict")
        if load.cpu_offload or not load.strict:
            # FSDP1's configs apply to taking the state; its load_state_dict is strict here.
            raise CaseError("load", "FSDP1's own load takes no StateDictOptions: cpu_offload, non-strict")
        if load.broadcast_from_rank0 and not load.full_state_dict:
            raise CaseError("load.broadcast_from_rank0", "rank0_only is a FULL_STATE_DICT config")
        if self.drop:
            raise CaseError("drop", "FSDP1's own load is strict here: no keys are left out")
        if not save.full_state_dict:
            problem = fsdp1_in_memory_problem(self.source, self.target)
            if problem:
                raise CaseError("save.full_state_dict", problem)

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size, self.training.steps + self.steps_after

    def validate_for(self, world_size: int) -> None:
        for where, comp in (("source", self.source), ("target", self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)


class Overwrite(str, enum.Enum):
    """Whether a round trip saves over an earlier checkpoint in its directory (:class:`DcpBody`)."""

    NONE = "none"  # an empty directory
    TRUE = "true"  # FileSystemWriter(path, overwrite=True) saves over it; the load gets the new state
    #: FileSystemWriter(path, overwrite=False) refuses: CheckpointException "Checkpoint already
    #: exists" on every rank, the earlier checkpoint untouched; the case then clears the
    #: directory and saves again with overwrite=False.
    FALSE = "false"


class DcpItem(str, enum.Enum):
    """A top-level entry of the dict given to ``dcp.save`` / ``dcp.load``; its key is the value."""

    #: get_model_state_dict(model), or the module itself (DcpBody.module_stateful, or
    #: DcpBody.patched: its state_dict / load_state_dict patched to get/set_model_state_dict)
    MODEL = "model"
    #: get_optimizer_state_dict(model, optimizer), or the optimizer itself (DcpBody.patched)
    OPTIMIZER = "optimizer"
    APP = "app"  # a Stateful wrapping both: get_state_dict / set_state_dict
    SCALARS = "scalars"  # a Stateful holding Python scalars (int, float, str, bool, list)
    COUNTER = "counter"  # a Stateful whose state_dict and load_state_dict all_reduce on every rank
    EXTRA = "extra"  # a plain tensor, the same on every rank


@dataclass(frozen=True)
class WriterOptions:
    """``FileSystemWriter``'s I/O options (torch's defaults: what a writer without them does)."""

    single_file_per_rank: bool = True
    sync_files: bool = True
    thread_count: int = 1
    per_thread_copy_ahead: int = 10_000_000

    def __post_init__(self) -> None:
        if not 1 <= self.thread_count <= 4:
            raise CaseError("writer.thread_count", f"thread_count={self.thread_count} is outside 1..4")
        if self.per_thread_copy_ahead < 0:
            raise CaseError("writer.per_thread_copy_ahead", "is a number of bytes: must be >= 0")

    def changed(self) -> dict[str, object]:
        """The options that differ from torch's defaults (what the writer is given)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


@dataclass(frozen=True)
class SavePlannerOptions:
    """A ``DefaultSavePlanner(...)`` passed to ``dcp.save`` / ``async_save`` as ``planner``."""

    flatten_sharded_tensors: bool = True
    #: each replicated item is written by the lowest rank that holds it (else: the rank with
    #: the least planned storage so far)
    dedup_save_to_lowest_rank: bool = False
    enable_plan_caching: bool = False


@dataclass(frozen=True)
class LoadPlannerOptions:
    """A ``DefaultLoadPlanner(...)`` passed to ``dcp.load`` as ``planner``."""

    flatten_sharded_tensors: bool = True
    #: "If False, will raise a runtime error if a key is present in state_dict, but not in the checkpoint"
    allow_partial_load: bool = False


@dataclass(frozen=True)
class StagerOptions:
    """``DefaultStager(StagingOptions(...))`` passed to ``dcp.async_save`` as ``async_stager``
    (closed after the case's last save, as async_save documents for a stager the caller
    provides). The defaults here are what async_save's own stager uses (all off), not
    StagingOptions' (all on): ``use_pinned_memory`` and ``use_non_blocking_copy`` need an
    accelerator (without one torch ignores the first with a warning and refuses the second),
    so the strategies draw them only for one."""

    use_pinned_memory: bool = False
    use_shared_memory: bool = False
    use_async_staging: bool = False
    use_non_blocking_copy: bool = False

    def features(self) -> list[str]:
        """``async_stager`` and ``async_stager:<option>`` for each option that is on."""
        names = ("pinned_memory", "shared_memory", "async_staging", "non_blocking_copy")
        return ["async_stager"] + [f"async_stager:{n}" for n in names if getattr(self, f"use_{n}")]


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

    ``patched``: the model and optimizer entries are the model and optimizer objects
    themselves, after ``_patch_model_state_dict(model)`` and ``_patch_optimizer_state_dict(model,
    optimizers=optimizer)`` (with the save options on the source, the load options on the
    target), so that their ``state_dict`` / ``load_state_dict``, which DCP calls, go through
    get/set_model_state_dict and get/set_optimizer_state_dict (as torch's own e2e
    test_e2e_save_and_load does, FSDP1 included).

    An FSDP1 side moves its state through the distributed state-dict functions (the app
    entry, or ``patched``), to and from any layout (DCP reshards), or takes the classic
    recipe, between FSDP1 models: ``model.state_dict()`` and ``FSDP.optim_state_dict`` under
    SHARDED_STATE_DICT saved, the model loaded in place into its own state dict, the optimizer
    through ``load_sharded_optimizer_state_dict`` and ``FSDP.optim_state_dict_to_load``.

    ``overwrite``: save over an earlier checkpoint (of a freshly built model) in the same
    directory, through ``FileSystemWriter(path, overwrite=...)``. ``async_saves`` (with
    ``async_save``): that many async saves a training step apart, the source training on
    before each save's future completes (the last one's: its ``steps_after`` steps), over a
    process group of their own; ``cache_staged`` reuses one
    ``FileSystemWriter(cache_staged_state_dict=True)`` for all of them. ``no_dist``: every rank
    saves and loads its own checkpoint (``no_dist=True``, its own directory) of a plain model.
    ``frozen_in_optimizer`` and ``empty_group`` as in :class:`StateDictBody`.
    """

    KIND: ClassVar[str] = "dcp"
    PROGRAM: ClassVar[str] = "fuzz._rank.dcp:run_dcp"
    tree: ModuleTree
    source: Composition
    target: Composition
    entries: tuple[DcpItem, ...]
    training: Training = field(default_factory=Training)
    steps_after: int = 1
    orders: tuple[tuple[int, ...], ...] = ()
    skip: tuple[DcpItem, ...] = ()
    drop: tuple[int, ...] = ()
    save_full_state_dict: bool = False
    save_cpu_offload: bool = False
    load_full_state_dict: bool = False
    load_cpu_offload: bool = False
    module_stateful: bool = False
    #: The model and optimizer objects themselves, their state dicts patched to the
    #: distributed state-dict functions (torch's _patch_model_state_dict /
    #: _patch_optimizer_state_dict).
    patched: bool = False
    async_save: bool = False
    #: FileSystemWriter / FileSystemReader objects instead of checkpoint_id=path.
    storage_objects: bool = False
    target_meta_init: bool = False
    mode: DcpMode = DcpMode.ROUND_TRIP
    checkpoint_dir: str = ""
    deadlock: bool = False
    overwrite: Overwrite = Overwrite.NONE
    async_saves: int = 0
    cache_staged: bool = False
    no_dist: bool = False
    frozen_in_optimizer: bool = False
    empty_group: bool = False
    #: FileSystemWriter's I/O options (with storage_objects): the round trip must be exact.
    writer: WriterOptions = field(default_factory=WriterOptions)
    #: A DefaultSavePlanner(...) as dcp.save / async_save's planner (None: DCP's own default).
    save_planner: SavePlannerOptions | None = None
    #: A DefaultLoadPlanner(...) as dcp.load's planner (None: DCP's own default).
    load_planner: LoadPlannerOptions | None = None
    #: The load's dict holds one more tensor, ``absent``, that the checkpoint lacks: with
    #: load_planner.allow_partial_load the load succeeds and leaves it untouched; without it
    #: every rank must get DCP's "Missing key in checkpoint state_dict: absent" (then the case
    #: loads again without it).
    absent: bool = False
    #: After the save, format_utils.dcp_to_torch_save (rank 0) turns the checkpoint into a
    #: torch.save file, which must hold the full state; torch_save_to_dcp turns that back into
    #: a DCP checkpoint, which the target loads.
    convert: bool = False
    #: dcp.save / async_save / load with process_group=, a gloo group of the rank's own
    #: (dist.new_group), instead of the default group.
    own_group: bool = False
    #: Leaves frozen and unfrozen between steps (:class:`RequiresGrad`).
    requires_grad: tuple[RequiresGrad, ...] = ()
    #: An explicit ``DefaultStager(StagingOptions(...))`` as async_save's ``async_stager`` (None:
    #: the writer's staging with storage_objects, else async_save's own DefaultStager).
    stager: StagerOptions | None = None
    #: ``async_checkpointer_type=AsyncCheckpointerType.PROCESS``: the saves run in a
    #: checkpointing process of each rank's own (with a gloo group of those processes), ended
    #: after the case.
    process_checkpointer: bool = False
    #: False: dcp.save / async_save(use_collectives=False): each rank plans and writes alone
    #: and keeps its own metadata (``__<rank>.metadata``); dcp.load, finding no global
    #: ``.metadata``, falls back to each rank's own and loads without collectives.
    use_collectives: bool = True
    #: Instead of a DCP save, rank 0 torch.save's the model's full state dict (and the extra
    #: tensor) to a file, which every rank loads with dcp.load(storage_reader=
    #: format_utils.BroadcastingTorchSaveReader(), planner=DynamicMetaLoadPlanner(),
    #: checkpoint_id=file): "read the entire checkpoint on the coordinator rank, and then
    #: broadcast and shard each tensor to all ranks" (tensors only).
    torch_save_reader: bool = False

    def reloads_elsewhere(self) -> bool:
        """Whether the case's checkpoint is also loaded where it was not saved (DCP reshards at
        load time): into a plain model on one process, and at four ranks or more into a
        fully_shard model on half of them. Its model entry comes from get_model_state_dict
        (plain FQNs), every rank wrote one checkpoint together (not no_dist, use_collectives,
        not a torch.save file), and no parameter is rank-local (``Layout.local``: each rank's
        own value, of which the checkpoint keeps one)."""
        from fuzz.model.layout import Layout

        return (
            self.mode is DcpMode.ROUND_TRIP
            and DcpItem.MODEL in self.entries
            and not (self.module_stateful or self.patched or self.classic_fsdp1)
            and not (self.no_dist or self.torch_save_reader or not self.use_collectives)
            and not Layout(self.tree, self.source).local()
        )

    def reloads_in_half_world(self, world_size: int) -> bool:
        """Whether each half of ``world_size`` ranks also loads the checkpoint, sharded over
        its own ranks (:meth:`reloads_elsewhere`; an even world of four ranks or more)."""
        # The half-world reload shards every parameter leaf and the root: not a tree whose
        # tied pair would then span two units, nor one with a scalar parameter, which
        # fully_shard refuses (fuzz.model.rules: _check_tied, scalar_problem).
        return (
            self.reloads_elsewhere()
            and world_size >= 4
            and world_size % 2 == 0
            and self.tree.tied is None
            and not any(isinstance(n, Block) and n.gain for n in self.tree.paths().values())
        )

    def __post_init__(self) -> None:
        check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        check_drop(self.drop)
        check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        self._check_options()
        self._check_async_options()
        if not self.use_collectives:
            self._check_rank_local()
        if self.torch_save_reader:
            self._check_torch_save_reader()
        entries = self.entries
        if not entries or len(set(entries)) != len(entries):
            raise CaseError("entries", f"{[e.value for e in entries]} must be non-empty and name each entry once")
        if DcpItem.APP in entries and (DcpItem.MODEL in entries or DcpItem.OPTIMIZER in entries):
            raise CaseError("entries", "app holds the model and the optimizer: use it instead of model / optimizer")
        for i, e in enumerate(self.skip):
            if e not in entries:
                raise CaseError(f"skip[{i}]", f"{e.value!r} is not among the entries saved")
        if len(set(self.skip)) != len(self.skip) or len(self.skip) >= len(entries):
            raise CaseError("skip", "must name each entry once and leave at least one entry to load")
        if self.module_stateful:
            if DcpItem.MODEL not in entries:
                raise CaseError("module_stateful", "applies to the model entry, which is not saved")
            if self.save_full_state_dict or self.load_full_state_dict:
                raise CaseError("module_stateful", "a module's own state_dict has no full_state_dict option")
            if Wrapper.DDP in (self.source.wrapper, self.target.wrapper):
                # DDP's own keys carry a "module." prefix; get_model_state_dict strips it.
                raise CaseError("module_stateful", "DDP's own state_dict keys differ from the plain model's")
        if self.patched:
            if DcpItem.MODEL not in entries and DcpItem.OPTIMIZER not in entries:
                raise CaseError("patched", "applies to the model and optimizer entries, neither of which is saved")
            if self.module_stateful:
                raise CaseError("patched", "the module is its own Stateful either with its own or a patched state_dict")
        if self.drop and (
            DcpItem.MODEL not in entries or DcpItem.MODEL in self.skip or self.module_stateful or self.patched
        ):
            raise CaseError("drop", "leaving model keys out needs the model entry loaded as a state dict")
        if self.target_meta_init and not any(e in entries and e not in self.skip for e in (DcpItem.MODEL, DcpItem.APP)):
            raise CaseError("target_meta_init", "a meta-device target must load its model")
        if self.drop and self.target_meta_init:
            raise CaseError("drop", "a meta-device target has no values for the keys left out of the load")
        if (self.mode is DcpMode.ROUND_TRIP) == bool(self.checkpoint_dir):
            raise CaseError("checkpoint_dir", "is required by save-only / load-only and refused by round trips")
        if self.deadlock and DcpItem.COUNTER not in entries:
            raise CaseError("deadlock", "the deadlock is issued by the counter entry, which is not saved")
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            self._check_fsdp1()
        self._check_saves()
        if self.no_dist:
            self._check_no_dist()

    @property
    def classic_fsdp1(self) -> bool:
        """Whether an FSDP1 side takes the classic recipe (FSDP1's own state dicts): not
        through the app entry nor patched state dicts."""
        return (is_fsdp1(self.source) or is_fsdp1(self.target)) and not self.patched and DcpItem.APP not in self.entries

    def _check_fsdp1(self) -> None:
        if self.module_stateful:
            # module_stateful is FSDP2's own model.state_dict(); an FSDP1 model's own is its
            # state_dict_type's, which the classic recipe takes.
            raise CaseError("module_stateful", "an FSDP1 model's own state_dict is the classic recipe's")
        if not self.classic_fsdp1:
            # get/set_*_state_dict take FSDP1 models (torch's e2e test_e2e_save_and_load saves
            # and loads them through DCP this way), so the state goes to and from any layout.
            return
        if not (is_fsdp1(self.source) and is_fsdp1(self.target)):
            # FSDP1's own state dicts on both ends: FSDP.optim_state_dict_to_load and
            # load_sharded_optimizer_state_dict take an FSDP1 model. Between FSDP1 and the
            # other APIs the state goes through the app entry or patched state dicts.
            raise CaseError(
                "target.wrapper",
                "the classic FSDP1 recipe goes from an FSDP1 model to an FSDP1 model: use app or patched",
            )
        if self.save_full_state_dict or self.load_full_state_dict:
            # A fresh optimizer's FSDP.optim_state_dict is empty: nothing to load a full one into.
            raise CaseError("save_full_state_dict", "the classic FSDP1 recipe through DCP takes SHARDED_STATE_DICT")
        if self.drop:
            raise CaseError("drop", "FSDP1's own load is strict here: no keys are left out")

    def _check_saves(self) -> None:
        """overwrite, async_saves, cache_staged."""
        round_trip = self.mode is DcpMode.ROUND_TRIP
        if self.overwrite is not Overwrite.NONE:
            if not self.storage_objects:
                raise CaseError("overwrite", "is a FileSystemWriter option: needs storage_objects")
            if not round_trip or self.async_saves or self.deadlock:
                raise CaseError("overwrite", "applies to a round trip's single save")
        if not 0 <= self.async_saves <= 3:
            raise CaseError("async_saves", f"async_saves={self.async_saves} is outside 0..3")
        if self.async_saves:
            if not self.async_save:
                raise CaseError("async_saves", "counts async saves: needs async_save")
            if not round_trip or self.deadlock:
                raise CaseError("async_saves", "applies to round trips")
            if self.async_saves > self.training.steps:
                # One training step after each earlier save, before its future completes.
                raise CaseError("async_saves", f"{self.async_saves} saves a step apart need training.steps >= that")
            if self.steps_after < 1:
                raise CaseError(
                    "async_saves", "the source trains on while the last save is in flight: steps_after >= 1"
                )
        if self.cache_staged:
            if self.async_saves < 2:
                raise CaseError("cache_staged", "the staging cache is reused by several async saves: async_saves >= 2")
            if not self.storage_objects:
                raise CaseError("cache_staged", "is a FileSystemWriter option: needs storage_objects")

    def _check_options(self) -> None:
        """writer, save_planner, load_planner, absent, convert, own_group."""
        if self.writer != WriterOptions() and not self.storage_objects:
            raise CaseError("writer", "is FileSystemWriter's: needs storage_objects")
        if self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank and self.no_dist:
            raise CaseError(
                "save_planner.dedup_save_to_lowest_rank", "dedups items across the ranks of one save: not with no_dist"
            )
        if self.own_group and (self.no_dist or self.mode is not DcpMode.ROUND_TRIP):
            raise CaseError("own_group", "a process group of its own for a collective round trip")
        fsdp1 = is_fsdp1(self.source) or is_fsdp1(self.target)
        for name in ("absent", "convert"):
            if not getattr(self, name):
                continue
            if self.mode is not DcpMode.ROUND_TRIP or self.no_dist or self.deadlock:
                raise CaseError(name, "applies to a collective round trip")
            if fsdp1:
                # absent: a key missing from the checkpoint is what sends DefaultLoadPlanner
                # down the re-flattening path of a known FSDP1 bug (fsdp1_dcp_empty_shard);
                # convert: FSDP1's own optimizer state is not observed in full.
                raise CaseError(name, "is drawn for fully_shard / replicate / DDP / plain models, no FSDP1 side")

    def _check_async_options(self) -> None:
        """stager, process_checkpointer."""
        for name in ("stager", "process_checkpointer"):
            if getattr(self, name) in (None, False):
                continue
            if not self.async_save:
                raise CaseError(name, "is an async_save option: needs async_save")
            if self.cache_staged:
                # the writer's staging cache is the writer's own stager; an explicit stager replaces it
                raise CaseError(name, "not with cache_staged (the writer's own staging)")
        if self.process_checkpointer and (self.no_dist or self.deadlock):
            # The checkpointing processes form a process group of their own over every rank.
            raise CaseError("process_checkpointer", "runs the saves of every rank in a group of processes: not no_dist")
        if self.process_checkpointer and self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank:
            # the save's local plan, which the dedup check records, is made in the checkpointing process
            raise CaseError("process_checkpointer", "the dedup check records the plan in the rank: not with dedup")

    def _check_rank_local(self) -> None:
        """use_collectives=False: each rank writes its own metadata, and dcp.load then reads on
        each rank only what that rank saved. So every rank's own checkpoint must hold what
        that rank loads: every tensor in full (a plain source's state dict, or a full one not
        offloaded to rank 0), or, sharded, the same layout on both sides. Across layouts
        dcp.load loads the overlap with the rank's own shards and leaves the rest of each
        tensor as it was, without an error (a torch bug, docs/state_dict.md,
        "use_collectives=False"): not drawn."""
        if self.mode is not DcpMode.ROUND_TRIP or self.no_dist or self.deadlock:
            raise CaseError("use_collectives", "False is drawn for collective round trips")
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            # the classic recipe's load_sharded_optimizer_state_dict reads the global .metadata
            raise CaseError("use_collectives", "False is drawn for fully_shard / replicate / DDP / plain models")
        for name in ("overwrite", "absent", "convert"):
            if getattr(self, name) not in (False, Overwrite.NONE):
                # overwrite: checked against rank 0's metadata; absent: the planner's refusal is
                # raised without collectives (no CheckpointException); convert and dedup read
                # the global metadata.
                raise CaseError(name, "reads or refuses through the global metadata: not with use_collectives=False")
        if self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank:
            raise CaseError("save_planner.dedup_save_to_lowest_rank", "dedups across ranks: needs use_collectives")
        if self.save_full_state_dict and self.save_cpu_offload:
            raise CaseError(
                "save_cpu_offload", "a full state dict offloaded is on rank 0 only: other ranks save nothing"
            )
        full_everywhere = self.save_full_state_dict or tensor_kind(self.source) == "plain"
        if not full_everywhere and (self.source != self.target or self.load_full_state_dict):
            raise CaseError(
                "target",
                "a sharded save without collectives loads into the same layout only (each rank reads its own)",
            )

    def _check_torch_save_reader(self) -> None:
        """torch_save_reader: "Current implementation only supports loading Tensors", so the
        checkpoint is the model (and the extra tensor); the file holds the full state dict,
        saved by rank 0. The dict loaded holds plain tensors on every rank (a full state dict
        not offloaded, or a model whose own tensors are plain): into DTensors (fully_shard) the
        reader's broadcasts hang (a torch bug, docs/state_dict.md), and a rank that loads
        nothing (full, offloaded) skips the broadcasts the others issue."""
        if set(self.entries) - {DcpItem.MODEL, DcpItem.EXTRA} or DcpItem.MODEL not in self.entries:
            raise CaseError("entries", "BroadcastingTorchSaveReader loads tensors only: the model and extra")
        if not self.save_full_state_dict:
            raise CaseError("save_full_state_dict", "the torch.save file holds the full state dict")
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            raise CaseError("torch_save_reader", "is drawn for fully_shard / replicate / DDP / plain models")
        plain = (self.load_full_state_dict and not self.load_cpu_offload) or (
            not self.load_full_state_dict and tensor_kind(self.target) == "plain"
        )
        if not plain:
            raise CaseError("load_full_state_dict", "the reader broadcasts into plain tensors on every rank")
        changed = [
            name
            for name, on in (
                ("async_save", self.async_save),
                ("storage_objects", self.storage_objects),
                ("no_dist", self.no_dist),
                ("convert", self.convert),
                ("absent", self.absent),
                ("own_group", self.own_group),
                ("deadlock", self.deadlock),
                ("save_planner", self.save_planner is not None),
                ("load_planner", self.load_planner is not None),
                ("use_collectives", not self.use_collectives),
                ("mode", self.mode is not DcpMode.ROUND_TRIP),
            )
            if on
        ]
        if changed:
            raise CaseError(changed[0], "the torch.save round trip takes no DCP save or load option")

    def _check_no_dist(self) -> None:
        if not (is_plain(self.source) and is_plain(self.target)):
            raise CaseError("no_dist", "saves without collectives: a plain model on both sides, the same on every rank")
        if DcpItem.COUNTER in self.entries:
            raise CaseError("no_dist", "the counter all-reduces: no_dist saves and loads run without collectives")
        if self.save_full_state_dict or self.load_full_state_dict or self.save_cpu_offload or self.load_cpu_offload:
            raise CaseError("no_dist", "a plain model's own state dict: no full_state_dict or cpu_offload")
        if self.async_saves or self.overwrite is not Overwrite.NONE or self.mode is not DcpMode.ROUND_TRIP:
            # One save (dcp.save or async_save) and one load per round trip, each rank in its own
            # directory (saves in flight write where the others do).
            raise CaseError("no_dist", "takes one save and a load in a round trip, each rank its own directory")

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size + len(self.entries), self.training.steps + self.steps_after

    def collective_entries(self) -> list[DcpItem]:
        """Entries whose ``state_dict`` runs collectives when dcp.save calls it: the counter;
        app, and the patched model and optimizer, with full state dicts (get_*_state_dict
        gather) or an FSDP1 source (its ShardedTensors gather their metadata when made, and
        FSDP.optim_state_dict exchanges parameter keys with all_gather_object)."""
        out: list[DcpItem] = [e for e in self.entries if e is DcpItem.COUNTER]
        gathers = self.save_full_state_dict or is_fsdp1(self.source)
        if DcpItem.APP in self.entries and gathers:
            out.append(DcpItem.APP)
        if self.patched and gathers:
            out += [e for e in self.entries if e in (DcpItem.MODEL, DcpItem.OPTIMIZER)]
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
                "per-rank orders allow at most one entry whose state_dict runs collectives (see collective_entries)",
            )
