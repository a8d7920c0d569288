"""The activation contracts (fuzz/_rank/activations.py): checkpoint() keeps no activation of
its region and recomputes it; selective checkpointing keeps its MUST_SAVE matmuls and
recomputes the rest. On ranks (cases pass on unmutated torch, each contract notices its fault,
tests/faults/C05, C06) and in this process (the recorder on a plain model: no collective)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fuzz.explore import run_case
from fuzz.model import CheckpointOptions, Composition, ContextFn, ShardSpec
from fuzz.properties import get_property
from tests.conftest import fault_env, fault_pool
from tests.contract_cases import FAULT_CASES

ACTIVATIONS = {
    "C05_checkpoint_region_not_checkpointed": "checkpoint on '1': a (2, 4) torch.float32 tensor saved for backward",
    "C06_sac_must_save_recomputed": "selective checkpoint: '1.0''s matmul (MUST_SAVE) was recomputed",
    "C09_checkpoint_early_stop_ignored": "checkpoint early_stop=True on '1': the recomputation ran",
    "C10_sac_prefer_recompute_saved": "selective checkpoint: '1.1''s ReLU (PREFER_RECOMPUTE) was not recomputed",
    "C11_checkpoint_rng_state_not_restored": "preserve_rng_state=True on '1': the recomputation does not start",
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_cases_pass_on_unmutated_torch(check_case: Any, name: str) -> None:
    check_case(FAULT_CASES[name]())


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_each_activation_contract_notices_its_fault(name: str) -> None:
    case = FAULT_CASES[name]()
    with fault_pool(fault_env(name), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None, name
    assert failure.kind == "mismatch", failure.summary
    assert ACTIVATIONS[name] in failure.summary, failure.summary


def _recorded(context_fn: ContextFn, kept: bool = False) -> tuple[list[str], Any]:
    """A plain Sequential(Linear, Block(Linear, ReLU)) with checkpoint on the block, through
    the recorder: the problems after one forward and backward. ``kept``: the checkpoint's hooks
    are not entered (what C05 does inside torch)."""
    from torch.distributed._composable import checkpoint

    from fuzz._rank.activations import ActivationRecorder
    from fuzz._rank.options import checkpoint_kwargs

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    opts = CheckpointOptions(context_fn=context_fn)
    if not kept:
        checkpoint(model[1], **checkpoint_kwargs(opts))
    comp = Composition(shards=(ShardSpec(path=""),), checkpoints=("1",), checkpoint_options=opts)
    problems: list[str] = []
    recorder = ActivationRecorder(model, comp, problems)
    model(torch.randn(2, 4)).sum().backward()
    recorder.next_microbatch()
    return problems, recorder


@pytest.mark.parametrize("context_fn", [ContextFn.NONE, ContextFn.SAVE_MATMULS, ContextFn.SAVE_MATMULS_LIST])
def test_checkpoint_keeps_nothing_and_recomputes(context_fn: ContextFn) -> None:
    problems, recorder = _recorded(context_fn)
    assert problems == []
    assert recorder.saved_inside == 0


def test_a_region_that_keeps_its_activations_is_named() -> None:
    problems, recorder = _recorded(ContextFn.NONE, kept=True)
    assert recorder.saved_inside >= 2  # the Linear's input and weight, the ReLU's result
    assert "checkpoint on '1': not recomputed in backward" in problems
    assert any("saved for backward inside the checkpointed region" in p for p in problems)


def test_hooks_leave_no_saved_tensor_hooks_behind_an_aborted_forward() -> None:
    """A forward that raises (abort_and_reset's) still leaves the outer hooks: the next
    forward's saves are seen again, not by a stale context."""
    from torch.distributed._composable import checkpoint

    from fuzz._rank.activations import ActivationRecorder

    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    checkpoint(model[1])
    comp = Composition(shards=(ShardSpec(path=""),), checkpoints=("1",))
    recorder = ActivationRecorder(model, comp, [])

    def boom(*_: Any) -> None:
        raise RuntimeError("abort")

    handle = model[1][0].register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="abort"):
        model(torch.randn(2, 4))
    handle.remove()
    assert recorder._ctx is None
    assert recorder.depth == {"1": 0}


def test_a_region_that_saves_nothing_needs_no_recomputation() -> None:
    """A checkpointed module that only adds a parameter saves no tensor for backward, so
    checkpoint has nothing to recompute (it recomputes when backward unpacks a saved tensor):
    no problem, though its forward used a trainable parameter and its output got a gradient."""
    from torch.distributed._composable import checkpoint

    from fuzz._rank.activations import ActivationRecorder

    class AddParam(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.p

    model = nn.Sequential(nn.Linear(4, 4), AddParam())
    checkpoint(model[1])
    comp = Composition(shards=(ShardSpec(path=""),), checkpoints=("1",))
    problems: list[str] = []
    recorder = ActivationRecorder(model, comp, problems)
    model(torch.randn(2, 4)).sum().backward()
    recorder.next_microbatch()
    assert problems == []
