"""Training schedules: optimizer, steps, microbatches, forwards per backward, modules skipped
on some microbatches, leaves unfrozen between steps, parameters re-initialised after composing,
compile; and the rules per API that keep a schedule one the
APIs support. Imports only the standard library and the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fuzz.errors import CaseError
from fuzz.model.tree import Dtype, ModuleTree, has_params

MAX_STEPS = 16
MAX_FORWARDS = 3


class AccumSync(str, enum.Enum):
    """What happens to gradient reduction on the microbatches before a step's last one."""

    ALWAYS = "always"  # reduce after every microbatch
    NO_GRAD_SYNC = "no_grad_sync"  # set_requires_gradient_sync(False) (FSDP2) / no_sync() (FSDP1, DDP)
    NO_ALL_REDUCE = "no_all_reduce"  # set_requires_all_reduce(False): HSDP reduce-scatters, skips the all-reduce


class Optimizer(str, enum.Enum):
    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"


class Compile(str, enum.Enum):
    """``torch.compile`` of the composed model (never of the reference), with a backend that keeps
    CPU runs fast: ``eager`` (Dynamo only), ``aot_eager`` (Dynamo and AOTAutograd)."""

    NONE = "none"
    EAGER = "eager"
    AOT_EAGER = "aot_eager"


@dataclass(frozen=True)
class Skip:
    """The module at ``path`` is not called on microbatch ``microbatch`` of step ``step``: its
    parent block passes the activation on unchanged, so its parameters get no gradient there."""

    path: str
    step: int
    microbatch: int = 0


@dataclass(frozen=True)
class Unfreeze:
    """The frozen leaf at ``path`` gets ``requires_grad_(True)`` before step ``step`` (>= 1), after
    the first forward; the optimizer holds its parameters from the start."""

    path: str
    step: int


class ReinitHow(str, enum.Enum):
    """How user code re-initialises a module's own parameters after composing, under
    ``torch.no_grad()`` (:class:`Reinit`)."""

    #: ``p.mul_(REINIT_SCALE)`` in place (as GPT-2 scales its residual projections after
    #: construction), on whatever the module registers: a DTensor shard, an FSDP1 view.
    SCALE = "scale"
    #: ``nn.init.constant_(p, REINIT_CONSTANT)`` in place (as an adapter zeroes its up-projection).
    CONSTANT = "constant"
    #: A new ``nn.Parameter`` of ``REINIT_SCALE`` times the registered one set on the module
    #: (``setattr``), as adapters swap weights: fully_shard picks a replaced sharded parameter up
    #: at its lazy init ("Users may change or register parameters after construction time").
    REPLACE = "replace"


#: The factor and the value of :class:`ReinitHow`'s re-initialisations.
REINIT_SCALE = 0.5
REINIT_CONSTANT = 0.05


@dataclass(frozen=True)
class Reinit:
    """Before the first step, after composing, user code re-initialises the parameters the
    module at ``path`` holds as its own (a leaf's, parts included; a block's bare ones)."""

    path: str
    how: ReinitHow = ReinitHow.SCALE


@dataclass(frozen=True)
class Training:
    optimizer: Optimizer = Optimizer.SGD
    lr: float = 0.1
    momentum: float = 0.0
    #: Adam's eps. Near a zero gradient Adam's update g / (sqrt(v) + eps) has gain 1 / eps, so a
    #: gradient that is zero in exact arithmetic but rounding noise in practice (a LayerNorm of
    #: width 1, a bias before a LayerNorm) turns into a step whose size depends on summation
    #: order. The strategies keep eps >= 1e-4 and pair Adam with float64 (see fuzz.tolerance).
    eps: float = 1e-3
    steps: int = 2
    batch_per_rank: int = 2
    #: Parameter dtype of both the composed model and the reference.
    dtype: Dtype = Dtype.FLOAT32
    #: Microbatches per optimizer step, and what reduction does on all but the last.
    grad_accum: int = 1
    accum_sync: AccumSync = AccumSync.ALWAYS
    #: zero_grad(set_to_none=...).
    set_to_none: bool = True
    #: Every rank trains on the same slice (else each on its own slice of the global batch).
    same_input: bool = False
    #: 2: a second parameter group (every other trainable parameter) with half the lr.
    param_groups: int = 1
    #: The optimizer's ``foreach``; None is torch's default (foreach on CUDA, a loop on CPU).
    foreach: bool | None = None
    #: Modules left out of forward on some microbatches (parameters unused there). Which
    #: compositions and optimizers may take them: :func:`check_training`.
    skips: tuple[Skip, ...] = ()
    #: Frozen leaves unfrozen between steps (see :func:`check_training`).
    unfreeze: tuple[Unfreeze, ...] = ()
    compile: Compile = Compile.NONE
    #: ``clip_grad_norm_(parameters, max_norm)`` after each step's gradients are complete (the
    #: reference's averaged, the composed model's reduced: over DTensors for fully_shard,
    #: FSDP1's own ``clip_grad_norm_`` method for its wrapper), before the optimizer steps.
    clip_grad_norm: float | None = None
    #: After each optimizer step, ``model.eval()`` and one forward of the step's first
    #: microbatch under ``torch.inference_mode()``, its loss recorded; then ``model.train()``.
    eval_forward: bool = False
    #: Forwards per microbatch before its one backward, each over a batch of its own, their
    #: losses summed (as DPO-style training runs a chosen and a rejected batch): every module
    #: runs ``forwards`` times before the backward that reduces its gradients.
    forwards: int = 1
    #: Parameters re-initialised or replaced by user code after composing (see
    #: :func:`fuzz.model.check_training` for what each API takes).
    reinit: tuple[Reinit, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.forwards <= MAX_FORWARDS:
            raise CaseError("forwards", f"forwards={self.forwards} is outside 1..{MAX_FORWARDS}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise CaseError("steps", f"steps={self.steps} is outside 1..{MAX_STEPS}")
        if not 1 <= self.batch_per_rank <= 64:
            raise CaseError("batch_per_rank", f"batch_per_rank={self.batch_per_rank} is outside 1..64")
        if not 0.0 < self.lr <= 1.0:
            raise CaseError("lr", f"lr={self.lr} is outside (0, 1]")
        if not 0.0 <= self.momentum < 1.0:
            raise CaseError("momentum", f"momentum={self.momentum} is outside [0, 1)")
        if self.eps <= 0.0:
            raise CaseError("eps", f"eps={self.eps} must be positive")
        if self.dtype not in (Dtype.FLOAT32, Dtype.FLOAT64):
            raise CaseError("dtype", f"dtype={self.dtype.value}: low precision comes from a MixedPrecision policy")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0.0:
            raise CaseError("clip_grad_norm", f"clip_grad_norm={self.clip_grad_norm} must be positive")
        if not 1 <= self.grad_accum <= 4:
            raise CaseError("grad_accum", f"grad_accum={self.grad_accum} is outside 1..4")
        if self.param_groups not in (1, 2):
            raise CaseError("param_groups", f"param_groups={self.param_groups} must be 1 or 2")
        for i, skip in enumerate(self.skips):
            if not 0 <= skip.step < self.steps:
                raise CaseError(
                    f"skips[{i}].step", f"step={skip.step} is outside 0..{self.steps - 1} (steps={self.steps})"
                )
            if not 0 <= skip.microbatch < self.grad_accum:
                raise CaseError(
                    f"skips[{i}].microbatch",
                    f"microbatch={skip.microbatch} is outside 0..{self.grad_accum - 1} (grad_accum={self.grad_accum})",
                )
            if skip in self.skips[:i]:
                raise CaseError(f"skips[{i}]", f"{skip.path!r} at step {skip.step}, microbatch {skip.microbatch} twice")
        for i, later in enumerate(self.unfreeze):
            if not 1 <= later.step < self.steps:
                raise CaseError(
                    f"unfreeze[{i}].step",
                    f"step={later.step} is outside 1..{self.steps - 1}: a leaf is unfrozen after a first step",
                )
            if any(u.path == later.path for u in self.unfreeze[:i]):
                raise CaseError(f"unfreeze[{i}].path", f"{later.path!r} is unfrozen twice")
        for i, again in enumerate(self.reinit):
            if any(r.path == again.path for r in self.reinit[:i]):
                raise CaseError(f"reinit[{i}].path", f"{again.path!r} is re-initialised twice")

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        """The paths left out of forward on ``microbatch`` of ``step``."""
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

    def unused_on_some_microbatches(self, tree: ModuleTree) -> bool:
        """True if a module holding parameters is left out of some but not all microbatches of a
        step: its gradient is accumulated over a subset of them."""
        paths = tree.paths()
        for s in self.skips:
            if has_params(paths[s.path]) and any(
                s.path not in self.skipped_at(s.step, m) for m in range(self.grad_accum)
            ):
                return True
        return False


def mixed_precision_comparable(training: Training) -> bool:
    """Whether a reference can apply a MixedPrecisionPolicy's casts by hand for this schedule:
    any gradient sync schedule (every microbatch reduces; or the ones before a step's last do
    not reduce at all, ``set_requires_gradient_sync(False)``, and FSDP2 accumulates those
    gradients unreduced, in the reduce dtype where one is set; or on an HSDP mesh they skip
    only the all-reduce, ``set_requires_all_reduce(False)``, and FSDP2 keeps the sum of their
    reduce-scattered gradients in the reduce dtype); no module left out or unfrozen (known
    bugs of their own under mixed precision), no compile."""
    return not training.skips and not training.unfreeze and training.compile is Compile.NONE
