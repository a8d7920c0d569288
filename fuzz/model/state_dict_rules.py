"""The validity rules of the state-dict and DCP bodies (:mod:`fuzz.model.state_dict`), beside what they
read of a side: which kind of model a composition builds (:func:`is_plain`, :func:`is_fsdp1`,
:func:`tensor_kind`), which moves of a state dict the API supports (:func:`sharded_in_memory_problem`),
which requires_grad schedules the bodies take (:func:`schedule_problem`), and the checks both
bodies share (:func:`check_common`). As :mod:`fuzz.model.rules` is for the training bodies, each
rule keeps out what the documented API does not support, with its reason, so that a failing case
is a finding and not a misuse; a rule raises :class:`~fuzz.errors.CaseError` (``check_*``) or
returns the problem as (field, reason) or a reason (``*_problem``).

Imports only the standard library and the model's other modules (not the bodies).
"""

from __future__ import annotations

from dataclasses import dataclass

from fuzz.errors import CaseError
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.rules import check_composition
from fuzz.model.training import MAX_STEPS, Training
from fuzz.model.tree import Block, Leaf, ModuleTree, has_params


def is_plain(comp: Composition) -> bool:
    """No fully_shard, replicate or wrapper (activation checkpointing may still be applied)."""
    return not comp.shards and not comp.replicates and comp.wrapper is Wrapper.NONE


def is_fsdp1(comp: Composition) -> bool:
    return comp.wrapper.value.startswith("fsdp1")


def fsdp1_gathers(comp: Composition, world_size: int) -> bool:
    """Whether FSDP1 shards ``comp``'s parameters over more than one rank (a full state dict
    then gathers them)."""
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        return comp.mesh[1] > 1
    return comp.wrapper in (Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP) and world_size > 1


#: The method name torch's distributed state-dict API looks for on a module to learn which
#: state-dict key atoms stand for a child the module's state-dict hooks hide
#: (``StateDictOptions.dsd_fqn_modifiers``' default).
DEFAULT_FQN_MODIFIERS = "_fqn_modifiers"
#: The other name the cases give that method, passed as ``StateDictOptions(dsd_fqn_modifiers=...)``.
CUSTOM_FQN_MODIFIERS = "hidden_children"


def fused_problem(tree: ModuleTree, fused: tuple[str, ...], comps: tuple[Composition, ...]) -> tuple[str, str] | None:
    """What is wrong with building the leaves at ``fused`` as fused modules (a leaf held under a
    child that the module's state dict hides, ``fuzz._rank.models.FusedLeaf``) for models
    composed as ``comps``, as (field, problem), or None."""
    paths = tree.paths()
    if list(fused) != sorted(set(fused)):
        return "fused", f"paths {list(fused)} must be distinct and sorted"
    for path in fused:
        node = paths.get(path)
        if not isinstance(node, Leaf) or not has_params(node):
            return "fused", f"{path!r} is not a parameter leaf of the tree"
    for comp in comps:
        if is_fsdp1(comp):
            # FSDP1 names its flat parameters' members itself (FlatParameter._fqns): not drawn yet.
            return "fused", "not drawn with FSDP1"
        if comp.tp:
            return "fused", "tensor parallelism's plans name the leaves' own parameters"
        if comp.shard_ignored & set(fused) or (comp.replicate_options.delay_all_reduce and fused):
            # ignored_params and the delayed all-reduce take a leaf's own parameters
            return "fused", "ignored_params and the delayed all-reduce take a leaf's own parameters"
    return None


def tensor_kind(comp: Composition) -> str:
    """What a sharded (not full) state dict of the model holds: ``dtensor`` (fully_shard
    only, FSDP1 HYBRID_SHARD with its mesh), ``spmd`` (fully_shard of an SPMD program: its
    buffers are DTensors too, replicated on the mesh), ``plain`` (plain model, DDP, replicate
    only, FSDP1 NO_SHARD), ``sharded_tensor`` (FSDP1 FULL_SHARD / SHARD_GRAD_OP), or ``mixed``."""
    if comp.spmd:
        return "spmd"
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        # A shard dimension of size 1 falls back to NO_SHARD (pytorch/pytorch#154888).
        return "plain" if comp.mesh[1] == 1 else "dtensor"
    if comp.wrapper in (Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP):
        return "sharded_tensor"
    if comp.wrapper is not Wrapper.NONE:
        return "plain"  # DDP, FSDP1 NO_SHARD
    if not comp.shards:
        return "plain"
    return "mixed" if comp.replicates else "dtensor"


def check_side(comp: Composition, tree: ModuleTree, where: str) -> None:
    if is_plain(comp):
        if comp.mesh:
            raise CaseError(f"{where}.mesh", "a plain model (no fully_shard) has no mesh")
        for i, path in enumerate(comp.checkpoints):
            if path not in tree.paths():
                raise CaseError(f"{where}.checkpoints[{i}]", f"{path!r} names no module of the tree")
        return
    check_composition(tree, comp, where)


def check_common(
    tree: ModuleTree,
    source: Composition,
    target: Composition,
    training: Training,
    steps_after: int,
    meta: bool,
    assigns: bool = False,
) -> None:
    """The rules both bodies share; ``assigns``: a meta-device target's load assigns the
    state dict's tensors (a full state dict, ``meta_target_problem``)."""
    if not has_params(tree.root):
        raise CaseError("tree", "the tree has no parameters")
    check_side(source, tree, "source")
    check_side(target, tree, "target")
    if (is_fsdp1(source) or is_fsdp1(target)) and steps_after < 1:
        # FSDP1 keeps optimizer state as flat local shards: reading it in full would take the
        # very API under test (FSDP.optim_state_dict, which get_optimizer_state_dict calls for
        # FSDP1 models), so what an FSDP1 side saved or loaded is judged by resuming.
        raise CaseError("steps_after", "FSDP1 optimizer state is judged by resuming: steps_after must be >= 1")
    if not 0 <= steps_after <= MAX_STEPS:
        raise CaseError("steps_after", f"steps_after={steps_after} is outside 0..{MAX_STEPS}")
    if training.grad_accum != 1:
        raise CaseError("training.grad_accum", "state-dict cases train one microbatch per step")
    problem = meta_target_problem(tree, target, assigns=assigns) if meta else None
    if problem is not None:
        raise CaseError("target_meta_init", problem)
    for s in (*source.shards, *target.shards):
        if s.mixed_precision is not None or s.offload:
            raise CaseError("source.shards", "mixed precision and CPU offload are covered by the training properties")


def meta_target_problem(tree: ModuleTree, target: Composition, *, assigns: bool = False) -> str | None:
    """Why ``target`` cannot be built on the meta device and loaded into, or None; ``assigns``:
    the load assigns a full state dict's tensors (set_model_state_dict into a meta model).

    Non-persistent buffers are out of every state dict: after the load a meta-device target
    holds them on the meta device (an assigning full load) or uninitialised (``to_empty``),
    and the program sets them as the model's initialisation would, as a user does after
    materialising a meta-device model."""
    if target.spmd:
        return "an SPMD composition is not built on the meta device yet"
    if target.replicates or target.wrapper is not Wrapper.NONE:
        # DDP (and replicate) broadcast parameter values when applied: there are none on meta.
        # FSDP1 materializes a meta module when it wraps it (reset_parameters or its
        # param_init_fn), so its target would not be on meta when the state is loaded.
        return "a meta-device target takes fully_shard or nothing, not DDP/replicate/FSDP1"
    if tree.tied is not None and (assigns or not target.shards):
        # nn.Module.to_empty on a plain model and load_state_dict(assign=True) (a full load
        # into a meta model, also under fully_shard) give each module of a tied pair a
        # Parameter of its own (torch 2.13: _apply makes a new Parameter per module when the
        # device changes; assign sets each key's tensor): the head is untied, and re-tying
        # after materialising is the user's job (as transformers' tie_weights does), which a
        # state-dict load does not do. fully_shard's to_empty keeps the pair (its parameters
        # are managed by the unit), so a sharded or DCP load (in place) into it is drawn.
        return "a meta-device model unties its tied head when materialised or assigned"
    return None


def check_drop(drop: tuple[int, ...]) -> None:
    if any(i < 0 for i in drop) or len(set(drop)) != len(drop):
        raise CaseError("drop", f"{list(drop)} must be distinct non-negative positions")


def check_frozen_in_optimizer(tree: ModuleTree, frozen_in_optimizer: bool) -> None:
    if frozen_in_optimizer and not any(getattr(n, "frozen", False) for n in tree.paths().values()):
        raise CaseError("frozen_in_optimizer", "the tree has no frozen parameter to hand to the optimizer")


def fsdp1_in_memory_problem(source: Composition, target: Composition) -> str | None:
    """Why a sharded FSDP1 state dict cannot move in memory from source to target, or None.
    FULL_SHARD and SHARD_GRAD_OP hold ShardedTensors over all ranks, NO_SHARD plain tensors,
    HYBRID_SHARD DTensors on its mesh; FSDP1's load hooks take only their own kind ("Expected
    ShardedTensor, got DTensor"): resharding is what full state dicts and DCP are for."""
    kinds = (tensor_kind(source), tensor_kind(target))
    if kinds[0] != kinds[1]:
        return f"a sharded FSDP1 state dict cannot go from {kinds[0]} to {kinds[1]} in memory"
    if kinds[0] == "dtensor" and source.mesh != target.mesh:
        return "a sharded FSDP1 HYBRID_SHARD state dict in memory needs the same mesh on both sides"
    return None


def sharded_in_memory_problem(source: Composition, target: Composition) -> str | None:
    """Why a sharded state dict taken with get_*_state_dict cannot go into ``target`` in
    memory, or None. It holds what the model holds: DTensors (fully_shard; FSDP1
    HYBRID_SHARD), plain tensors (plain model, DDP, replicate; FSDP1 NO_SHARD) or
    ShardedTensors (FSDP1 FULL_SHARD / SHARD_GRAD_OP). set_model_state_dict copies it into the
    target's own tensors, so only like kinds go, DTensors on the same mesh: it refuses a
    DTensor on another mesh ("Cannot run aten.copy_.default on inputs with different
    meshes"), and FSDP1's load hooks refuse another kind. So between FSDP1 and the other APIs
    a sharded state dict goes from NO_SHARD to plain tensors, and from HYBRID_SHARD to
    fully_shard on the same mesh (both DTensors over (replicate, shard), checked with torch
    alone); ShardedTensors only into FSDP1 FULL_SHARD / SHARD_GRAD_OP. Resharding is what
    full state dicts and DCP are for."""
    if is_fsdp1(source) and is_fsdp1(target):
        return fsdp1_in_memory_problem(source, target)
    kinds = (tensor_kind(source), tensor_kind(target))
    if kinds[0] != kinds[1] or kinds[0] not in ("dtensor", "spmd", "plain"):
        return f"a sharded state dict cannot go from {kinds[0]} to {kinds[1]}"
    if kinds[0] in ("dtensor", "spmd") and source.mesh != target.mesh:
        return "a sharded state dict in memory needs the same mesh on both sides"
    return None


@dataclass(frozen=True)
class RequiresGrad:
    """Before step ``step`` the parameters of the leaf at ``path`` get ``requires_grad_(trainable)``.
    Steps count over the whole run: the ``training.steps`` steps before the state is taken,
    then the ``steps_after`` steps of resuming. A resumed target replays the changes made
    before the state was taken (as a training script that freezes on a schedule would),
    after its optimizer is built over the same parameters as the source's."""

    path: str
    step: int
    trainable: bool


def trainable_at(tree: ModuleTree, changes: tuple[RequiresGrad, ...], step: int) -> dict[str, bool]:
    """Per leaf with parameters: its requires_grad during step ``step`` (the tree's flag, then
    every change made before a step <= ``step``); step -1 is before any change."""
    flags = {p: not n.frozen for p, n in tree.paths().items() if isinstance(n, Leaf) and has_params(n)}
    for c in sorted(changes, key=lambda c: c.step):
        if c.step <= step:
            flags[c.path] = c.trainable
    return flags


def takes_schedule(comp: Composition) -> bool:
    """Whether a side takes a requires_grad schedule (see :func:`schedule_problem`)."""
    return (
        (is_plain(comp) or bool(comp.shards)) and not comp.replicates and comp.wrapper is Wrapper.NONE and not comp.tp
    )


def schedule_problem(
    tree: ModuleTree,
    source: Composition,
    target: Composition,
    training: Training,
    steps_after: int,
    changes: tuple[RequiresGrad, ...],
    frozen_in_optimizer: bool,
) -> tuple[str, str] | None:
    """(field, reason) if the requires_grad schedule ``changes`` is not one these bodies take,
    or None. Each rule has its reason:

    - both sides are a plain model or fully_shard (with checkpoint or HSDP): DDP and replicate
      build their reducer from the parameters that require grad when they are constructed
      ("No parameters should be added nor removed later"); FSDP1 and tensor parallelism are not
      drawn with a schedule yet;
    - a change flips the flag (a change that does nothing is no schedule);
    - a leaf frozen in the tree is unfrozen only if the optimizer holds the frozen parameters
      (``frozen_in_optimizer``): otherwise it would never be stepped and its gradient never
      cleared;
    - freezing needs ``zero_grad(set_to_none=True)``: with zeroed gradients left in place an
      optimizer keeps stepping a frozen parameter (momentum, Adam), which a resumed model,
      whose gradients a checkpoint does not hold, does not;
    - every step trains at least one parameter (else backward() raises).
    """
    if not changes:
        return None
    for where, comp in (("source", source), ("target", target)):
        if not takes_schedule(comp):
            return f"{where}", "a requires_grad schedule is drawn on plain and fully_shard models only"
    paths = tree.paths()
    total = training.steps + steps_after
    trainable = {p: not n.frozen for p, n in paths.items() if isinstance(n, Leaf) and has_params(n)}
    scales = any(isinstance(n, Block) and n.scale for n in paths.values())  # always trained
    for i, c in enumerate(changes):
        if c.path not in trainable:
            return f"requires_grad[{i}].path", f"{c.path!r} names no leaf with parameters"
        if not 0 <= c.step < total:
            return f"requires_grad[{i}].step", f"step={c.step} is outside 0..{total - 1}"
        if any((d.path, d.step) == (c.path, c.step) for d in changes[:i]):
            return f"requires_grad[{i}]", f"{c.path!r} changes twice before step {c.step}"
    for step in range(total):
        for i, c in enumerate(changes):
            if c.step != step:
                continue
            if trainable[c.path] == c.trainable:
                return f"requires_grad[{i}].trainable", f"{c.path!r} has requires_grad={c.trainable} already"
            if c.trainable and not frozen_in_optimizer and getattr(paths[c.path], "frozen", False):
                return f"requires_grad[{i}].path", f"{c.path!r} is frozen in the tree and not held by the optimizer"
            if not c.trainable and not training.set_to_none:
                return "training.set_to_none", "freezing a trained parameter needs zero_grad(set_to_none=True)"
            trainable[c.path] = c.trainable
        if not scales and not any(trainable.values()):
            return "requires_grad", f"step {step} trains no parameter"
    return None
