"""Compositions: how a model is distributed (fully_shard, replicate, checkpoint, meshes, tensor
parallelism, whole-model wrappers), and the rules that keep a composition one the APIs
document. Imports only the standard library and the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fuzz.errors import CaseError
from fuzz.model.tree import Dtype


class Wrapper(str, enum.Enum):
    """Whole-model wrappers, the alternative to composable APIs."""

    NONE = "none"
    DDP = "ddp"
    FSDP1_FULL_SHARD = "fsdp1_full_shard"
    FSDP1_SHARD_GRAD_OP = "fsdp1_shard_grad_op"
    FSDP1_NO_SHARD = "fsdp1_no_shard"
    FSDP1_HYBRID_SHARD = "fsdp1_hybrid_shard"


@dataclass(frozen=True)
class MixedPrecision:
    """``MixedPrecisionPolicy``; None leaves a field at torch's default."""

    param_dtype: Dtype | None = None
    reduce_dtype: Dtype | None = None
    output_dtype: Dtype | None = None
    cast_forward_inputs: bool = True


@dataclass(frozen=True)
class ShardSpec:
    """One ``fully_shard`` call on the module at ``path`` ("" is the root), together with the
    modules at ``group`` (``fully_shard([path, *group])``).

    ``shard_dim`` is what ``shard_placement_fn`` returns for parameters whose ``shard_dim``
    splits evenly (``Shard(shard_dim)``); ``0`` means no placement function.
    """

    path: str
    reshard_after_forward: bool | int = True
    shard_dim: int = 0
    group: tuple[str, ...] = ()
    mixed_precision: MixedPrecision | None = None
    offload: bool = False  # CPUOffloadPolicy (needs an accelerator)

    def __post_init__(self) -> None:
        raf = self.reshard_after_forward
        if not isinstance(raf, bool) and raf < 2:
            raise CaseError("reshard_after_forward", f"an int must be a divisor >= 2 of the shard size, got {raf}")
        if self.shard_dim not in (0, 1):
            raise CaseError("shard_dim", f"shard_dim={self.shard_dim} must be 0 or 1")

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.group)


@dataclass(frozen=True)
class TpPair:
    """Tensor parallelism on a pair of Linear leaves of one block: ``ColwiseParallel`` on
    ``colwise``, ``RowwiseParallel`` on ``rowwise``, with only activations between them (the
    activation between the two is sharded on its last dimension, the pair's output replicated)."""

    colwise: str
    rowwise: str


@dataclass(frozen=True)
class Composition:
    """How the model is distributed.

    Composable APIs: ``checkpoint`` on ``checkpoints``, ``fully_shard`` per ``shards`` and
    ``replicate`` on ``replicates``, applied module by module from the deepest up (a module's
    checkpoint before its fully_shard when ``checkpoint_first``, else after). ``mesh`` is ()
    for a 1D mesh over all ranks or (replicate, shard) for HSDP. Or a whole-model ``wrapper``
    (DDP, FSDP1), optionally with ``auto_wrap`` (FSDP1: ModuleWrapPolicy over blocks).
    """

    shards: tuple[ShardSpec, ...] = ()
    replicates: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    checkpoint_first: bool = True
    mesh: tuple[int, ...] = ()
    wrapper: Wrapper = Wrapper.NONE
    auto_wrap: bool = False
    #: Build the model on the meta device, compose it, then ``to_empty`` and copy the seeded
    #: values in (each shard through ``distribute_tensor``); FSDP2's lazy init runs at the first
    #: forward. fully_shard / checkpoint only: replicate and the wrappers broadcast or flatten
    #: module states when applied, which meta tensors do not have.
    meta_init: bool = False
    #: Tensor parallelism: with ``tp_size`` > 1 the ranks form a (shard, tp) mesh, ranks
    #: r * tp_size ... (r + 1) * tp_size - 1 one tp group; ``parallelize_module`` applies ``tp``
    #: over the tp dimension before anything else, and fully_shard shards over the other one.
    tp: tuple[TpPair, ...] = ()
    tp_size: int = 1
    #: DDP and replicate (which runs DDP) built with ``find_unused_parameters=True``: after
    #: each forward the reducer walks the autograd graph from the outputs and marks the
    #: parameters it does not reach as ready, so a module that ran without using some of its
    #: parameters is allowed.
    find_unused: bool = False

    def __post_init__(self) -> None:
        if self.find_unused and self.wrapper is not Wrapper.DDP and not self.replicates:
            raise CaseError("find_unused", "find_unused_parameters applies to DDP and replicate only")
        if self.tp_size < 1:
            raise CaseError("tp_size", f"tp_size={self.tp_size} must be at least 1")
        if bool(self.tp) != (self.tp_size > 1):
            raise CaseError("tp", f"tp pairs ({len(self.tp)}) and tp_size={self.tp_size} go together: both or neither")
        if self.tp and (self.mesh or self.wrapper is not Wrapper.NONE or self.replicates or self.meta_init):
            raise CaseError("tp", "tensor parallelism combines with fully_shard (1D) and checkpoint only")
        if self.tp and "" not in self.sharded_paths:
            raise CaseError("tp", "tensor parallelism needs fully_shard on the root (it reduces the gradients)")
        if self.mesh and len(self.mesh) != 2:
            raise CaseError("mesh", f"mesh={self.mesh} must be () or (replicate, shard)")
        if self.wrapper is not Wrapper.NONE and (self.shards or self.replicates):
            raise CaseError("wrapper", f"wrapper={self.wrapper.value} does not combine with fully_shard / replicate")
        if self.auto_wrap and not self.wrapper.value.startswith("fsdp1"):
            raise CaseError("auto_wrap", "auto_wrap applies to FSDP1 wrappers only")
        if self.wrapper is Wrapper.FSDP1_HYBRID_SHARD and not self.mesh:
            raise CaseError("mesh", "fsdp1_hybrid_shard needs a (replicate, shard) mesh")
        if self.meta_init and (self.wrapper is not Wrapper.NONE or self.replicates):
            raise CaseError("meta_init", "meta_init applies to fully_shard / checkpoint compositions only")

    @property
    def sharded_paths(self) -> list[str]:
        return [p for spec in self.shards for p in spec.paths]

    def steps(self) -> list[tuple[str, str]]:
        """``(api, path)`` in the order they are applied: deepest module first; per module
        checkpoint (if first), fully_shard, replicate, checkpoint (if not first). A grouped
        fully_shard happens at its shallowest member's turn, after every member's descendants."""
        order = {"checkpoint": 0 if self.checkpoint_first else 3, "fully_shard": 1, "replicate": 2}
        items = [("checkpoint", p) for p in self.checkpoints] + [("replicate", p) for p in self.replicates]
        items += [("fully_shard", spec.path) for spec in self.shards]

        def key(item: tuple[str, str]) -> tuple[int, int, str]:
            api, path = item
            depth = min(q.count(".") + (q != "") for q in self._spec_paths(api, path))
            return (-depth, order[api], path)

        return sorted(items, key=key)

    def _spec_paths(self, api: str, path: str) -> tuple[str, ...]:
        if api == "fully_shard":
            return next(s.paths for s in self.shards if s.path == path)
        return (path,)
