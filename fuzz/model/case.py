"""Cases: one generated test case (property, world size, seed, body) and the bodies of the
training, invalid-use and pool self-test properties. Bodies of the state-dict properties are
in :mod:`fuzz.model.state_dict`. Imports only the standard library and the model.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fuzz.errors import CaseError
from fuzz.model.composition import Composition
from fuzz.model.rules import check_composition, check_mesh, check_training
from fuzz.model.training import AccumSync, Training
from fuzz.model.tree import MATRIX_LEAVES, Block, Leaf, ModuleTree, containers, has_params, iter_paths

MAX_WORLD_SIZE = 64


class FaultAction(str, enum.Enum):
    """Faults the pool's own tests inject into one rank (see :class:`FaultBody`)."""

    NONE = "none"  # every rank runs one all-reduce and reports its result
    HANG = "hang"  # only ``rank`` enters an all-reduce, so it blocks forever
    RAISE = "raise"  # ``rank`` raises, the others enter an all-reduce without it
    EXIT = "exit"  # ``rank`` calls os._exit(3)
    SIGKILL = "sigkill"  # ``rank`` kills itself with SIGKILL
    SIGSEGV = "sigsegv"  # ``rank`` segfaults
    SLEEP = "sleep"  # every rank sleeps ``seconds`` (to kill the driver mid-case)


class Body:
    """Base of case bodies: frozen dataclasses, each with a unique ``KIND`` tag in JSON.

    Subclasses register themselves; modules that define bodies outside this file are listed
    in ``BODY_MODULES`` so the decoder can find them.
    """

    KIND: ClassVar[str]
    #: What runs a body of this kind on a rank: "module:function" under fuzz._rank, imported
    #: there on first use; the function takes (case, body, ctx) and returns a JSON-able
    #: observation. A name, not an import: the model does not depend on the rank side.
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.KIND in Body.registry:
            raise TypeError(f"two case bodies share KIND {cls.KIND!r}")
        Body.registry[cls.KIND] = cls

    def validate_for(self, world_size: int) -> None:
        """Checks that need the world size; raise CaseError with a path relative to the body."""

    @property
    def size(self) -> tuple[int, int]:
        """(nodes, steps): the measure by which shrunk cases are reported."""
        return 1, 1


#: Modules that define further case bodies (imported before decoding).
BODY_MODULES: tuple[str, ...] = ("fuzz.model.state_dict", "fuzz.model.user")


@dataclass(frozen=True)
class ParityBody(Body):
    """Train a composed model and a plain reference on the same data; compare step by step."""

    KIND: ClassVar[str] = "parity"
    PROGRAM: ClassVar[str] = "fuzz._rank.parity:run_parity"
    tree: ModuleTree
    composition: Composition
    training: Training = field(default_factory=Training)

    def __post_init__(self) -> None:
        if not has_params(self.tree.root):
            raise CaseError("tree", "the tree has no parameters")
        check_composition(self.tree, self.composition)
        t = self.training
        if t.accum_sync is AccumSync.NO_ALL_REDUCE and not self.composition.mesh:
            raise CaseError("training.accum_sync", "no_all_reduce needs an HSDP (replicate, shard) mesh")
        if t.accum_sync is not AccumSync.ALWAYS and self.composition.replicates:
            raise CaseError("training.accum_sync", "replicate() has no gradient-sync switch; use always")
        check_training(self.tree, (self.composition,), t)

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size, self.training.steps

    def validate_for(self, world_size: int) -> None:
        check_mesh(self.composition, world_size)


@dataclass(frozen=True)
class MetamorphicBody(Body):
    """Train the same tree under two compositions that must not change numerics."""

    KIND: ClassVar[str] = "metamorphic"
    PROGRAM: ClassVar[str] = "fuzz._rank.parity:run_metamorphic"
    tree: ModuleTree
    composition: Composition
    variant: Composition
    training: Training = field(default_factory=Training)

    def __post_init__(self) -> None:
        if not has_params(self.tree.root):
            raise CaseError("tree", "the tree has no parameters")
        check_composition(self.tree, self.composition)
        check_composition(self.tree, self.variant, "variant")
        if self.training.accum_sync is not AccumSync.ALWAYS:
            raise CaseError("training.accum_sync", "metamorphic cases use always")
        check_training(self.tree, (self.composition, self.variant), self.training)

    @property
    def size(self) -> tuple[int, int]:
        return self.tree.size, self.training.steps

    def validate_for(self, world_size: int) -> None:
        check_mesh(self.composition, world_size)
        check_mesh(self.variant, world_size, "variant")


class Misuse(str, enum.Enum):
    """Compositions the API documents as errors; each must raise on every rank, never hang."""

    REPLICATE_AFTER_FULLY_SHARD = "replicate_after_fully_shard"  # RuntimeError "Cannot apply `replicate()`"
    UNEVEN_SHARD_DIM_1 = "uneven_shard_dim_1"  # NotImplementedError: uneven sharding on dim 1
    #: composable ``checkpoint(module, use_reentrant=True)``: NotImplementedError ("use
    #: torch.utils.checkpoint.checkpoint instead")
    CHECKPOINT_USE_REENTRANT = "checkpoint_use_reentrant"
    #: fully_shard on one module of a tied pair (embedding, head) and the other left to the
    #: root's unit: ValueError at lazy init, "Parameter ... is shared with a parameter already
    #: managed by another FSDP group. For shared/tied parameters, use fully_shard([module_a,
    #: module_b])" (torch 2.13's FSDPState._validate_no_duplicate_params; torch 2.11 raised
    #: nothing, so the strategies draw it only where torch has that check)
    TIED_ACROSS_UNITS = "tied_across_units"
    #: fully_shard on a block holding a scalar parameter (``Block.gain``, rank 0): ValueError at
    #: the call, "fully_shard doesn't support scalar parameters. Change gain to a 1D tensor with
    #: numel equal to 1" (torch 2.13's ``_verify_managed_param``)
    SCALAR_UNDER_FULLY_SHARD = "scalar_under_fully_shard"
    #: fully_shard on an nn.ModuleList / nn.ModuleDict block: ValueError at the call,
    #: "fully_shard does not support containers that do not implement forward" (torch 2.13's
    #: ``_validate_module``)
    CONTAINER_UNIT = "container_unit"


@dataclass(frozen=True)
class InvalidBody(Body):
    """Apply one documented misuse to the module at ``path``; every rank must raise."""

    KIND: ClassVar[str] = "invalid"
    PROGRAM: ClassVar[str] = "fuzz._rank.invalid:run_invalid"
    tree: ModuleTree
    misuse: Misuse
    path: str = ""

    def __post_init__(self) -> None:
        paths = self.tree.paths()
        if self.path not in paths:
            raise CaseError("path", f"{self.path!r} names no module of the tree")
        if not has_params(paths[self.path]):
            raise CaseError("path", f"{self.path!r} holds no parameters")
        if self.misuse is Misuse.UNEVEN_SHARD_DIM_1:
            sub = paths[self.path]
            matrices = [n for _, n in iter_paths(sub)] if isinstance(sub, Block) else [sub]
            if not any(isinstance(n, Leaf) and n.kind in MATRIX_LEAVES and has_params(n) for n in matrices):
                raise CaseError("path", f"{self.path!r} has no weight matrix to shard on dim 1")
        if self.misuse is Misuse.TIED_ACROSS_UNITS and (self.tree.tied is None or self.path not in self.tree.tied):
            raise CaseError("path", f"{self.path!r} is not the embedding or the head of a tied pair")
        if self.misuse is Misuse.CONTAINER_UNIT and self.path not in containers(self.tree):
            raise CaseError("path", f"{self.path!r} is no nn.ModuleList / nn.ModuleDict block")
        if self.misuse is Misuse.SCALAR_UNDER_FULLY_SHARD:
            node = paths[self.path]
            if not (isinstance(node, Block) and node.gain):
                raise CaseError("path", f"{self.path!r} is no block with a scalar parameter")

    def validate_for(self, world_size: int) -> None:
        if self.misuse is Misuse.UNEVEN_SHARD_DIM_1 and self.tree.width % world_size == 0:
            raise CaseError("tree.width", f"width={self.tree.width} divides world_size={world_size}: dim 1 is even")


@dataclass(frozen=True)
class FaultBody(Body):
    """A pool self-test: inject ``action`` into ``rank`` (see :class:`FaultAction`)."""

    KIND: ClassVar[str] = "fault"
    PROGRAM: ClassVar[str] = "fuzz._rank.programs:run_fault"
    action: FaultAction
    rank: int = 0
    seconds: float = 0.0

    def validate_for(self, world_size: int) -> None:
        if not 0 <= self.rank < world_size:
            raise CaseError("rank", f"rank={self.rank} is not a rank of world_size={world_size}")


@dataclass(frozen=True)
class Case:
    """One generated test case: which property, how many ranks, the seed, and the body."""

    property: str
    world_size: int
    seed: int
    body: Body

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise CaseError("world_size", f"world_size={self.world_size} is outside 1..{MAX_WORLD_SIZE}")
        if not 0 <= self.seed < 2**63:
            raise CaseError("seed", f"seed={self.seed} is outside 0..2**63-1")
        try:
            self.body.validate_for(self.world_size)
        except CaseError as e:
            raise CaseError(f"body.{e.path}", str(e).split(": ", 1)[1]) from None

    @builtins.property  # the field "property" shadows the builtin in this class body
    def size(self) -> tuple[int, int]:
        """(nodes, steps): the measure by which shrunk cases are reported."""
        return self.body.size
