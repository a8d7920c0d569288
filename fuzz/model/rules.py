"""The validity rules: what keeps a case one the APIs document, checked against its tree.

Each rule raises :class:`~fuzz.errors.CaseError` naming the field and the reason, so a failing
case is a finding and not a misuse. The bodies call these from ``__post_init__``; strategies
draw only cases that pass them. Imports only the standard library and the model.
"""

from __future__ import annotations

from dataclasses import replace

from fuzz.errors import CaseError
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.layout import Layout
from fuzz.model.training import AccumSync, Compile, Optimizer, Reinit, ReinitHow, Skip, Training
from fuzz.model.tree import (
    PARAM_LEAVES,
    Block,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    containers,
    contains,
    has_dropout,
    has_leaf,
    has_params,
    is_ancestor,
    is_classic,
    owns_params,
)


def checkpoint_over_replicate(comp: Composition) -> tuple[int, str, str] | None:
    """The first checkpoint at or above a replicate'd module, as (its index, its path, the
    replicate's path), or None. The recomputation in backward calls the replicate'd module's
    forward (DDP's) again while its reducer is mid-backward ("Expected to have finished reduction
    in the prior iteration"); DDP's docs speak of checkpointing inside the model it wraps.
    Generated trees and users' models both follow it."""
    for i, path in enumerate(comp.checkpoints):
        for held in comp.replicates:
            if contains(path, held):
                return i, path, held
    return None


def check_composition(tree: ModuleTree, comp: Composition, where: str = "composition") -> None:
    """Structural checks of a composition against its tree (CaseError on the first problem)."""
    paths = tree.paths()
    sharded: list[str] = []
    for i, spec in enumerate(comp.shards):
        for j, path in enumerate(spec.paths):
            at = f"{where}.shards[{i}]." + ("path" if j == 0 else f"group[{j - 1}]")
            if path not in paths:
                raise CaseError(at, f"{path!r} names no module of the tree (paths: {sorted(paths)})")
            node = paths[path]
            if not has_params(node):
                what = f"a parameter-free {node.kind.value} leaf" if isinstance(node, Leaf) else "holds no parameters"
                raise CaseError(at, f"{path!r} is {what}" if isinstance(node, Leaf) else f"{path!r} {what}")
            if path in sharded:
                raise CaseError(at, f"{path!r} is sharded twice")
            for other in spec.paths[:j]:
                if is_ancestor(other, path) or is_ancestor(path, other):
                    raise CaseError(at, f"{path!r} and {other!r} are nested; a group takes disjoint modules")
            sharded.append(path)
    for name, group in (("replicates", comp.replicates), ("checkpoints", comp.checkpoints)):
        for i, path in enumerate(group):
            if path not in paths:
                raise CaseError(f"{where}.{name}[{i}]", f"{path!r} names no module of the tree")
            if group.count(path) > 1:
                raise CaseError(f"{where}.{name}[{i}]", f"{path!r} appears twice")
    for i, path in enumerate(comp.replicates):
        if path in sharded:
            raise CaseError(f"{where}.replicates[{i}]", f"{path!r} is also fully_shard'ed")
    done: list[str] = []
    for api, path in comp.steps():
        if api != "fully_shard":
            continue
        members = comp._spec_paths(api, path)
        for member in members:
            late = [d for d in done if is_ancestor(d, member)]
            if late:
                raise CaseError(
                    f"{where}.shards",
                    f"{member!r} would be sharded after its ancestor {late[0]!r}; put grouped modules at one depth",
                )
        done += members
    if comp.spmd and has_dropout(tree.root):
        # Random ops on DTensors draw from DTensor's own RNG tracker (an offset into one seed
        # per mesh), not from each rank's generator that a reference (or a plain model a state
        # is moved to) seeds: another mask.
        raise CaseError(f"{where}.spmd", "an SPMD composition is drawn for trees without dropout")
    if comp.spmd and comp.mesh and has_leaf(tree.root, LeafKind.CONV1D):
        # On an HSDP mesh the batch is sharded on dim 0 over both dimensions ([Shard(0),
        # Shard(0)]), which DTensor's convolution handler refuses: "DTensor operator
        # implementation does not support things like hybrid sharding strategies yet" (torch 2.13).
        raise CaseError(f"{where}.spmd", "an SPMD composition on an HSDP mesh is drawn for trees without conv1d")
    if (comp.spmd or comp.tp) and not is_classic(tree):
        # Not drawn yet: the SPMD program's loss and batch placements, and the tensor-parallel
        # pairs' layouts, are written for (B, W) float activations of the first leaf kinds.
        raise CaseError(f"{where}.{'spmd' if comp.spmd else 'tp'}", "drawn for trees of the first leaf kinds only")
    _check_tp(tree, comp, where)
    _check_tied(tree, comp, where)
    _check_scalars(tree, comp, where)
    _check_containers(tree, comp, where)
    over = checkpoint_over_replicate(comp)
    if over is not None:
        i, path, held = over
        raise CaseError(f"{where}.checkpoints[{i}]", f"{path!r} holds replicate({held!r}): not checkpointed")
    _check_replicate_options(tree, comp, where)
    _check_checkpoint_options(tree, comp, where)
    _check_ignored_params(tree, comp, where)
    if comp.knobs.no_unshard_in_backward and any(isinstance(n, Block) and n.repeat for n in paths.values()):
        # Layout.unneeded_in_backward reasons about one call per module: a module called twice
        # feeds its own second call, whose input gradient needs its parameters in backward.
        raise CaseError(f"{where}.knobs.no_unshard_in_backward", "not drawn with blocks that run their children twice")
    if comp.knobs.no_unshard_in_backward and not Layout(tree, comp).unneeded_in_backward():
        raise CaseError(
            f"{where}.knobs.no_unshard_in_backward",
            "no fully_shard unit whose parameters backward does not need (Layout.unneeded_in_backward)",
        )
    if comp.wrapper is Wrapper.NONE:
        # A parameter under no fully_shard / replicate gets no gradient reduction, so its
        # ranks would diverge by design: not a case the properties can judge.
        for owner in Layout(tree, comp).unmanaged()[:1]:
            raise CaseError(f"{where}.shards", f"the parameters of {owner!r} are under no fully_shard or replicate")


TP_BETWEEN = frozenset({LeafKind.RELU, LeafKind.TANH, LeafKind.GELU})


def _check_tied(tree: ModuleTree, comp: Composition, where: str) -> None:
    """A tied embedding and head (one Parameter in two modules) are managed by one unit.
    fully_shard's lazy init refuses a parameter two units manage: "Parameter ... is shared with
    a parameter already managed by another FSDP group. For shared/tied parameters, use
    fully_shard([module_a, module_b]) to place them in the same FSDP group" (torch 2.13,
    FSDPState._validate_no_duplicate_params; the ``invalid`` property's tied_across_units), and
    the same Parameter under fully_shard in one place and replicate in the other is a DTensor
    and a plain tensor at once. Neither may be ignored by a unit (ignored_params,
    ignored_modules): the other's unit would still manage it. Meta-device init keeps the tie:
    the unit manages the shared Parameter once and sets it on both modules (a plain module's
    ``to_empty`` would untie them)."""
    tied = tree.tied
    if tied is None or comp.wrapper is not Wrapper.NONE:
        return  # DDP and FSDP1 wrap both in the root's unit (auto-wrapping takes blocks only)
    embedding, head = tied
    layout = Layout(tree, comp)
    covering = [layout.unit_of(p) for p in tied]
    if any(contains(i, p) for p in tied for i in comp.replicate_options.ignored_modules) or any(
        p in comp.shard_ignored for p in tied
    ):
        raise CaseError(f"{where}.shards", f"the tied {embedding!r} / {head!r} are not drawn ignored by a unit")
    if covering[0] != covering[1]:
        raise CaseError(
            f"{where}.shards",
            f"the tied embedding {embedding!r} and head {head!r} are managed by two units "
            f"({', '.join(repr(u and u.members) for u in covering)}): fully_shard([embedding, head]) or neither",
        )


def scalar_problem(tree: ModuleTree, comp: Composition) -> str | None:
    """Why a block's scalar parameter (``Block.gain``, rank 0) cannot be managed as ``comp``
    manages it, or None: fully_shard refuses it at the call ("fully_shard doesn't support
    scalar parameters. Change gain to a 1D tensor with numel equal to 1", torch 2.13's
    ``_verify_managed_param``; the ``invalid`` property's scalar_under_fully_shard), and FSDP1
    the same way ("FSDP doesn't support scalar parameters"). replicate and DDP take it, and so
    does fully_shard where the block is in its ``ignored_params``."""
    gains = [p for p, n in tree.paths().items() if isinstance(n, Block) and n.gain]
    if not gains:
        return None
    if comp.wrapper is not Wrapper.NONE:
        return None if comp.wrapper is Wrapper.DDP else f"FSDP1 refuses the scalar parameter of {gains[0]!r}"
    layout = Layout(tree, comp)
    for path in gains:
        unit = layout.unit_of(path)
        if unit is not None and unit.api == "fully_shard" and path not in comp.shard_ignored:
            return f"fully_shard refuses the scalar parameter (rank 0) of {path!r}"
    return None


def _check_containers(tree: ModuleTree, comp: Composition, where: str) -> None:
    """No API on an nn.ModuleList / nn.ModuleDict block: fully_shard and replicate refuse one
    ("fully_shard does not support containers that do not implement forward", torch 2.13's
    ``_validate_module``; the ``invalid`` property's container_unit), and composable checkpoint
    hooks a forward that never runs (undocumented: not drawn). Their items take any API."""
    held = containers(tree)
    if not held:
        return
    named = [("shards", p) for s in comp.shards for p in s.paths]
    named += [("replicates", p) for p in comp.replicates] + [("checkpoints", p) for p in comp.checkpoints]
    for field_name, path in named:
        if path in held:
            raise CaseError(f"{where}.{field_name}", f"{path!r} is an nn.Module container without forward")


def _check_scalars(tree: ModuleTree, comp: Composition, where: str) -> None:
    problem = scalar_problem(tree, comp)
    if problem is not None:
        raise CaseError(f"{where}.shards", problem)


def _trainable_params(node: Node) -> bool:
    """True if ``node``'s module holds a trainable parameter of its own."""
    return owns_params(node) and not (isinstance(node, Leaf) and node.frozen)


def _check_replicate_options(tree: ModuleTree, comp: Composition, where: str) -> None:
    """``ignored_modules``: each a module strictly under a replicated one, whose own parameters
    (some of them) that replicate would manage, not nested in another ignored module; and every
    replicate call keeps a trainable parameter (DDP refuses a module without one: "DistributedDataParallel
    is not needed when a module doesn't have any parameter that requires a gradient").
    ``delay_all_reduce``: some replicate call has a plan (:meth:`Layout.delay_plan`)."""
    opts = comp.replicate_options
    paths = tree.paths()
    plain = Layout(tree, replace(comp, replicate_options=replace(opts, ignored_modules=())))
    at = f"{where}.replicate_options.ignored_modules"
    for i, path in enumerate(opts.ignored_modules):
        if path not in paths:
            raise CaseError(f"{at}[{i}]", f"{path!r} names no module of the tree")
        owners = [r for r in comp.replicates if is_ancestor(r, path)]
        if not owners or not any(plain.manages_under(r, path) for r in owners):
            raise CaseError(f"{at}[{i}]", f"{path!r} holds no parameters a replicate call above it manages")
        if any(contains(o, path) or contains(path, o) for o in opts.ignored_modules[:i]):
            raise CaseError(f"{at}[{i}]", f"{path!r} is nested with another ignored module")
    layout = Layout(tree, comp)
    for member in comp.replicates:
        unit = next(u for u in layout.units if u.api == "replicate" and u.members == (member,))
        if opts.ignored_modules and not any(_trainable_params(paths[p]) for p in layout.owned_by(unit)):
            raise CaseError(at, f"replicate({member!r}) is left no trainable parameter of its own to manage")
    if opts.delay_all_reduce and not any(layout.delay_plan(r) for r in comp.replicates):
        raise CaseError(
            f"{where}.replicate_options.delay_all_reduce",
            "no replicate call manages two trainable modules (one to hook, one to delay)",
        )


def _check_ignored_params(tree: ModuleTree, comp: Composition, where: str) -> None:
    """``ShardSpec.ignored``: each a module with parameters of its own that this fully_shard call
    would manage (no inner unit takes them), named once, and the call keeps other parameters to
    shard. Only where the documented contract is all that decides numerics: plain fully_shard
    compositions (no wrapper, replicate, tensor parallelism, meta init, knobs), no mixed
    precision or offload on that call (ignored parameters are not cast, so a module would mix
    dtypes)."""
    specs = [(i, s) for i, s in enumerate(comp.shards) if s.ignored]
    if not specs:
        return
    at = f"{where}.shards[{specs[0][0]}].ignored"
    others = (
        ("a wrapper", comp.wrapper is not Wrapper.NONE),
        ("replicate", bool(comp.replicates)),
        ("tensor parallelism", bool(comp.tp)),
        ("meta_init", comp.meta_init),
        ("knobs", comp.knobs.is_set),
    )
    for what, present in others:
        if present:
            raise CaseError(at, f"ignored_params are not drawn with {what}")
    paths = tree.paths()
    plain = Layout(tree, replace(comp, shards=tuple(replace(s, ignored=()) for s in comp.shards)))
    seen: list[str] = []
    for i, spec in specs:
        at = f"{where}.shards[{i}].ignored"
        if spec.mixed_precision is not None or spec.offload:
            raise CaseError(at, "ignored_params are not drawn with mixed precision or offload on that call")
        for path in spec.ignored:
            if path not in paths or not owns_params(paths[path]):
                raise CaseError(at, f"{path!r} names no module of the tree with parameters of its own")
            if plain.member_of(path) not in spec.paths:
                raise CaseError(at, f"{path!r}: its parameters are not this fully_shard call's to ignore")
            if path in seen:
                raise CaseError(at, f"{path!r} is ignored twice")
            seen.append(path)
        unit = next(u for u in plain.units if u.api == "fully_shard" and u.index == i)
        if all(p in spec.ignored for p in plain.owned_by(unit)):
            raise CaseError(at, f"fully_shard({spec.path!r}) would be left no parameter to shard")


def _check_checkpoint_options(tree: ModuleTree, comp: Composition, where: str) -> None:
    """``preserve_rng_state=False`` only where no dropout runs inside a checkpointed module:
    torch documents it as "Omit stashing and restoring the RNG state during each checkpoint",
    so a recomputed dropout draws another mask than forward did, by design."""
    if comp.checkpoint_options.preserve_rng_state:
        return
    paths = tree.paths()
    for path in comp.checkpoints:
        if has_dropout(paths[path]):
            raise CaseError(
                f"{where}.checkpoint_options.preserve_rng_state",
                f"checkpointed module {path!r} holds dropout: without the RNG state its recomputation differs",
            )


def _check_tp(tree: ModuleTree, comp: Composition, where: str) -> None:
    """Each pair: two trainable Linear leaves of one block, the rowwise one after the colwise one
    with only activations between, dimensions that split evenly over the tp ranks; no leaf in two
    pairs. (RowwiseParallel rebuilds its input with DTensor.from_local, which assumes even
    shards, so an odd width is a misuse, not a case.)"""
    paths = tree.paths()
    used: list[str] = []
    if comp.tp and tree.width % comp.tp_size:
        raise CaseError(f"{where}.tp", f"width={tree.width} does not split evenly over tp_size={comp.tp_size}")
    for i, pair in enumerate(comp.tp):
        at = f"{where}.tp[{i}]"
        for field_name, path in (("colwise", pair.colwise), ("rowwise", pair.rowwise)):
            node = paths.get(path)
            if not (isinstance(node, Leaf) and node.kind is LeafKind.LINEAR and not node.frozen):
                raise CaseError(f"{at}.{field_name}", f"{path!r} names no trainable linear leaf")
            if path in used:
                raise CaseError(f"{at}.{field_name}", f"{path!r} is in two pairs")
            used.append(path)
        parent, _, a = pair.colwise.rpartition(".")
        parent_b, _, b = pair.rowwise.rpartition(".")
        block = paths[parent]
        if parent != parent_b or not isinstance(block, Block) or not int(a) < int(b):
            raise CaseError(f"{at}.rowwise", f"{pair.rowwise!r} is not a later sibling of {pair.colwise!r}")
        between = block.children[int(a) + 1 : int(b)]
        if not all(isinstance(c, Leaf) and c.kind in TP_BETWEEN for c in between):
            raise CaseError(f"{at}.rowwise", "only activations may sit between the pair's linear leaves")


def check_mesh(comp: Composition, world_size: int, where: str = "composition") -> None:
    if comp.mesh and comp.mesh[0] * comp.mesh[1] != world_size:
        r, sh = comp.mesh
        raise CaseError(f"{where}.mesh", f"mesh=({r}, {sh}) needs world_size={r * sh}, not {world_size}")
    if world_size % comp.tp_size:
        raise CaseError(f"{where}.tp_size", f"tp_size={comp.tp_size} does not divide world_size={world_size}")
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    for i, spec in enumerate(comp.shards):
        raf = spec.reshard_after_forward
        if not isinstance(raf, bool) and (raf >= shard_size or shard_size % raf):
            raise CaseError(
                f"{where}.shards[{i}].reshard_after_forward",
                f"{raf} is not a divisor of the shard size {shard_size} (world_size={world_size}, mesh={comp.mesh}) "
                "other than 1 and itself",
            )


def _trainable_used(node: Node, path: str, skipped: list[str], unfrozen: set[str]) -> bool:
    """True if the module at ``path`` runs and uses a trainable parameter with ``skipped`` left out."""
    if path in skipped:
        return False
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES and (not node.frozen or path in unfrozen)
    children = ((f"{path}.{i}" if path else str(i), c) for i, c in enumerate(node.children))
    return node.own_params or any(_trainable_used(c, p, skipped, unfrozen) for p, c in children)


def check_training(tree: ModuleTree, comps: tuple[Composition, ...], t: Training, where: str = "training") -> None:
    """Checks of ``Training.skips`` and ``Training.unfreeze`` against the tree and the
    compositions they train (CaseError on the first problem)."""
    paths = tree.paths()
    for i, skip in enumerate(t.skips):
        if skip.path not in paths or skip.path == "":
            raise CaseError(f"{where}.skips[{i}].path", f"{skip.path!r} names no module below the root")
        if skip.path in tree.shape_changing:
            # A module left out passes its input on; tokens cannot stand for an embedding's
            # output, nor the width for the vocabulary.
            raise CaseError(f"{where}.skips[{i}].path", f"{skip.path!r} changes the activation's shape: not skipped")
    for i, later in enumerate(t.unfreeze):
        node = paths.get(later.path)
        if not (isinstance(node, Leaf) and node.frozen):
            raise CaseError(f"{where}.unfreeze[{i}].path", f"{later.path!r} names no frozen leaf")
        for comp in comps:
            if comp.wrapper is Wrapper.DDP or any(
                contains(r, later.path) and Layout(tree, comp).manages_under(r, later.path) for r in comp.replicates
            ):
                # DDP (and replicate, which runs DDP) builds its reducer from the parameters
                # that require grad when it is constructed; its docs: "This module assumes all
                # parameters are registered in the model by the time it is created. No
                # parameters should be added nor removed later." A parameter unfrozen later is
                # never all-reduced.
                raise CaseError(f"{where}.unfreeze[{i}].path", f"{later.path!r} is managed by DDP / replicate")
            if comp.wrapper is not Wrapper.NONE and t.accum_sync is AccumSync.NO_GRAD_SYNC:
                # FSDP1 (use_orig_params=True) recomputes a FlatParameter's requires_grad from its
                # original parameters before each forward, so unfreezing is meant to work; under
                # no_sync() it trains the unfrozen parameter with a wrong gradient (seen with
                # NO_SHARD, not reduced to a torch-only reproduction yet): left out until it is.
                raise CaseError(f"{where}.unfreeze[{i}].path", "FSDP1 no_sync() with a leaf unfrozen later")
    for i, again in enumerate(t.reinit):
        if again.path not in paths or not owns_params(paths[again.path]):
            raise CaseError(f"{where}.reinit[{i}].path", f"{again.path!r} names no module with parameters of its own")
        for comp in comps:
            problem = reinit_problem(tree, comp, t, again)
            if problem is not None:
                raise CaseError(f"{where}.reinit[{i}]", problem)
    for comp in comps:
        clip = clip_problem(comp, t)
        if clip is not None:
            raise CaseError(f"{where}.clip_grad_norm", clip)
        evaluation = eval_problem(comp, t)
        if evaluation is not None:
            raise CaseError(f"{where}.eval_forward", evaluation)
        k = comp.knobs
        if k.reduce_scatter_unused and t.skips:
            # zero gradients for the skipped modules' parameters would move them under momentum or
            # Adam; the reference leaves them untouched. Without skips every trainable parameter
            # gets a gradient, and the knob must change nothing.
            raise CaseError(f"{where}.skips", "set_reduce_scatter_unused_params is drawn without skipped modules")
        if k.is_set and t.compile is not Compile.NONE:
            raise CaseError(f"{where}.compile", "FSDPModule knobs are not drawn with torch.compile")
        if (
            k.forward_prefetch or k.backward_prefetch or k.reshard_after_backward_last or k.explicit_unshard
        ) and t.skips:
            # A module left out of forward after its parameters were prefetched or kept
            # unsharded keeps them unsharded past the optimizer step: what prefetching a module
            # that does not run means is not documented.
            raise CaseError(
                f"{where}.skips", "prefetch, explicit unshard and reshard_after_backward are drawn without skips"
            )
        _check_replicate_training(comp, t, where)
        if t.forwards > 1 and (comp.spmd or comp.tp or t.compile is not Compile.NONE):
            # Not drawn yet: the SPMD program's loss takes one output, and compile is left out.
            raise CaseError(f"{where}.forwards", "several forwards per backward: not with SPMD, TP or compile yet")
        if comp.spmd and t.compile is not Compile.NONE:
            raise CaseError(f"{where}.compile", "an SPMD composition is not drawn with torch.compile yet")
        if (comp.replicate_options.is_set or comp.checkpoint_options.is_set) and t.compile is not Compile.NONE:
            # Not drawn yet: under torch.compile Dynamo traces replicate's hooks (its DDPOptimizer
            # splits graphs at DDP's bucket boundaries) and checkpoint's context_fn as a
            # higher-order op; the options are checked in eager mode first.
            raise CaseError(f"{where}.compile", "replicate / checkpoint options are drawn without torch.compile")
        if comp.tp and (t.skips or t.unfreeze or t.compile is not Compile.NONE):
            # Not drawn yet: a skipped Linear of a pair would feed the other a tensor of the
            # wrong layout, and compile / unfreezing under TP are left for later.
            raise CaseError(f"{where}", "tensor parallelism is trained without skips, unfreeze or compile")
        if t.compile is Compile.AOT_EAGER and (comp.checkpoints or comp.wrapper not in (Wrapper.NONE, Wrapper.DDP)):
            # Seen on torch 2.13 and left out until investigated: composable checkpoint under
            # AOTAutograd raises CheckpointError (recomputed tensors' metadata differ), and FSDP1
            # under AOTAutograd assigns a sharded-size gradient to an unsharded view (likely the
            # known fsdp1-compile-recompile-sharded-grad bug of fuzz/known.py, which the eager
            # backend meets too).
            raise CaseError(f"{where}.compile", "aot_eager with checkpoint or FSDP1 is not drawn yet")
    for i, skip in enumerate(t.skips):
        at = f"{where}.skips[{i}]"
        unfrozen = {u.path for u in t.unfreeze if u.step <= skip.step}
        if not _trainable_used(tree.root, "", t.skipped_at(skip.step, skip.microbatch), unfrozen):
            # The loss would not depend on any trainable parameter: backward() raises.
            where_ = f"step {skip.step}, microbatch {skip.microbatch}"
            raise CaseError(at, f"{where_} leaves no trainable parameter in forward")
        if not has_params(paths[skip.path]):
            continue  # an activation left out: no parameter goes unused
        for comp in comps:
            _check_unused(tree, comp, t, skip, at)


def reinit_problem(tree: ModuleTree, comp: Composition, t: Training, again: Reinit) -> str | None:
    """Why ``comp`` does not take ``again`` (``Training.reinit``), or None. In-place
    re-initialisations under ``torch.no_grad()`` change what each API registers (a DTensor
    shard, an FSDP1 view, a replica) alike on every rank: every composition takes them but
    tensor parallelism and SPMD programs (not drawn yet). A replaced parameter is taken where
    fully_shard manages it (its lazy init picks the new sharded parameter up: "Users may change
    or register parameters after construction time", ``FSDPParamGroup.lazy_init``) or no API
    does; not where DDP or replicate manages it ("No parameters should be added nor removed
    later", DistributedDataParallel's docs: its reducer keeps the old one), nor under FSDP1
    (its FlatParameter holds the old values), nor a tied weight (a new Parameter in one module
    unties the pair), fully_shard's ignored parameters or a leaf unfrozen later (the training
    holds its old parameters from the start)."""
    if comp.tp or comp.spmd:
        return "not drawn with tensor parallelism or SPMD programs yet"
    if again.how is not ReinitHow.REPLACE:
        return None
    if comp.wrapper is not Wrapper.NONE:
        return "DDP and FSDP1 keep the parameters they were built with: none is replaced"
    if tree.tied is not None and again.path in tree.tied:
        return "a new Parameter in one module of a tied pair unties it"
    if again.path in comp.shard_ignored or any(u.path == again.path for u in t.unfreeze):
        return "fully_shard's ignored parameters and leaves unfrozen later are not replaced"
    unit = Layout(tree, comp).unit_of(again.path)
    if unit is not None and unit.api == "replicate":
        return "replicate keeps the parameters it was built with: none is replaced"
    return None


def clip_problem(comp: Composition, t: Training) -> str | None:
    """Why ``Training.clip_grad_norm`` is not drawn with ``comp``, or None. Over a mix of
    fully_shard's DTensor gradients and plain ones (replicate's, ignored parameters')
    ``torch.nn.utils.clip_grad_norm_`` raises "aten._foreach_norm.Scalar got mixed torch.Tensor
    and DTensor, need to convert all torch.Tensor to DTensor before calling distributed
    operators!" (torch 2.13): the user converts or clips per group, which the suite does not
    model yet. FSDP1's ``clip_grad_norm_`` takes each gradient's norm with ``dtype=float32``,
    which ``linalg.vector_norm`` refuses for float64 gradients ("should be convertible without
    narrowing"): a torch bug, so FSDP1 clips float32 models only. Not with replicate's
    ignored_modules, whose rank-local gradients make the clip coefficient differ per rank. Tensor
    parallelism and SPMD programs are left for later."""
    if t.clip_grad_norm is None:
        return None
    if comp.tp or comp.spmd:
        return "not drawn with tensor parallelism or SPMD programs yet"
    if comp.shards and (comp.replicates or comp.shard_ignored):
        return "clip_grad_norm_ raises over a mix of DTensor and plain gradients"
    if comp.replicate_options.ignored_modules:
        # Their gradients stay rank-local, so the total norm, and with it the clip coefficient,
        # differs per rank: the replicated parameters are scaled differently on each rank and
        # their replicas diverge by design (torch is right; a user clips the synced ones).
        return "not with replicate's ignored_modules: the clip coefficient would differ per rank"
    if comp.wrapper.value.startswith("fsdp1") and t.dtype is not Dtype.FLOAT32:
        return "FSDP1's clip_grad_norm_ raises for float64 gradients (a torch bug)"
    return None


def eval_problem(comp: Composition, t: Training) -> str | None:
    """Why ``Training.eval_forward`` is not drawn with ``comp``, or None: not with a
    MixedPrecisionPolicy (the hand-cast reference casts training microbatches only), FSDPModule
    knobs, torch.compile (a recompile per mode), tensor parallelism or SPMD programs (not drawn
    yet)."""
    if not t.eval_forward:
        return None
    if any(s.mixed_precision is not None for s in comp.shards):
        return "not drawn with a MixedPrecisionPolicy yet"
    if comp.knobs.is_set:
        # The knobs' order and memory contracts record each training forward and backward
        # (fuzz._rank.knobs); an inference forward between steps is not what they describe:
        # with reshard_after_forward=False it leaves unsharded storage that no backward frees.
        return "not drawn with FSDPModule knobs yet"
    if t.compile is not Compile.NONE or comp.tp or comp.spmd:
        return "not drawn with torch.compile, tensor parallelism or SPMD programs yet"
    if t.unfreeze and any(s.reshard_after_forward is False for s in comp.shards):
        # A torch bug (issue 46's report, a torch-only reproducer there): the inference forward
        # leaves a reshard_after_forward=False unit unsharded, and fully_shard copies a
        # parameter's requires_grad to its unsharded one only when it unshards, so a leaf
        # unfrozen before the next step does not train in it. The mechanism of the registry's
        # fully_shard-unfrozen-unresharded met another way; kept out until the registry has it.
        return "an inference forward before a leaf is unfrozen under reshard_after_forward=False (a torch bug)"
    return None


def _check_replicate_training(comp: Composition, t: Training, where: str) -> None:
    """Skips under replicate's options that promise a fixed graph. ``static_graph``: "The set
    of used and unused parameters will not change during the whole training loop" and "How the
    graph is trained will not change"; ``skip_all_reduce_unused_params``: "requires that unused
    parameters remain the same across all ranks throughout the entire training process" (else a
    hang). So the modules left out in and around each replicated module are the same on every
    microbatch. ``delay_all_reduce``: none at all there (the hooked parameter must get a
    gradient on every microbatch, else the delayed ones are never reduced)."""
    opts = comp.replicate_options
    if not (opts.static_graph or opts.skip_all_reduce_unused_params or opts.delay_all_reduce) or not t.skips:
        return
    slots = [(s, m) for s in range(t.steps) for m in range(t.grad_accum)]
    for r in comp.replicates:
        seen = {frozenset(p for p in t.skipped_at(s, m) if contains(p, r) or contains(r, p)) for s, m in slots}
        if opts.delay_all_reduce and any(seen):
            raise CaseError(f"{where}.skips", f"delay_all_reduce: modules in or around replicate({r!r}) left out")
        if len(seen) > 1:
            raise CaseError(
                f"{where}.skips",
                f"static_graph / skip_all_reduce_unused_params: replicate({r!r}) sees other modules left out over time",
            )


def _check_unused(tree: ModuleTree, comp: Composition, t: Training, skip: Skip, at: str) -> None:
    """The rules for parameters unused in forward, per API. The reference leaves an unused
    parameter's gradient None, and torch's optimizers skip a parameter whose gradient is None
    (no momentum, no Adam moments or step, no weight decay); zero and None gradients are the same
    only to SGD without momentum."""
    # static_graph: "it does not matter whether users set find_unused_parameters = True or not"
    # (the unused set is fixed: _check_replicate_training).
    if (
        not comp.find_unused
        and not comp.replicate_options.static_graph
        and (
            comp.wrapper is Wrapper.DDP
            or any(
                is_ancestor(r, skip.path) and Layout(tree, comp).manages_under(r, skip.path) for r in comp.replicates
            )
        )
    ):
        # DDP (and replicate, which runs DDP) raises "Expected to have finished reduction in the
        # prior iteration" when a parameter of a module that ran forward got no gradient, unless
        # built with find_unused_parameters=True (comp.find_unused). Then a parameter unused on
        # every rank keeps its gradient untouched (None after zero_grad(set_to_none=True)), as
        # in the reference. A replicated module left out of forward as a whole is fine either
        # way: DDP never prepared a backward.
        raise CaseError(at, f"{skip.path!r} holds parameters DDP manages: needs find_unused_parameters=True")
    if comp.wrapper not in (Wrapper.NONE, Wrapper.DDP):  # FSDP1
        if t.optimizer is not Optimizer.SGD or t.momentum:
            # FSDP1 flattens a unit's parameters into one FlatParameter; with use_orig_params the
            # original parameters' gradients are views into its gradient, so a parameter unused
            # beside used ones gets a zero gradient, not None (FlatParamHandle._use_sharded_grad_views).
            raise CaseError(at, "FSDP1 gives unused parameters zero gradients: only SGD without momentum")
        if t.accum_sync is AccumSync.NO_GRAD_SYNC and skip.microbatch == t.grad_accum - 1:
            # A unit that accumulated an unsharded gradient under no_sync() and is unused on the
            # microbatch that syncs: FSDP1 asserts "All sharded parameters that received a
            # gradient in the post-backward should use `_saved_grad_shard`" in
            # prepare_gradient_for_optim (its no_sync docs have gradients synchronized "in the
            # first forward-backward pass after exiting the context").
            raise CaseError(at, "FSDP1 no_sync(): a unit unused on the microbatch that syncs is not supported")
