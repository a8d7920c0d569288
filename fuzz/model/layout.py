"""Which module's parameters each distributed unit manages: the one home of that rule.

Module paths are the names torch gives submodules (``"1.0"``; ``""`` is the root). A *unit* is
one ``fully_shard`` call (its module and the modules grouped with it) or one ``replicate``
call. The parameters a module holds itself belong to the innermost unit with a member at or
above the module: a nested unit takes its modules' parameters away from an enclosing one,
which is how both fully_shard and replicate assign them. A module replicate is told to ignore
(``ReplicateOptions.ignored_modules``), or whose own parameters a fully_shard call ignores
(``ShardSpec.ignored``), loses them to no unit: they stay local to each rank
(:meth:`Layout.local`). The judges, the rank side, the
validity rules and the known-bug conditions all ask :class:`Layout` instead of comparing path
prefixes themselves.

Imports only the standard library and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from fuzz.model.composition import Composition, Wrapper
from fuzz.model.training import Training
from fuzz.model.tree import (
    Block,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    contains,
    forward_order,
    is_ancestor,
    owns_params,
    param_names,
)

#: Leaves whose forward reads its input in several autograd operations, so that the input's
#: gradient is a sum of their terms: an attention's q, k and v projections; an RMSNorm, which
#: torch computes as ``x * rsqrt(mean(x ** 2) + eps)`` (a LayerNorm is one native operation).
REUSES_INPUT = frozenset({LeafKind.ATTENTION, LeafKind.RMS_NORM})


@dataclass(frozen=True)
class Unit:
    """One fully_shard call (``api == "fully_shard"``, ``index`` into ``Composition.shards``) or
    one replicate call (``api == "replicate"``, ``index`` into ``Composition.replicates``)."""

    api: str
    index: int
    members: tuple[str, ...]

    def covers(self, path: str) -> bool:
        """True if ``path`` is at or under one of the unit's members."""
        return any(contains(m, path) for m in self.members)


@dataclass(frozen=True)
class Layout:
    """The units of a composition over a tree, and which modules' parameters each manages."""

    tree: ModuleTree
    comp: Composition

    @cached_property
    def paths(self) -> dict[str, Node]:
        return self.tree.paths()

    @cached_property
    def units(self) -> tuple[Unit, ...]:
        """Every fully_shard unit (in ``shards`` order), then every replicate unit."""
        shards = tuple(Unit("fully_shard", i, spec.paths) for i, spec in enumerate(self.comp.shards))
        return shards + tuple(Unit("replicate", i, (p,)) for i, p in enumerate(self.comp.replicates))

    @cached_property
    def member_paths(self) -> tuple[str, ...]:
        """Every module a fully_shard or replicate call was applied to."""
        return tuple(m for u in self.units for m in u.members)

    def member_of(self, path: str, api: str | None = None) -> str | None:
        """The innermost unit member at or above ``path`` (None if no unit covers it); only
        members of ``api``'s units (``"fully_shard"`` or ``"replicate"``) when it is given."""
        best: str | None = None
        members = self.member_paths if api is None else [m for u in self.units if u.api == api for m in u.members]
        for m in members:
            if contains(m, path) and (best is None or is_ancestor(best, m)):
                best = m
        ignored = self.comp.replicate_options.ignored_modules
        if (
            best in self.comp.replicates
            and api != "fully_shard"
            and any(is_ancestor(best, i) and contains(i, path) for i in ignored)
        ):
            return None  # ignored by that replicate: local to each rank
        if best is not None and path in self._shard_ignored.get(best, ()):
            return None  # in that fully_shard call's ignored_params: local to each rank
        return best

    @cached_property
    def _shard_ignored(self) -> dict[str, tuple[str, ...]]:
        """Per fully_shard member: the modules whose own parameters its call ignores."""
        return {m: spec.ignored for spec in self.comp.shards if spec.ignored for m in spec.paths}

    def unit_of(self, path: str) -> Unit | None:
        """The unit that manages the parameters the module at ``path`` holds itself."""
        member = self.member_of(path)
        if member is None:
            return None
        return next(u for u in self.units if member in u.members)

    def owned_by(self, unit: Unit, member: str | None = None) -> list[str]:
        """The modules (holding parameters of their own) whose parameters ``unit`` manages,
        parents before children; only those under ``member`` when it is given."""
        out = []
        for path, node in self.paths.items():
            if owns_params(node) and self.member_of(path) in (unit.members if member is None else (member,)):
                out.append(path)
        return out

    def outermost(self, unit: Unit) -> bool:
        """True if no member of another fully_shard unit encloses a member of ``unit``."""
        return not any(
            other != unit
            and other.api == "fully_shard"
            and any(is_ancestor(o, m) for o in other.members for m in unit.members)
            for other in self.units
        )

    def frozen_only(self, unit: Unit, member: str | None = None) -> bool:
        """True if ``unit`` (or its ``member``) manages parameters and all of them are frozen."""
        owned = [self.paths[p] for p in self.owned_by(unit, member)]
        return bool(owned) and all(isinstance(n, Leaf) and n.frozen for n in owned)

    def manages_under(self, member: str, path: str) -> bool:
        """True if the unit member ``member`` (at or above ``path``) manages the parameters of
        some module at or under ``path``: no other unit between them takes them."""
        return any(
            contains(path, sub) and owns_params(n) and self.member_of(sub) == member for sub, n in self.paths.items()
        )

    def unmanaged(self) -> list[str]:
        """Modules holding parameters of their own that no unit covers (and no replicate ignores)."""
        local = self.local()
        return [p for p, n in self.paths.items() if owns_params(n) and self.member_of(p) is None and p not in local]

    def local(self) -> list[str]:
        """Modules holding parameters of their own that a replicate call was told to ignore
        (``ignored_modules``) and no fully_shard inside the ignored module takes, or whose own
        parameters a fully_shard call ignores (``ShardSpec.ignored``): their parameters stay
        plain, local tensors, their gradients are not averaged."""
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = self.comp.shard_ignored
        return [
            p
            for p, n in self.paths.items()
            if owns_params(n) and (any(contains(i, p) for i in ignored) or p in by_shards) and self.member_of(p) is None
        ]

    def synced_at_init(self, training: Training) -> tuple[list[str], bool]:
        """The modules (holding parameters of their own) whose parameters DistributedDataParallel
        broadcasts from rank 0 when it is built with ``init_sync`` (the default; "Ensures all
        DDP models start off at the same value"), and whether it broadcasts their buffers too.

        The DDP wrapper is built at the call, over the whole model: parameters and buffers. A
        replicate call builds DDP at its member's first forward, over a list of the parameters
        it manages (not the modules a replicate call ignores nor those of fully_shard units
        inside it), so buffers are not DDP's, and a member that ``training`` leaves out of every
        microbatch never builds it. None with tensor parallelism or meta-device init (whose
        values are copied in after wrapping)."""
        comp = self.comp
        if comp.tp or comp.meta_init:
            return [], False
        if comp.wrapper is Wrapper.DDP:
            return [p for p, node in self.paths.items() if owns_params(node)], True
        if comp.wrapper is not Wrapper.NONE or not comp.replicate_options.init_sync:
            return [], False
        microbatches = [(s, i) for s in range(training.steps) for i in range(training.grad_accum)]
        out = []
        for unit in (u for u in self.units if u.api == "replicate"):
            member = unit.members[0]
            if any(not any(contains(skip, member) for skip in training.skipped_at(s, i)) for s, i in microbatches):
                out += self.owned_by(unit)  # without its ignored modules (member_of)
        return out, False

    def unneeded_in_backward(self) -> list[str]:
        """The fully_shard units (their paths) whose parameters backward does not need, for
        ``set_unshard_in_backward(False)`` ("in expert cases when the user knows that all
        parameters in this FSDP module's parameter group are not needed for backward
        computation"): a unit of one module, the trainable Linear leaf that forward uses first.
        No module with parameters runs before it, so its input needs no gradient, and backward
        computes only its weight's and bias's gradients, from the saved input and the output's
        gradient. Not in a checkpoint region (its recomputation in backward runs the forward
        again), and none with tensor parallelism."""
        comp = self.comp
        order = forward_order(self.tree.root)
        if comp.tp or not order:
            return []
        first = order[0]
        node = self.paths[first]
        if not (isinstance(node, Leaf) and node.kind is LeafKind.LINEAR and not node.frozen):
            return []
        if any(contains(c, first) for c in comp.checkpoints):
            return []
        return [s.path for s in comp.shards if s.paths == (first,)]

    def regroups_input_gradients(self) -> bool:
        """Whether a fully_shard unit other than the root splits the uses of one activation:
        its input is used twice or more inside it (its module, or the first child of a block
        down from it, adds a residual; or the first leaf down from it is one that reads its
        input twice or more, :data:`REUSES_INPUT`) and again outside it (it begins the children
        of a residual block above it, whose skip adds the same tensor). That activation's gradient
        is then a sum of three or more terms, and FSDP2's per-unit backward hook adds the
        unit's own terms first, where plain autograd adds them in another order: in a low
        precision the sums round apart (bfloat16, a (2, 1)-ulp difference in the first
        layers' gradients), with nothing wrong on either side."""
        for member in (m for spec in self.comp.shards for m in spec.paths if m):
            inside = False
            node: Node = self.paths[member]
            while isinstance(node, Block):
                inside = inside or node.residual
                if not node.children:
                    break
                node = node.children[0]
            inside = inside or (isinstance(node, Leaf) and node.kind in REUSES_INPUT)
            parts = member.split(".")
            outside = any(
                isinstance(self.paths[".".join(parts[:i])], Block)
                and self.paths[".".join(parts[:i])].residual  # type: ignore[union-attr]
                and all(p == "0" for p in parts[i:])
                for i in range(len(parts))
            )
            if inside and outside:
                return True
        return False

    def ignored_by(self, member: str) -> list[str]:
        """The ignored modules the replicate call on ``member`` is given: those whose innermost
        enclosing replicate member it is."""
        out = []
        for i in self.comp.replicate_options.ignored_modules:
            above = [r for r in self.comp.replicates if is_ancestor(r, i)]
            if above and max(above, key=lambda r: r.count(".") + (r != "")) == member:
                out.append(i)
        return out

    def replicated_params(self, member: str) -> list[tuple[str, str]]:
        """(module path, parameter name) of every parameter the replicate call on ``member``
        manages, in the order replicate collects them (its modules depth first, each module's
        own parameters before its children's): the indices of the ``nn.ParameterList`` it
        hands DistributedDataParallel."""
        unit = next(u for u in self.units if u.api == "replicate" and u.members == (member,))
        return [(p, name) for p in self.owned_by(unit) for name in param_names(self.paths[p])]

    def delay_plan(self, member: str) -> tuple[str, tuple[str, ...]] | None:
        """For ``delay_all_reduce_named_params`` on the replicate call on ``member``: the module
        whose first parameter is ``param_to_hook_all_reduce``, the first trainable module the
        unit manages in forward order (whose gradient forward's later modules all feed, so it
        is ready after theirs), and the trainable modules it manages that run after it, whose
        parameters are delayed. None where there is no such later module."""
        unit = next(u for u in self.units if u.api == "replicate" and u.members == (member,))
        owned = set(self.owned_by(unit))
        order = [p for p in forward_order(self.tree.root) if p in owned and self._trainable(p)]
        if len(order) < 2:
            return None
        return order[0], tuple(order[1:])

    def _trainable(self, path: str) -> bool:
        node = self.paths[path]
        return not (isinstance(node, Leaf) and node.frozen)

    def gradient_scale(self, path: str, world_size: int) -> float:
        """What the knobs (:class:`fuzz.model.Knobs`) multiply the averaged gradient of the
        parameters the module at ``path`` holds itself by: 1 unless a fully_shard unit manages
        them; then the all-reduce hook's factor, times ``d / f`` for a gradient divide factor
        ``f`` over ``d`` data-parallel ranks (the gradient is summed over them and divided by
        ``f`` instead of ``d``)."""
        unit = self.unit_of(path)
        if unit is None or unit.api != "fully_shard":
            return 1.0
        knobs = self.comp.knobs
        scale = 1.0 if knobs.all_reduce_hook_scale is None else knobs.all_reduce_hook_scale
        if knobs.gradient_divide_factor is not None:
            scale *= (world_size // self.comp.tp_size) / knobs.gradient_divide_factor
        return scale
