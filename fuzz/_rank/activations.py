"""What activation checkpointing keeps for backward, per rank and per microbatch, against what
it documents (docs/contracts.md, "Activations").

Observed with ``torch.autograd.graph.saved_tensors_hooks`` entered around the model's forward
(from a forward pre-hook of the model, prepended, so that ``checkpoint``'s own hooks, entered
in a checkpointed module's pre-hook, are the innermost) and module hooks; nothing patched.

Contracts:

- ``checkpoint(module)``: "activation checkpointing ... instead of keeping tensors needed for
  gradient computation until they are used in gradient computation, they are recomputed": no
  tensor saved for backward during a checkpointed module's forward reaches the outer hooks
  (checkpoint's hooks take them all), and a checkpointed module whose forward used a trainable
  parameter and whose output got a gradient runs its forward again in that backward.
- selective checkpointing (``context_fn=create_selective_checkpoint_contexts(policy)``, the
  suite's policy: matmuls ``MUST_SAVE``, the rest ``PREFER_RECOMPUTE``): in the recomputation
  a ``Linear``'s output (a matmul's) is the tensor saved in forward (the same storage), and an
  elementwise activation's (ReLU, Tanh, GELU) is computed anew (another storage, while the
  forward's is kept alive here). Regions holding a fully_shard unit are left out (a known torch
  bug, ``fuzz.known.SAC_OVER_FSDP_UNIT``).
- ``early_stop`` ("If ``True``, non-reentrant checkpoint stops recomputation as soon as it has
  computed all needed Tensors"; the default): a recomputed region's forward does not run to its
  end in backward (the recomputation stops at the last tensor saved, inside the forward); with
  ``early_stop=False`` it does.
- ``preserve_rng_state`` (True, the default: "stashing and restoring the RNG state during each
  checkpoint"): a region's recomputation starts from the CPU RNG state its forward started
  from. With False nothing is checked: without restoring, the state there is whatever the
  forward left, the same as restored where nothing drew random numbers in between.

Regions nested in one another are left out of the last two (an inner region's checkpoint runs
again inside the outer one's recomputation).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fuzz._rank.memory import compiled_caller, tally
from fuzz.model import Composition, ContextFn, contains

#: Modules whose output a matmul writes (MUST_SAVE under the suite's policy) / an elementwise op.
_SAVED = (nn.Linear,)
_RECOMPUTED = (nn.ReLU, nn.Tanh, nn.GELU)


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


class ActivationRecorder:
    """Hooks on a model composed with ``checkpoint``, and its activation contracts."""

    def __init__(self, model: nn.Module, comp: Composition, problems: list[str]) -> None:
        self.model, self.comp, self.problems = model, comp, problems
        self.regions = list(comp.checkpoints)
        self.paused = False
        self.disabled = False
        self._ctx: Any = None
        self.depth: dict[str, int] = {r: 0 for r in self.regions}
        self.used: set[str] = set()  # regions whose forward used a trainable parameter
        self.got_grad: set[str] = set()
        self.recomputed: set[str] = set()
        self.saved_inside = 0  # tensors saved inside regions (all microbatches): for tests
        self.completed: set[str] = set()  # regions whose recomputation ran their forward to its end
        self.saving: set[str] = set()  # regions whose forward saved a tensor for backward
        self._rng: dict[str, list[bytes]] = {}  # CPU RNG states at each region forward's start
        opts = comp.checkpoint_options
        self.early_stop = opts.early_stop is not False  # None: the option left out, default True
        self.preserve_rng_state = opts.preserve_rng_state
        self.nested = {
            r for r in self.regions if any(o != r and (contains(o, r) or contains(r, o)) for o in self.regions)
        }
        self._forward_out: dict[int, list[torch.Tensor]] = {}
        model.register_forward_pre_hook(torch.compiler.disable(self._enter), prepend=True)
        model.register_forward_hook(torch.compiler.disable(self._exit), always_call=True)
        units = [p for s in comp.shards for p in s.paths]
        sac = comp.checkpoint_options.context_fn is not ContextFn.NONE
        for region in self.regions:
            module = model.get_submodule(region)
            module.register_forward_pre_hook(torch.compiler.disable(self._region_pre(region)))
            module.register_forward_hook(
                torch.compiler.disable(self._region_post(region)), prepend=True, always_call=True
            )
            module.register_forward_hook(torch.compiler.disable(self._region_done(region)))
            for name, sub in module.named_modules():
                if any(p.requires_grad for p in sub.parameters(recurse=False)):
                    sub.register_forward_pre_hook(torch.compiler.disable(self._use(region)))
                if sac and not any(contains(region, u) for u in units) and self._observable(sub):
                    sub.register_forward_hook(torch.compiler.disable(self._sac(f"{region}.{name}".strip("."), sub)))

    @staticmethod
    def _observable(sub: nn.Module) -> bool:
        if isinstance(sub, _SAVED):
            return True
        return isinstance(sub, _RECOMPUTED) and not getattr(sub, "inplace", False)

    def _skip(self) -> bool:
        return self.paused or self.disabled

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self._ctx is not None or _in_backward() or self._skip():
            return
        if compiled_caller():
            self.disabled = True
            return
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._ctx.__enter__()

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._ctx is None or _in_backward():
            return
        ctx, self._ctx = self._ctx, None
        ctx.__exit__(None, None, None)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        inside = [r for r, d in self.depth.items() if d > 0]
        if inside:
            self.saved_inside += 1
            self.problems.append(
                f"checkpoint on {inside[-1]!r}: a {tuple(t.shape)} {t.dtype} tensor saved for backward inside the "
                "checkpointed region"
            )
        return t

    def _region_pre(self, region: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if self._skip():
                return
            if _in_backward():
                self.recomputed.add(region)
                states = self._rng.get(region, [])
                if self.preserve_rng_state and region not in self.nested and states:
                    tally("activations:preserve_rng_state")
                if self.preserve_rng_state and region not in self.nested and states and _rng_state() not in states:
                    self.problems.append(
                        f"checkpoint preserve_rng_state=True on {region!r}: the recomputation does not start from "
                        "the CPU RNG state of the forward"
                    )
            elif torch.is_grad_enabled():
                tally("activations:nothing_saved")
                self.depth[region] += 1
                if region not in self.nested:
                    self._rng.setdefault(region, []).append(_rng_state())

        return hook

    def _region_done(self, region: str) -> Any:
        """A forward hook that runs only when the region's forward returns (not where an
        exception, checkpoint's early stop, left it)."""

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self._skip() and _in_backward():
                self.completed.add(region)

        return hook

    def _region_post(self, region: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.disabled or _in_backward() or self.depth[region] == 0:
                return
            self.depth[region] -= 1
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self.got_grad.add(region))
                if _saves(output.grad_fn, {t.grad_fn for t in args if isinstance(t, torch.Tensor)}):
                    self.saving.add(region)

        return hook

    def _use(self, region: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if not self._skip() and not _in_backward() and torch.is_grad_enabled():
                self.used.add(region)

        return hook

    def _sac(self, path: str, sub: nn.Module) -> Any:
        saved = isinstance(sub, _SAVED)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self._skip() or type(output) is not torch.Tensor or output.numel() == 0:
                return
            key = id(module)
            if not _in_backward():
                if torch.is_grad_enabled():
                    self._forward_out.setdefault(key, []).append(output)
                return
            outs = self._forward_out.get(key, [])
            if not outs:
                return
            # a module called more than once is recomputed in reverse order of its calls: any of them
            same = output.untyped_storage().data_ptr() in {t.untyped_storage().data_ptr() for t in outs}
            tally("activations:sac_must_save" if saved else "activations:sac_prefer_recompute")
            if saved and not same:
                self.problems.append(f"selective checkpoint: {path!r}'s matmul (MUST_SAVE) was recomputed")
            elif not saved and same:
                self.problems.append(
                    f"selective checkpoint: {path!r}'s {type(module).__name__} (PREFER_RECOMPUTE) was not recomputed"
                )

        return hook

    def next_microbatch(self) -> None:
        """After a microbatch's backward: each checkpointed module that used a trainable
        parameter in forward and got a gradient ran its forward again."""
        if not self.disabled:
            for region in self.regions:
                expected = region in self.used and region in self.got_grad and region in self.saving
                if expected and region not in self.recomputed:
                    self.problems.append(f"checkpoint on {region!r}: not recomputed in backward")
            for region in sorted(self.recomputed - self.nested):
                tally(f"activations:early_stop:{self.early_stop}")
                if self.early_stop and region in self.completed:
                    self.problems.append(
                        f"checkpoint early_stop=True on {region!r}: the recomputation ran the region's forward to "
                        "its end"
                    )
                elif not self.early_stop and region not in self.completed:
                    self.problems.append(
                        f"checkpoint early_stop=False on {region!r}: the recomputation stopped before the region's "
                        "forward ended"
                    )
        self.used.clear()
        self.saving.clear()
        self.completed.clear()
        self._rng.clear()
        self.got_grad.clear()
        self.recomputed.clear()
        self._forward_out.clear()
        self.depth = {r: 0 for r in self.regions}


def _saves(node: Any, stop: set[Any]) -> bool:
    """Whether an autograd node between ``node`` (a region's output's) and ``stop`` (its
    inputs') saved a tensor for backward (a ``_raw_saved_*`` field; read without unpacking it,
    which would start the recomputation). A region that saved none (additions of a parameter,
    say) has nothing to recompute: checkpoint recomputes when backward unpacks a saved tensor."""
    seen: set[Any] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n is None or n in seen or n in stop:
            continue
        seen.add(n)
        if any(name.startswith("_raw_saved_") for name in dir(n)):
            return True
        todo.extend(m for m, _ in n.next_functions)
    return False


def _rng_state() -> bytes:
    """The CPU RNG state, read without a tensor op (inside a region, selective checkpointing's
    dispatch mode would record one in forward and look it up in the recomputation)."""
    return bytes(torch.get_rng_state().numpy().tobytes())


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
