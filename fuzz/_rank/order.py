"""The order of FSDP2's all-gathers and reduce-scatters, per rank and per microbatch, against
what the knobs document (docs/contracts.md, "Order").

Observed through torch's own observation points, nothing patched: a comm of FSDP2's custom
comm interface per unit (``set_custom_all_gather`` / ``set_custom_reduce_scatter``:
:class:`RecordingComm`, which delegates to torch's default comm, or to the suite's
``_CheckedComm`` where the ``custom_*`` knobs set one, and notes each call), module forward
hooks registered after ``fully_shard`` (so they run after FSDP2's pre-forward, which is
prepended), and the autograd engine's graph task id (an event inside ``backward`` is a backward
event). Where torch lacks the custom comm interface, or a unit cannot take one (several
parameter groups, ``set_allocate_memory_from_process_group_for_comm``), that unit's
all-gathers are not seen and the checks that need them are left out for it.

Contracts (each checked where a case uses the knob):

- ``set_modules_to_forward_prefetch``: "The prefetching runs after this module's all-gather
  copy-out": when a unit's forward starts, each of its targets has been all-gathered in this
  forward, or holds unsharded parameters already.
- ``set_modules_to_backward_prefetch``: the targets are all-gathered in backward before the
  unit's reduce-scatter (which follows its backward), or hold unsharded parameters then.
- ``set_unshard_in_backward(False)``: the unit is never all-gathered in backward.
- a unit resharded after forward is all-gathered in backward before its reduce-scatter
  (``reshard_after_forward``: "reshards parameters after forward and re-all-gathers in
  backward").
- ``set_reshard_after_backward(False)`` with ``set_is_last_backward(False)`` between
  microbatches: a unit all-gathered in a backward holds its unsharded parameters at the next
  microbatch ("the unsharded parameters do not need to be re-all-gathered before the next
  forward"), and is not all-gathered again before its next forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fuzz._rank.memory import UnitMemory, holds_unsharded, manages_params, name, param_groups, pending_gather
from fuzz.model import Composition, ShardSpec


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread."""
    return bool(torch._C._current_graph_task_id() != -1)


def comm_recordable(module: nn.Module, knobs: Any) -> bool:
    """Whether the unit ``module`` can take a recording comm: this torch has the custom comm
    interface, the unit has one parameter group (``set_custom_all_gather`` refuses several),
    and no process-group allocator is set (documented: not together with custom comms)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    if not hasattr(FSDPModule, "set_custom_all_gather") or knobs.pg_allocator:
        return False
    if not (hasattr(coll, "DefaultAllGather") and hasattr(coll, "DefaultReduceScatter")):
        return False  # nothing of torch's to delegate to
    return len(param_groups(module)) == 1


def _default_comm(kind: str) -> Any:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    return coll.DefaultAllGather() if kind == "all_gather" else coll.DefaultReduceScatter()


class RecordingComm:
    """A comm of FSDP2's interface that delegates to ``inner`` and notes each call in the
    recorder's log (and runs the recorder's check at a reduce-scatter)."""

    def __init__(self, kind: str, path: str, recorder: OrderRecorder, inner: Any) -> None:
        self.kind, self.path, self.recorder, self.inner = kind, path, recorder, inner

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.recorder.note(self.kind, self.path)
        return self.inner(*args, **kwargs)


class OrderRecorder:
    """The events of one composed model's microbatches, and the order contracts over them."""

    def __init__(
        self,
        model: nn.Module,
        comp: Composition,
        roots: list[list[ShardSpec]],
        memory: UnitMemory,
        problems: list[str],
        inner_comms: dict[tuple[str, str], Any],
        unneeded: list[str],
    ) -> None:
        self.model, self.comp, self.memory, self.problems = model, comp, memory, problems
        k = comp.knobs
        self.knobs = k
        self.unneeded = set(unneeded)
        #: (kind, unit path, in backward) per call, this microbatch
        self.log: list[tuple[str, str, bool]] = []
        self.recorded: set[str] = set()  # units whose all-gathers are seen
        self.forward_targets: dict[str, list[str]] = {}
        self.backward_targets: dict[str, list[str]] = {}
        self.left_unsharded: set[str] = set()  # by the previous backward (reshard_after_backward False)
        self.paused = False
        self.seen: set[str] = set()  # units whose forward started this microbatch
        for units in roots:
            for i, spec in enumerate(units):
                if k.forward_prefetch:
                    self.forward_targets[spec.path] = [s.path for s in units[i + 1 : i + 1 + k.forward_prefetch]]
                if k.backward_prefetch:
                    self.backward_targets[spec.path] = [s.path for s in units[max(1, i - k.backward_prefetch) : i]]
        wanted = bool(k.forward_prefetch or k.backward_prefetch or k.no_unshard_in_backward)
        wanted = wanted or k.reshard_after_backward_last
        for spec in comp.shards:
            module = model.get_submodule(spec.path)
            if wanted and comm_recordable(module, k):
                gather = inner_comms.get(("all_gather", spec.path)) or _default_comm("all_gather")
                module.set_custom_all_gather(RecordingComm("all_gather", spec.path, self, gather))  # type: ignore[operator]
                scatter = inner_comms.get(("reduce_scatter", spec.path)) or _default_comm("reduce_scatter")
                module.set_custom_reduce_scatter(RecordingComm("reduce_scatter", spec.path, self, scatter))  # type: ignore[operator]
                self.recorded.add(spec.path)
        memory.on_unit_forward.append(self._on_unit_forward)
        memory.on_backward_done.append(self._on_backward_done)

    @property
    def active(self) -> bool:
        return bool(self.recorded)

    def note(self, kind: str, path: str) -> None:
        backward = in_backward()
        if self.paused or torch.compiler.is_compiling():
            return
        if kind == "all_gather" and backward and path in self.unneeded:
            self.problems.append(f"set_unshard_in_backward(False) on {name(path)}: all-gathered in backward")
        if kind == "reduce_scatter" and backward:
            self._check_before_reduce_scatter(path)
        self.log.append((kind, path, backward))

    def _gathered(self, path: str, backward: bool) -> bool:
        return any(k == "all_gather" and p == path and b == backward for k, p, b in self.log)

    def _needs_gather(self, path: str) -> bool:
        """Whether an all-gather of the unit at ``path`` would be seen: recorded, managing
        parameters, over more than one rank."""
        module = self.model.get_submodule(path)
        return path in self.recorded and manages_params(module) and self.memory.gather_world(path) > 1

    def _held(self, path: str) -> bool:
        """Whether the unit at ``path`` holds its unsharded parameters, or has an all-gather
        issued (pending) that its next unshard waits on."""
        module = self.model.get_submodule(path)
        return holds_unsharded(module) or pending_gather(module)

    def _on_unit_forward(self, path: str) -> None:
        """A unit's forward starts (FSDP2's pre-forward done), in forward."""
        if self.paused:
            return
        for target in self.forward_targets.get(path, []):
            if not self._needs_gather(target) or self._gathered(target, False) or self._held(target):
                continue
            self.problems.append(
                f"set_modules_to_forward_prefetch on {name(path)}: {name(target)} not all-gathered when {name(path)}'s "
                "forward starts"
            )
        first, self.seen = path not in self.seen, self.seen | {path}
        if first and path in self.left_unsharded and self._gathered(path, False):
            self.problems.append(
                f"set_reshard_after_backward(False) on {name(path)}: all-gathered again before its next forward"
            )

    def _check_before_reduce_scatter(self, path: str) -> None:
        """The unit at ``path`` reduce-scatters (its backward is done): its backward-prefetch
        targets, and itself where resharded after forward, were all-gathered in backward."""
        for target in self.backward_targets.get(path, []):
            if target in self.unneeded or not self._needs_gather(target) or self._gathered(target, True):
                continue
            if self._held(target) or not self.memory.ran_whole(target):
                continue
            target_spec = next(s for s in self.comp.shards if s.path == target)
            if self.comp.reshard_after_forward(target_spec) is False:
                # Not resharded after forward, a target needs no all-gather in backward; found
                # sharded and never all-gathered there anyway, it is not triaged yet
                # (docs/contracts.md, "Narrowed").
                continue
            self.problems.append(
                f"set_modules_to_backward_prefetch on {name(path)}: {name(target)} not all-gathered before "
                f"{name(path)}'s reduce-scatter"
            )
        spec = next(s for s in self.comp.shards if s.path == path)
        resharded = self.comp.reshard_after_forward(spec) is not False
        if (
            resharded
            and not self.knobs.forward_prefetch  # a prefetch in forward may have left it pending
            and path not in self.unneeded
            and path not in self.left_unsharded
            and self.memory.ran_whole(path)
            and self._needs_gather(path)
            and not self._gathered(path, True)
        ):
            self.problems.append(
                f"{name(path)} resharded after forward, not all-gathered in backward before its reduce"
            )

    def _on_backward_done(self, resharded: bool) -> None:
        if resharded:
            self.forget_unsharded()
        else:
            self.backward_done(resharded)

    def backward_done(self, resharded: bool) -> None:
        """At the end of a backward that did not reshard, the units all-gathered in it must
        still hold their unsharded parameters (and are not all-gathered again before their
        next forward)."""
        if self.paused or resharded:
            return
        for kind, path, backward in self.log:
            if kind != "all_gather" or not backward or path in self.left_unsharded:
                continue
            if not self._held(path):
                self.problems.append(f"set_reshard_after_backward(False) on {name(path)}: resharded after backward")
            self.left_unsharded.add(path)

    def next_microbatch(self) -> None:
        """Before a microbatch: forget the last one's events (what it left unsharded stays
        known for this one's forward)."""
        self.log.clear()
        self.seen.clear()

    def forget_unsharded(self) -> None:
        """After a backward that resharded: nothing is left unsharded by it."""
        self.left_unsharded = set()
