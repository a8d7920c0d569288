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
- ``set_modules_to_backward_prefetch``: right after the unit's pre-backward (which prefetches),
  each target holds its unsharded parameters or has an all-gather pending.
- ``set_unshard_in_backward(False)``: the unit is never all-gathered in backward.
- a unit resharded after forward is all-gathered in backward before its reduce-scatter
  (``reshard_after_forward``: "reshards parameters after forward and re-all-gathers in
  backward").
- ``set_reshard_after_backward(False)`` with ``set_is_last_backward(False)`` between
  microbatches: a unit all-gathered in a backward holds its unsharded parameters at the next
  microbatch ("the unsharded parameters do not need to be re-all-gathered before the next
  forward"), and is not all-gathered again before its next forward.
- reduce-scatters in reverse order of the forward, where autograd fixes that order
  (``fully_shard``: "After gradient computation, FSDP frees the unsharded parameters and
  reduce-scatters the unsharded gradients", by a backward hook of each unit): a unit whose
  forward consumed another unit's output reduce-scatters before that unit (:class:`Flow`).
- the memory contract in backward (``fully_shard``: "frees the unsharded parameters and
  reduce-scatters"): with ``set_reshard_after_backward(True)``, at each reduce-scatter the unit
  and every unit that reduce-scattered before it in this backward hold no unsharded storage.

The reduce-scatter comm is recorded on every unit that can take one (the all-gather comm only
where a case uses an order knob), so the last two are checked on every fully_shard case.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fuzz._rank.memory import (
    UnitMemory,
    full_bytes,
    holds_unsharded,
    manages_params,
    name,
    output_tensors,
    param_groups,
    pending_gather,
    tally,
    unsharded_bytes,
)
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
        tied: bool = False,
    ) -> None:
        self.model, self.comp, self.memory, self.problems = model, comp, memory, problems
        k = comp.knobs
        self.knobs = k
        self.unneeded = set(unneeded)
        #: (kind, unit path, in backward) per call, this microbatch
        self.log: list[tuple[str, str, bool]] = []
        self.recorded: set[str] = set()  # units whose all-gathers are seen
        self.scattered: set[str] = set()  # units whose reduce-scatters are seen
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
            if not comm_recordable(module, k):
                continue
            if wanted:
                gather = inner_comms.get(("all_gather", spec.path)) or _default_comm("all_gather")
                module.set_custom_all_gather(RecordingComm("all_gather", spec.path, self, gather))  # type: ignore[operator]
                self.recorded.add(spec.path)
            scatter = inner_comms.get(("reduce_scatter", spec.path)) or _default_comm("reduce_scatter")
            module.set_custom_reduce_scatter(RecordingComm("reduce_scatter", spec.path, self, scatter))  # type: ignore[operator]
            self.scattered.add(spec.path)
        for spec in comp.shards:
            if self.backward_targets.get(spec.path) and spec.path in self.recorded:
                for member in spec.paths:
                    hook = torch.compiler.disable(self._watch_backward(spec.path))
                    model.get_submodule(member).register_forward_hook(hook)
        self.prefetch_checked: set[str] = set()
        #: the units' data flow in forward (and how often each ran), for the reduce-scatter
        #: order, which is left out where a parameter is used by two modules (a tied head: its
        #: gradient then comes from both)
        self.flow = Flow(model, comp, memory) if self.scattered else None
        self.tied = tied
        memory.on_unit_forward.append(self._on_unit_forward)
        memory.on_backward_done.append(self._on_backward_done)

    @property
    def active(self) -> bool:
        return bool(self.recorded or self.scattered)

    def note(self, kind: str, path: str) -> None:
        backward = in_backward()
        if self.paused or torch.compiler.is_compiling():
            return
        if kind == "all_gather" and backward and path in self.unneeded:
            self.problems.append(f"set_unshard_in_backward(False) on {name(path)}: all-gathered in backward")
        if kind == "reduce_scatter" and backward:
            self._check_before_reduce_scatter(path)
        self.log.append((kind, path, backward))
        if kind == "reduce_scatter" and backward:
            self._check_freed_at_reduce_scatter(path)

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
            if self._needs_gather(target):
                tally("order:forward_prefetch")
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

    def _watch_backward(self, path: str) -> Any:
        """A forward hook of a member of the unit at ``path`` (registered after fully_shard's, so
        its tensor hook on the output runs after FSDP2's pre-backward hook there, which
        prefetches): checks the backward-prefetch targets when the output's gradient arrives."""

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.paused or self.memory.disabled or in_backward() or not torch.is_grad_enabled():
                return
            for t in output_tensors(output):
                if not t.requires_grad:
                    continue
                node = t.grad_fn
                if node is not None and type(node).__name__ == "ToCopyBackward0" and node.next_functions[0][0]:
                    # fully_shard's output_dtype cast follows its pre-backward hook, which sits on
                    # the uncast output: watch there (its node's pre-hooks run after that hook)
                    node.next_functions[0][0].register_prehook(lambda grad: self._after_pre_backward(path))
                else:
                    t.register_hook(lambda grad: self._after_pre_backward(path))

        return hook

    def _after_pre_backward(self, path: str) -> None:
        """FSDP2's pre-backward of the unit at ``path`` ran (its parameter group is in
        ``PRE_BACKWARD``), once per microbatch: each backward-prefetch target that ran forward
        and needs unsharding in backward holds its unsharded parameters or has an all-gather
        pending ("explicitly prefetch all-gathers in backward")."""
        if self.paused or path in self.prefetch_checked:
            return
        groups = param_groups(self.model.get_submodule(path))
        if not groups or getattr(groups[0]._training_state, "name", None) != "PRE_BACKWARD":
            return
        self.prefetch_checked.add(path)
        for target in self.backward_targets.get(path, []):
            if target in self.unneeded or not self._needs_gather(target) or not self.memory.ran_whole(target):
                continue
            tally("order:backward_prefetch")
            if not self._held(target):
                self.problems.append(
                    f"set_modules_to_backward_prefetch on {name(path)}: {name(target)} not all-gathered before "
                    f"{name(path)}'s backward (neither holding its unsharded parameters nor an all-gather pending)"
                )

    def _check_before_reduce_scatter(self, path: str) -> None:
        """The unit at ``path`` reduce-scatters (its backward is done): where resharded after
        forward, it was all-gathered in backward."""
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

    def _check_freed_at_reduce_scatter(self, path: str) -> None:
        """At the reduce-scatter of the unit at ``path`` in a backward that reshards: it and the
        units that reduce-scattered before it in this backward (each run once in forward: a unit
        run twice is all-gathered again for its other call's backward) hold no unsharded
        storage; the rest may hold theirs (the bound: their unsharded bytes)."""
        if self.flow is None or not self.memory.reshard_after_backward or self.memory.disabled:
            return
        done = dict.fromkeys(p for k, p, b in self.log if k == "reduce_scatter" and b)
        held = {u: unsharded_bytes(self.model.get_submodule(u)) for u in done if self.flow.runs.get(u) == 1}
        if held:
            tally("memory:reduce_scatter")
        extra = sorted(u for u, b in held.items() if b and u not in self.memory.loose)
        if extra:
            rest = [u for u in self.memory.modules if u not in done]
            bound = sum(full_bytes(self.memory.modules[u]) for u in rest)
            self.problems.append(
                f"memory: at {name(path)}'s reduce-scatter, {[name(u) for u in extra]} hold "
                f"{sum(held[u] for u in extra)} bytes of unsharded parameters, reduce-scattered in this backward with "
                f"reshard_after_backward=True (the composition allows {bound} bytes: units not reduce-scattered yet)"
            )

    def _on_backward_done(self, resharded: bool) -> None:
        if self.flow is not None and not self.tied and not self.memory.disabled and not self.paused:
            scatters = [p for k, p, b in self.log if k == "reduce_scatter" and b]
            self.problems.extend(self.flow.order_problems(scatters))
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
        self.prefetch_checked.clear()
        if self.flow is not None:
            self.flow.clear()

    def forget_unsharded(self) -> None:
        """After a backward that resharded: nothing is left unsharded by it."""
        self.left_unsharded = set()


def _grad_nodes(value: Any) -> set[Any]:
    """The autograd nodes of the tensors (requiring grad, not leaves) in ``value``, a module's
    arguments or output."""
    return {t.grad_fn for t in output_tensors(value) if t.grad_fn is not None}


def _reaches(starts: set[Any], goals: set[Any]) -> set[Any]:
    """The nodes of ``goals`` reachable from ``starts`` through the autograd graph (towards the
    leaves), not walking past them."""
    found: set[Any] = set()
    seen: set[Any] = set()
    todo = list(starts)
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in goals:
            found.add(node)
            continue
        todo.extend(n for n, _ in node.next_functions)
    return found


class Flow:
    """Which unit consumed which unit's output in forward, read from the autograd graph, and the
    reduce-scatter order that follows from it.

    A unit ``b`` whose (FSDP2-wrapped) inputs were computed from unit ``a``'s output gets its
    gradients before ``a``: autograd runs ``a``'s nodes only after every node feeding them. FSDP2
    reduce-scatters a unit from the backward of the node it puts on the unit's inputs (its
    post-backward), or from the root's final callback where no input requires grad, so ``b``
    reduce-scatters before ``a`` where ``b``'s output got a gradient and depends on ``b``'s
    inputs, ``a``'s outputs depend on ``a``'s inputs (or none of them requires grad), and both ran
    forward once this microbatch (a unit run twice reduce-scatters once per call). Grouped units
    are left out."""

    def __init__(self, model: nn.Module, comp: Composition, memory: UnitMemory) -> None:
        self.memory = memory
        self.runs: dict[str, int] = {}
        self._inputs: dict[str, set[Any]] = {}
        self._outputs: dict[Any, set[str]] = {}  # node -> units whose output it is
        self._after: dict[str, set[str]] = {}  # unit -> units whose output its inputs came from
        self._closed: set[str] = set()  # units whose outputs all depend on their inputs
        self._live: set[str] = set()  # units whose output got a gradient
        for spec in comp.shards:
            if spec.group:
                continue
            module = model.get_submodule(spec.path)
            module.register_forward_pre_hook(torch.compiler.disable(self._pre(spec.path)), with_kwargs=True)
            module.register_forward_hook(torch.compiler.disable(self._post(spec.path)), always_call=True)

    def _skip(self) -> bool:
        return self.memory.paused or self.memory.disabled or in_backward() or not torch.is_grad_enabled()

    def _pre(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if self._skip():
                return
            self.runs[path] = self.runs.get(path, 0) + 1
            inputs = _grad_nodes((args, kwargs))
            self._inputs[path] = inputs
            sources = _reaches(inputs, set(self._outputs))
            self._after[path] = {u for node in sources for u in self._outputs[node]}

        return hook

    def _post(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self._skip() or self.runs.get(path) != 1:
                return
            nodes = _grad_nodes(output)
            inputs = self._inputs.get(path, set())
            if not inputs or all(_reaches({n}, inputs) for n in nodes):
                self._closed.add(path)
            for node in nodes:
                self._outputs.setdefault(node, set()).add(path)
            for t in output_tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad: self._live.add(path))

        return hook

    def order_problems(self, scatters: list[str]) -> list[str]:
        """At the end of a backward whose reduce-scatters were ``scatters`` (unit paths, in
        order): a unit reduce-scattered before a unit that consumed its output."""
        first = {p: i for i, p in reversed(list(enumerate(scatters)))}
        out = []
        for later, sources in self._after.items():
            if later not in first or later not in self._live or later not in self._closed:
                continue
            for earlier in sorted(sources):
                ran_once = self.runs.get(earlier) == 1 and self.runs.get(later) == 1
                if not (ran_once and earlier in first and earlier in self._closed):
                    continue
                tally("order:reduce_scatter")
                if first[earlier] < first[later]:
                    out.append(
                        f"reduce-scatter order: {name(earlier)} reduce-scattered before {name(later)}, whose forward "
                        f"consumed its output (reverse order of the forward: {name(later)} first)"
                    )
        return out

    def clear(self) -> None:
        self.runs.clear()
        self._inputs.clear()
        self._outputs.clear()
        self._after.clear()
        self._closed.clear()
        self._live.clear()
