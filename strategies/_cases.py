"""Strategies for whole cases: trainings, and parity cases put together from the parts."""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import Case, Dtype, Optimizer, ParityBody, Training
from strategies._compositions import compositions
from strategies._trees import module_trees
from strategies._validation import check_bounds, check_world_size


@st.composite
def trainings(draw: st.DrawFn, *, max_steps: int = 3, max_batch_per_rank: int = 3) -> Training:
    """Optimizer, learning rate and schedule. Adam's eps stays >= 1e-4 (see Training.eps)."""
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    check_bounds(
        "max_batch_per_rank", max_batch_per_rank, "max_batch_per_rank", max_batch_per_rank, floor=1, ceiling=64
    )
    optimizer = draw(st.sampled_from(Optimizer))
    momentum = draw(st.sampled_from((0.0, 0.9))) if optimizer is Optimizer.SGD else 0.0
    # float32 only with SGD, whose update is linear in the gradient: see Training.eps.
    dtype = draw(st.sampled_from(Dtype)) if optimizer is Optimizer.SGD else Dtype.FLOAT64
    return Training(
        optimizer=optimizer,
        lr=draw(st.sampled_from((0.01, 0.05, 0.1))),
        momentum=momentum,
        eps=draw(st.sampled_from((1e-4, 1e-3))),
        steps=draw(st.integers(1, max_steps)),
        batch_per_rank=draw(st.integers(1, max_batch_per_rank)),
        dtype=dtype,
    )


@st.composite
def parity_cases(draw: st.DrawFn, *, world_size: int, max_depth: int = 3, max_steps: int = 3) -> Case:
    """Cases for the ``parity`` property: a tree, fully_shard at random levels, a training."""
    check_world_size(world_size)
    tree = draw(module_trees(max_depth=max_depth))
    body = ParityBody(
        tree=tree,
        composition=draw(compositions(tree, world_size=world_size)),
        training=draw(trainings(max_steps=max_steps)),
    )
    return Case(property="parity", world_size=world_size, seed=draw(st.integers(0, 2**32 - 1)), body=body)
