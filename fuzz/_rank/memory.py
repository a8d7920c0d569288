"""What FSDP2 holds unsharded, per unit and per point of a microbatch, against what it documents
(docs/contracts.md, "Memory"), and the unit bookkeeping the order contracts share
(:class:`UnitMemory`).

A unit holds unsharded parameters when the storage its all-gather wrote them into is allocated:
``untyped_storage().size()`` of each FSDP parameter's all-gather outputs (the unsharded
parameter is a view of them; ``reshard`` frees them by resizing the storage to 0). Read from the
unit's FSDP state (``_get_fsdp_state()``: its parameter groups' ``fsdp_params``, torch 2.11 and
2.13), never changed.

Contracts:

- every unit holds its unsharded parameters when its forward starts (after FSDP2's pre-forward:
  "all-gathers" them);
- at each unit's forward start, only the documented units hold unsharded parameters: the unit,
  the units whose forward has started and not ended, the units that ended with
  ``reshard_after_forward=False`` ("keeps the unsharded parameters in memory after forward"),
  forward-prefetch targets, and what was held when the microbatch started; the bytes held are
  bounded by those units' unsharded bytes (the memory contract);
- after the root's forward, a unit that ran with ``reshard_after_forward`` True or an int holds
  no unsharded storage ("reshards parameters after forward"; an int: "the parameters resharded
  to the smaller mesh"), and one with False still holds it;
- at the end of a backward with ``set_reshard_after_backward(True)`` (the default), no unit of
  a root whose backward ran holds unsharded storage;
- after ``reshard()`` ("freeing the unsharded parameters if they are allocated") and after
  ``reset_iter_state()`` ("reshards every parameter group"), the unit holds none
  (:func:`freed_problem`, called from :mod:`fuzz._rank.knobs`).
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fuzz.model import Composition, ShardSpec, contains

#: How often each contract check was evaluated since the case's contract state was built (a
#: measurement of which cases carry which check: ``KnobState`` writes the names it saw where
#: ``SHARDFUZZ_CONTRACT_TALLY`` names a file; nothing else reads it).
TALLY: Counter[str] = Counter()


def tally(check: str) -> None:
    """Note that the contract check ``check`` was evaluated (whether or not it found anything)."""
    TALLY[check] += 1


def name(path: str) -> str:
    """A unit's path as messages write it."""
    return repr(path) if path else "the root"


def param_groups(module: nn.Module) -> list[Any]:
    """The FSDP parameter groups of the unit ``module`` (torch before per-parameter meshes:
    one group or none)."""
    state = module._get_fsdp_state()  # type: ignore[operator]
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


def manages_params(module: nn.Module) -> bool:
    """Whether the unit ``module`` manages parameters of its own."""
    return any(g.fsdp_params for g in param_groups(module))


def _storages(fsdp_param: Any) -> list[torch.Tensor]:
    return list(
        itertools.chain(
            getattr(fsdp_param, "all_gather_outputs", []), getattr(fsdp_param, "_unsharded_inner_tensors", [])
        )
    )


def unsharded_bytes(module: nn.Module) -> int:
    """Bytes of unsharded parameter storage the unit ``module`` holds now."""
    return sum(t.untyped_storage().size() for g in param_groups(module) for fp in g.fsdp_params for t in _storages(fp))


def holds_unsharded(module: nn.Module) -> bool:
    """Whether every FSDP parameter of the unit ``module`` has its unsharded storage allocated
    (False for a unit without parameters)."""
    params = [fp for g in param_groups(module) for fp in g.fsdp_params]
    return bool(params) and all(any(t.untyped_storage().size() > 0 for t in _storages(fp)) for fp in params)


def pending_gather(module: nn.Module) -> bool:
    """Whether an all-gather of the unit ``module`` was issued and not waited on yet (a prefetch
    whose target has not run: its next unshard waits on it instead of all-gathering again)."""
    return any(getattr(g, "_all_gather_result", None) is not None for g in param_groups(module))


def full_bytes(module: nn.Module) -> int:
    """Bytes the unit's parameters take unsharded (in the dtype it all-gathers them in)."""
    total = 0
    for g in param_groups(module):
        for fp in g.fsdp_params:
            dtype = getattr(fp, "param_dtype", None) or getattr(fp, "orig_dtype", torch.float32)
            total += int(torch.Size(fp._orig_size).numel()) * torch.empty((), dtype=dtype).element_size()
    return total


def freed_problem(module: nn.Module, where: str, after: str) -> str | None:
    """A message if the unit ``module`` still holds unsharded storage ``after`` a call."""
    held = unsharded_bytes(module)
    if held:
        return f"after {after}, {where} still holds {held} bytes of unsharded parameter storage"
    return None


def offload_problems(module: nn.Module, where: str) -> list[str]:
    """``CPUOffloadPolicy`` on the unit ``module`` whose compute device is an accelerator: its
    sharded parameters and their gradients are on the CPU ("offloads parameters, gradients, and
    optimizer states to CPU"), the parameters pinned where ``pin_memory`` (the default: "Whether
    to pin sharded parameter and gradient memory"; a gradient copied back synchronously, when it
    accumulates, is not pinned, so gradients are not asked to be). On a CPU device every tensor
    is on the CPU: nothing to check there."""
    out: list[str] = []
    for group in param_groups(module):
        if getattr(group, "device", torch.device("cpu")).type == "cpu":
            continue
        for fp in group.fsdp_params:
            if not getattr(fp, "offload_to_cpu", False):
                continue
            param = fp.sharded_param
            grad = param.grad
            for what, t in (("parameter", param), ("gradient", grad)):
                local = getattr(t, "_local_tensor", t)
                if local is None:
                    continue
                if local.device.type != "cpu":
                    out.append(f"CPUOffloadPolicy on {where}: a sharded {what} ({fp._param_fqn}) on {local.device}")
                elif getattr(fp, "pin_memory", False) and local.numel() and not local.is_pinned():
                    out.append(
                        f"CPUOffloadPolicy(pin_memory=True) on {where}: a sharded {what} ({fp._param_fqn}) not pinned"
                    )
    return out


def compiled_caller() -> bool:
    """Whether the forward on the stack was called through ``torch.compile`` (an
    ``OptimizedModule``): Dynamo traces the hooks there, and the checks here are left out."""
    frame = sys._getframe(1)
    while frame is not None:
        if type(frame.f_locals.get("self")).__name__ == "OptimizedModule":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class UnitMemory:
    """Per microbatch: which units' forwards started and ended, and the memory contracts."""

    def __init__(
        self,
        model: nn.Module,
        comp: Composition,
        roots: list[nn.Module],
        problems: list[str],
        forward_targets: dict[str, list[str]],
    ) -> None:
        self.model, self.comp, self.problems = model, comp, problems
        self.specs: dict[str, ShardSpec] = {s.path: s for s in comp.shards}
        self.modules = {s.path: model.get_submodule(s.path) for s in comp.shards}
        self.root_paths = {next(p for p, m in model.named_modules() if m is r): r for r in roots}
        self.on_unit_forward: list[Callable[[str], None]] = []
        self.paused = False
        self.disabled = False  # a compiled model: nothing checked
        self.started: set[str] = set()  # member paths whose forward started this microbatch
        self.pending: dict[str, set[str]] = {}  # unit -> members whose forward has not ended, this pass
        self.ended: set[str] = set()  # unit paths whose forward ended (every member) this microbatch
        self.at_start: set[str] = set()  # units holding unsharded storage when the microbatch started
        self.backward_ran: set[str] = set()  # root paths whose output got a gradient, this microbatch
        #: set_reshard_after_backward's value for this microbatch's backward (KnobState sets it)
        self.reshard_after_backward = True
        #: called at the end of each backward that reached a root, after FSDP2's own end of backward
        self.on_backward_done: list[Callable[[bool], None]] = []
        self.prefetched: set[str] = set()
        self.peak_bytes = 0
        self._worlds: dict[str, int] = {}
        self._forward_targets = forward_targets
        #: grouped units whose forward passes are counted as FSDP2 counts them only where torch
        #: completes a partly run group at the root's post-forward (2.13); before that, a group
        #: a member of which runs more often than the others may stay unsharded without bound,
        #: and such units are always allowed (not checked)
        self._completes = _completes_partial_groups()
        self.loose = set() if self._completes else {p for p, s in self.specs.items() if s.group}
        for spec in comp.shards:
            for member in spec.paths:
                m = model.get_submodule(member)
                m.register_forward_pre_hook(torch.compiler.disable(self._pre(spec.path, member)))
                m.register_forward_hook(torch.compiler.disable(self._post(spec.path, member)), always_call=True)
        for path, root in self.root_paths.items():
            root.register_forward_hook(torch.compiler.disable(self._root_post(path)))

    def gather_world(self, path: str) -> int:
        """The size of the group the unit at ``path`` all-gathers over in forward (1: no
        collective)."""
        if path not in self._worlds:
            groups = param_groups(self.modules[path])
            info = groups[0].mesh_info if groups else None
            self._worlds[path] = int(getattr(info, "shard_mesh_size", 1)) if info is not None else 1
        return self._worlds[path]

    def ran_whole(self, path: str) -> bool:
        """Whether every member of the unit at ``path`` ran forward this microbatch."""
        return all(m in self.started for m in self.specs[path].paths)

    def _skip(self) -> bool:
        if self.paused or self.disabled:
            return True
        if not self.started and compiled_caller():  # once per microbatch
            self.disabled = True
        return self.disabled or bool(torch._C._current_graph_task_id() != -1)

    def _pre(self, unit: str, member: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if self._skip():
                return
            self.started.add(member)
            first = not self.pending.get(unit)
            if first:  # as FSDP2 counts a (grouped) unit's forward: until every member's ends
                self.pending[unit] = set(self.specs[unit].paths)
                self.ended.discard(unit)
                self._at_forward(unit)
                for callback in self.on_unit_forward:
                    callback(unit)

        return hook

    def _post(self, unit: str, member: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            pending = self.pending.get(unit)
            if self.paused or self.disabled or not pending or member not in pending:
                return
            if torch._C._current_graph_task_id() != -1:
                return
            pending.discard(member)
            if not pending:
                self.ended.add(unit)

        return hook

    def _root_post(self, root: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self._skip():
                return
            if self._completes:  # torch completed the groups partly run (``_force_complete_incomplete_states``)
                for unit in self._under(root):
                    if self.pending.get(unit):  # its post-forward ran there: it ended as any other
                        self.ended.add(unit)
                    self.pending[unit] = set()
            self._after_root_forward(root)
            for t in output_tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad: self._backward_reached(root))

        return hook

    def _under(self, root: str) -> list[str]:
        return [p for p in self.specs if contains(root, p)]

    def _at_forward(self, unit: str) -> None:
        """The unit's forward starts: it holds its unsharded parameters, and only documented
        units hold any."""
        module = self.modules[unit]
        tally("memory:forward")
        if manages_params(module) and not holds_unsharded(module):
            self.problems.append(f"{name(unit)} does not hold its unsharded parameters when its forward starts")
        self.prefetched.update(self._forward_targets.get(unit, []))
        allowed = {unit} | self.at_start | self.prefetched | self.loose
        allowed |= {u for u, members in self.pending.items() if members}
        allowed |= {u for u in self.ended if self.comp.reshard_after_forward(self.specs[u]) is False}
        held = {u: unsharded_bytes(m) for u, m in self.modules.items()}
        total = sum(held.values())
        self.peak_bytes = max(self.peak_bytes, total)
        extra = sorted(u for u, b in held.items() if b and u not in allowed)
        if extra:
            bound = sum(full_bytes(self.modules[u]) for u in allowed)
            names = [name(u) for u in sorted(allowed)]
            self.problems.append(
                f"memory: when {name(unit)}'s forward starts, {[name(u) for u in extra]} hold unsharded parameters "
                f"({total} bytes held, the composition allows {bound} bytes: units {names})"
            )

    def _after_root_forward(self, root: str) -> None:
        for unit in self._under(root):
            if unit not in self.ended or unit in self.loose:
                continue
            module = self.modules[unit]
            raf = self.comp.reshard_after_forward(self.specs[unit])
            if raf is False:
                if manages_params(module) and not holds_unsharded(module):
                    self.problems.append(
                        f"reshard_after_forward=False on {name(unit)}: unsharded parameters freed after forward"
                    )
            elif (
                message := freed_problem(module, name(unit), f"forward with reshard_after_forward={raf}")
            ) is not None:
                self.problems.append(message)

    def _backward_reached(self, root: str) -> None:
        """The root's output got its gradient: at the end of this backward (a callback that the
        autograd engine runs after the callbacks queued before it, FSDP2's end of backward
        among them, since that one is queued by FSDP2's pre-backward hook), check the state."""
        if root in self.backward_ran:
            return
        self.backward_ran.add(root)
        from torch.autograd import Variable

        def done() -> None:
            Variable._execution_engine.queue_callback(lambda: self._backward_done(root))

        Variable._execution_engine.queue_callback(done)

    def _backward_done(self, root: str) -> None:
        """After a backward: with ``set_reshard_after_backward(True)`` no unit of the root holds
        unsharded storage."""
        if self.disabled or self.paused:
            return
        for unit in self._under(root):
            if self.specs[unit].offload:
                tally("memory:offload")
                self.problems.extend(offload_problems(self.modules[unit], name(unit)))
        if self.reshard_after_backward:
            tally("memory:after_backward")
            for unit in self._under(root):
                message = freed_problem(self.modules[unit], name(unit), "backward with reshard_after_backward=True")
                if message is not None:
                    self.problems.append(message)
        for callback in self.on_backward_done:
            callback(self.reshard_after_backward)

    def next_microbatch(self, reshard_after_backward: bool) -> None:
        """Before a microbatch whose backward reshards as given: forget the last one."""
        self.started.clear()
        self.pending.clear()
        self.ended.clear()
        self.backward_ran.clear()
        self.prefetched.clear()
        self.at_start = {u for u, m in self.modules.items() if unsharded_bytes(m)}
        self.reshard_after_backward = reshard_after_backward


def _completes_partial_groups() -> bool:
    """Whether this torch reshards a grouped unit some of whose members did not run (or ran
    fewer times) from the root's post-forward (``FSDPState._force_complete_incomplete_states``,
    torch 2.13 and later)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return hasattr(FSDPState, "_force_complete_incomplete_states")


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (or arguments): nested in tuples, lists and dicts."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in output_tensors(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in output_tensors(v)]
    return []
