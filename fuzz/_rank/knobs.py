"""FSDPModule methods a composition calls after composing (:class:`fuzz.model.Knobs`), and the
checks of what their documentation promises that only the rank can make (the state after an
explicit unshard / reshard, the tensor an all-reduce hook is given). Violations are recorded as
messages for the judge (``contracts["knobs"]``); numerics are judged by the property.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch
from torch import nn

from fuzz._rank.activations import ActivationRecorder
from fuzz._rank.memory import TALLY, UnitMemory, freed_problem, manages_params
from fuzz._rank.memory import name as unit_name
from fuzz._rank.order import OrderRecorder
from fuzz.model import (
    Composition,
    Knobs,
    Layout,
    ModuleTree,
    ShardSpec,
    Wrapper,
    contains,
    forward_order,
    is_ancestor,
)


def fsdp_sharded(p: torch.Tensor) -> bool:
    """Whether fully_shard holds ``p`` sharded: a DTensor sharded over the mesh's shard
    dimension (a tensor-parallel parameter is a DTensor over the tp dimension alone while
    unsharded; under dp_mesh_dims an unsharded parameter is a DTensor replicated over it), or
    sharded at all on a mesh without names (an int reshard_after_forward's smaller mesh)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return False
    names = p.device_mesh.mesh_dim_names
    if names is None:
        return any(_splits(placement) for placement in p.placements)
    return "shard" in names and _splits(p.placements[names.index("shard")])


def _splits(placement: Any) -> bool:
    """A placement that splits the tensor: Shard, or _StridedShard (FSDP over TP's shard of the
    same dimension), which is no Shard subclass in every torch (2.11: ``is_shard()`` False)."""
    return not (placement.is_replicate() or placement.is_partial())


def _whole(p: torch.Tensor) -> torch.Tensor:
    """``p``'s values as one plain tensor (an unsharded parameter under dp_mesh_dims is a
    DTensor replicated on the mesh)."""
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p


def _order(spec: ShardSpec) -> tuple[int, ...]:
    return tuple(int(c) for c in spec.path.split(".")) if spec.path else ()


def by_root(comp: Composition) -> list[list[ShardSpec]]:
    """The fully_shard units under each FSDP root (a unit no other one encloses), each list in
    the order the units' forwards start (a pre-order walk of the tree, the root first).
    Prefetching stays within a root: another root's units are set up (lazily) by that root's
    first forward, and prefetching across roots is not a documented use."""
    specs = sorted(comp.shards, key=_order)
    roots = [s for s in specs if not any(o is not s and any(is_ancestor(m, s.path) for m in o.paths) for o in specs)]
    return [
        [s for s in specs if s is root or (s not in roots and any(contains(m, s.path) for m in root.paths))]
        for root in roots
    ]


def call_knob_methods(module: nn.Module, knobs: Knobs, on: str) -> None:
    """On ``module``, a fully_shard unit (``on="unit"``) or an FSDP root (``on="root"``), call the
    FSDPModule method of every knob set whose field metadata says the knob is that method
    called with its value there (``"on"``; the method is the first of ``"torch"``)."""
    for f in dataclasses.fields(knobs):
        value = getattr(knobs, f.name)
        if f.metadata.get("on") == on and value != f.default:
            getattr(module, f.metadata["torch"][0])(value)


class KnobState:
    """The knobs of one composed model: applied at construction, then driven by the training
    loop (:meth:`before_microbatch`), with the contract violations seen (:attr:`problems`).

    It also carries the order, memory and activation contracts of every fully_shard and
    checkpoint composition (:mod:`fuzz._rank.order`, :mod:`fuzz._rank.memory`,
    :mod:`fuzz._rank.activations`; docs/contracts.md), checked between microbatches
    (:meth:`before_microbatch`) and after the last one (:meth:`final_problems`)."""

    @staticmethod
    def wanted(comp: Composition) -> bool:
        """Whether a composition gets a KnobState: knobs set, or composable fully_shard or
        checkpoint (whose contracts it checks) without a wrapper."""
        return comp.knobs.is_set or (comp.wrapper is Wrapper.NONE and bool(comp.shards or comp.checkpoints))

    def __init__(self, model: nn.Module, comp: Composition, tree: ModuleTree, roots: list[nn.Module]) -> None:
        self.model = model
        self.comp = comp
        self.tree = tree
        self.knobs: Knobs = comp.knobs
        self.roots = roots
        self.problems: list[str] = []
        self._checked_unshard = False
        self._gathers: list[tuple[_CheckedComm, nn.Module]] = []
        self._scatters: list[_CheckedComm] = []
        self._inner_comms: dict[tuple[str, str], _CheckedComm] = {}
        self._ran: set[str] = set()
        self._finished = False
        TALLY.clear()
        k = self.knobs
        for units in by_root(comp):
            self._prefetch(units)
        for spec in comp.shards:
            module = model.get_submodule(spec.path)
            if k.all_reduce_hook_scale is not None:
                module.set_all_reduce_hook(self._hook(spec, k.all_reduce_hook_scale))  # type: ignore[operator]
            call_knob_methods(module, k, "unit")
            if k.custom_all_gather or k.custom_reduce_scatter:
                self._custom_comms(spec, module)
        for root in roots:
            call_knob_methods(root, k, "root")
        if k.no_unshard_in_backward:
            for path in Layout(tree, comp).unneeded_in_backward():
                module = model.get_submodule(path)
                module.set_unshard_in_backward(False)  # type: ignore[operator]
                spec = next(s for s in comp.shards if s.path == path)
                if comp.reshard_after_forward(spec) is True and path not in comp.shard_ignored:
                    module.register_forward_hook(self._sharded_in_backward(path))
        self._observe(model, comp, tree, roots)

    def _observe(self, model: nn.Module, comp: Composition, tree: ModuleTree, roots: list[nn.Module]) -> None:
        """The recorders of the order, memory and activation contracts."""
        self.memory: UnitMemory | None = None
        self.order: OrderRecorder | None = None
        self.activations: ActivationRecorder | None = None
        if comp.shards:
            groups = by_root(comp)
            k = self.knobs
            targets = {
                s.path: [t.path for t in units[i + 1 : i + 1 + k.forward_prefetch]]
                for units in groups
                for i, s in enumerate(units)
            }
            self.memory = UnitMemory(model, comp, roots, self.problems, targets)
            unneeded = Layout(tree, comp).unneeded_in_backward() if k.no_unshard_in_backward else []
            self.order = OrderRecorder(
                model, comp, groups, self.memory, self.problems, self._inner_comms, unneeded, tied=tree.tied is not None
            )
        if comp.checkpoints:
            self.activations = ActivationRecorder(model, comp, self.problems)

    def _pause(self, paused: bool) -> None:
        for recorder in (self.memory, self.order, self.activations):
            if recorder is not None:
                recorder.paused = paused

    def _next_microbatch(self, last: bool) -> None:
        """Before a microbatch's forward: the recorders forget the last microbatch (whose end
        of backward they checked) and learn whether this one's backward reshards."""
        resharded = not (self.knobs.reshard_after_backward_last and not last)
        if self.memory is not None:
            self.memory.next_microbatch(resharded)
        if self.order is not None:
            self.order.next_microbatch()
        if self.activations is not None:
            self.activations.next_microbatch()

    def _custom_comms(self, spec: ShardSpec, module: nn.Module) -> None:
        """``set_custom_all_gather`` / ``set_custom_reduce_scatter`` on the unit at
        ``spec.path``, with comms that check each call (:class:`_CheckedComm`); a forward
        pre-hook notes that the unit ran, for :meth:`final_problems`."""
        shard_size = self.comp.mesh[1] if self.comp.mesh else None
        if self.knobs.custom_all_gather:
            raf = self.comp.reshard_after_forward(spec)
            # An integer reshard_after_forward reshards to that many ranks after forward, and
            # backward all-gathers from there: over a group of that size.
            post_forward = raf if not isinstance(raf, bool) else None
            gather = _CheckedComm("all_gather", spec.path, shard_size, self.problems, post_forward)
            module.set_custom_all_gather(gather)  # type: ignore[operator]
            self._gathers.append((gather, module))
            self._inner_comms[("all_gather", spec.path)] = gather
            module.register_forward_pre_hook(lambda *_: self._ran.add(spec.path))
        if self.knobs.custom_reduce_scatter:
            scatter = _CheckedComm("reduce_scatter", spec.path, shard_size, self.problems)
            module.set_custom_reduce_scatter(scatter)  # type: ignore[operator]
            self._scatters.append(scatter)
            self._inner_comms[("reduce_scatter", spec.path)] = scatter

    def final_problems(self) -> list[str]:
        """:attr:`problems`, and after training what only the whole run shows: every unit with
        a custom all-gather that ran forward, manages parameters and shards them over more
        than one rank had its comm called (FSDP2 all-gathers such a unit's parameters before
        its forward, through the comm ``set_custom_all_gather`` set); the last microbatch's
        order, memory and activation contracts."""
        if not self._finished:
            self._finished = True
            if self.activations is not None:
                self.activations.next_microbatch()
            self.problems[:] = list(dict.fromkeys(self.problems))  # each message once
            _write_tally()
        for gather, module in self._gathers:
            if gather.calls == 0 and gather.path in self._ran and gather.world() > 1 and manages_params(module):
                self.problems.append(f"set_custom_all_gather on {gather.path!r}: the comm was never called")
        if self.knobs.separate_rs_group:
            gathered = {id(g) for gather, _ in self._gathers for g in gather.groups}
            for scatter in self._scatters:
                shared = [g for g in scatter.groups if id(g) in gathered]
                if shared:
                    self.problems.append(
                        f"set_separate_reduce_scatter_group on {scatter.path!r}: the reduce-scatter ran on the "
                        "all-gather's process group"
                    )
        return self.problems

    def _sharded_in_backward(self, path: str) -> Any:
        """A forward hook of the unit at ``path`` (resharded after forward, unshard in backward
        off): when its output's gradient arrives, its parameters must still be sharded, since
        nothing in backward may unshard them (its own pre-backward nor a prefetch)."""

        def check(module: nn.Module, args: Any, output: Any) -> None:
            if not (isinstance(output, torch.Tensor) and output.requires_grad):
                return

            def on_grad(grad: torch.Tensor) -> None:
                unsharded = [n for n, p in module.named_parameters() if not fsdp_sharded(p)]
                if unsharded:
                    self.problems.append(
                        f"set_unshard_in_backward(False) on {path!r}: {unsharded} unsharded in backward"
                    )

            output.register_hook(on_grad)

        return check

    def _prefetch(self, units: list[ShardSpec]) -> None:
        """Prefetch among the units of one FSDP root (``units`` in forward order, the root
        first): each prefetches the next ``forward_prefetch`` units in forward and the
        ``backward_prefetch`` units before it in backward (never the root, all-gathered first)."""
        k = self.knobs
        modules = [self.model.get_submodule(s.path) for s in units]
        for i, module in enumerate(modules):
            ahead = modules[i + 1 : i + 1 + k.forward_prefetch]
            if k.forward_prefetch and ahead:
                module.set_modules_to_forward_prefetch(ahead)  # type: ignore[operator]
            behind = list(reversed(modules[max(1, i - k.backward_prefetch) : i]))
            if k.backward_prefetch and behind:
                module.set_modules_to_backward_prefetch(behind)  # type: ignore[operator]

    def _hook(self, spec: ShardSpec, scale: float) -> Any:
        def hook(reduce_output: torch.Tensor) -> None:
            # Documented: the reduce-scatter output (or HSDP's all-reduce output), this rank's
            # shard of the unit's gradients, flat.
            if reduce_output.ndim != 1 or not reduce_output.is_floating_point():
                self.problems.append(
                    f"set_all_reduce_hook on {spec.path!r}: the hook got a {reduce_output.ndim}-D "
                    f"{reduce_output.dtype} tensor, not the flat reduce output"
                )
            reduce_output.mul_(scale)

        return hook

    def abort_and_reset(self, forward: Any, x: torch.Tensor, skipped: list[str]) -> None:
        """A forward aborted by an exception in the forward hook of the last module holding
        parameters that runs (not left out by ``skipped``), caught; then ``reset_iter_state()``
        on every root unit, the documented recovery, and a check that it resharded every unit.
        The aborted forward's RNG draws (dropout) are undone, so later ones match the reference."""
        order = [p for p in forward_order(self.tree.root) if not any(contains(s, p) for s in skipped)]
        inner = [p for p in order if p] or [""]
        target = self.model.get_submodule(inner[-1])

        def abort(*_: Any) -> None:
            raise _Aborted(f"abort in forward of {inner[-1]!r}")

        handle = target.register_forward_hook(abort)
        self._pause(True)
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        try:
            with torch.random.fork_rng(devices=devices):
                forward(x)
            self.problems.append(f"the forward meant to abort at {inner[-1]!r} did not raise")
        except _Aborted:
            pass
        finally:
            handle.remove()
            self._pause(False)
        for root in self.roots:
            root.reset_iter_state()  # type: ignore[operator]
        for spec in self.comp.shards:
            message = freed_problem(self.model.get_submodule(spec.path), unit_name(spec.path), "reset_iter_state()")
            if message is not None:
                self.problems.append(message)
        for root in self.roots:
            for sub, module, name in self._units_params(root):
                if not fsdp_sharded(getattr(module, name)):
                    where = f"{sub}.{name}" if sub else name
                    self.problems.append(f"after reset_iter_state(), {where} is not registered sharded")

    def _units_params(self, root: nn.Module) -> list[tuple[str, nn.Module, str]]:
        """(module path, module, attribute) of every parameter a fully_shard unit at or under
        ``root`` manages."""
        layout = Layout(self.tree, self.comp)
        top = next(p for p, m in self.model.named_modules() if m is root)
        out: list[tuple[str, nn.Module, str]] = []
        for unit in layout.units:
            if unit.api == "fully_shard" and any(contains(top, m) for m in unit.members):
                for sub in layout.owned_by(unit):
                    module = self.model.get_submodule(sub)
                    out += [(sub, module, name) for name, _ in module.named_parameters(recurse=False)]
        return out

    def before_microbatch(self, first: bool, last: bool) -> None:
        """Called before each microbatch's forward (after the previous one's backward)."""
        k = self.knobs
        self._next_microbatch(last)
        if k.reshard_after_backward_last:
            for root in self.roots:
                root.set_reshard_after_backward(last)  # type: ignore[operator]
                root.set_is_last_backward(last)  # type: ignore[operator]
        if k.explicit_unshard:
            if first and not self._checked_unshard:
                self._checked_unshard = True
                self._check_unshard_reshard()
            for root in self.roots:
                root.unshard(async_op=True)  # type: ignore[operator]

    def _own_params(self, root: nn.Module) -> list[tuple[str, nn.Module, str]]:
        """(module path, module, attribute) of the parameters ``root``'s unit manages itself."""
        layout = Layout(self.tree, self.comp)
        path = next(p for p, m in self.model.named_modules() if m is root)
        unit = layout.unit_of(path)
        out: list[tuple[str, nn.Module, str]] = []
        if unit is None:
            return out
        for sub in layout.owned_by(unit):
            module = self.model.get_submodule(sub)
            out += [(sub, module, name) for name, _ in module.named_parameters(recurse=False)]
        return out

    def _check_unshard_reshard(self) -> None:
        """unshard(async_op=True) and wait(): the unit's parameters are registered unsharded,
        full size, with the sharded ones' values (in param_dtype); reshard(): sharded again."""
        for root in self.roots:
            own = self._own_params(root)
            full = {}
            for sub, module, name in own:
                p = getattr(module, name)
                full[(sub, name)] = p.full_tensor().detach().clone() if fsdp_sharded(p) else None
            handle = root.unshard(async_op=True)  # type: ignore[operator]
            if handle is None:
                self.problems.append("unshard(async_op=True) returned None, not a handle")
            else:
                handle.wait()
            for sub, module, name in own:
                p = getattr(module, name)
                where = f"{sub}.{name}" if sub else name
                expected = full[(sub, name)]
                if expected is None:
                    continue
                if fsdp_sharded(p):
                    self.problems.append(f"after unshard() and wait(), {where} is still registered sharded")
                elif tuple(p.shape) != tuple(expected.shape):
                    self.problems.append(
                        f"after unshard(), {where} has shape {tuple(p.shape)}, not {tuple(expected.shape)}"
                    )
                elif not torch.equal(_whole(p).detach().cpu(), expected.to(p.dtype).cpu()):
                    self.problems.append(f"after unshard(), {where} differs from its sharded values")
            root.reshard()  # type: ignore[operator]
            if (message := freed_problem(root, "the root unit", "reshard()")) is not None:
                self.problems.append(message)
            for sub, module, name in own:
                if full[(sub, name)] is not None and not fsdp_sharded(getattr(module, name)):
                    where = f"{sub}.{name}" if sub else name
                    self.problems.append(f"after reshard(), {where} is not registered sharded")


def _write_tally() -> None:
    """Where ``SHARDFUZZ_CONTRACT_TALLY`` names a file, append the contract checks this case
    evaluated (rank 0; a measurement of the share of cases carrying each check)."""
    import torch.distributed as dist

    path = os.environ.get("SHARDFUZZ_CONTRACT_TALLY")
    if path and (not dist.is_initialized() or dist.get_rank() == 0):
        with open(path, "a") as f:
            f.write(json.dumps(sorted(TALLY)) + "\n")


class _CheckedComm:
    """A comm of FSDP2's interface (``torch.distributed.fsdp._fully_shard._fsdp_api.Comm``:
    ``allocate``, and ``__call__`` as ``AllGather`` or ``ReduceScatter``) that performs the
    default collective and records what the interface promises it: the tensors it communicates
    come from its own ``allocate`` (the all-gather's output; the reduce-scatter's input and
    output), and ``group`` is the unit's shard group (``shard_size`` ranks, None: every rank), or
    for an all-gather after forward with an integer ``reshard_after_forward``, a group of
    ``post_forward`` ranks."""

    def __init__(
        self, kind: str, path: str, shard_size: int | None, problems: list[str], post_forward: int | None = None
    ) -> None:
        self.kind, self.path, self.shard_size, self.problems = kind, path, shard_size, problems
        self.post_forward = post_forward
        self.calls = 0
        #: The process groups it was called with (kept alive with the comm).
        self.groups: list[Any] = []
        self._allocated: set[int] = set()

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        out = torch.empty(size, dtype=dtype, device=device)
        self._allocated.add(out.untyped_storage().data_ptr())
        return out

    def world(self) -> int:
        import torch.distributed as dist

        return self.shard_size if self.shard_size is not None else dist.get_world_size()

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any = None,
        async_op: bool = False,
    ) -> Any:
        import torch.distributed as dist

        self.calls += 1
        if not any(g is group for g in self.groups):
            self.groups.append(group)
        where = f"set_custom_{self.kind} on {self.path!r}"
        ours = (
            {"output": output_tensor} if self.kind == "all_gather" else {"input": input_tensor, "output": output_tensor}
        )
        for name, t in ours.items():
            if t.untyped_storage().data_ptr() not in self._allocated:
                self.problems.append(f"{where}: the {name} tensor is not one the comm's allocate returned")
        want = self.world()
        if group.size() != want and group.size() != self.post_forward:
            also = f" nor the {self.post_forward} ranks of reshard_after_forward" if self.post_forward else ""
            self.problems.append(
                f"{where}: called with a group of {group.size()} ranks, not the shard group of {want}{also}"
            )
        if self.kind == "all_gather":
            gather = getattr(dist, "all_gather_single", None)
            if gather is not None:
                return gather(output_tensor, input_tensor, group=group, async_op=async_op)
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        scatter = getattr(dist, "reduce_scatter_single", None)
        if scatter is not None:
            return scatter(output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op)
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


class _Aborted(RuntimeError):
    """The exception that aborts a forward for ``abort_and_reset``."""
