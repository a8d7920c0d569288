"""Cases that carry the order, memory and activation contracts (fuzz/_rank/{order,memory,
activations}.py), shared by the tests/test_contracts_*.py files: each names the contract fault
(tests/faults/C*.json) its contract must notice."""

from __future__ import annotations

from fuzz.model import (
    Block,
    Case,
    CheckpointOptions,
    Composition,
    ContextFn,
    Knobs,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
)

#: root: Linear, Block(Linear, ReLU), Linear: units "" (root), "0", "1", "2" possible.
TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU))),
            Leaf(LeafKind.LINEAR),
        )
    ),
)
TRAINING = Training(optimizer=Optimizer.SGD, lr=0.05, steps=2, batch_per_rank=2, grad_accum=2)
THREE_UNITS = (
    ShardSpec(path="", reshard_after_forward=True),
    ShardSpec(path="0", reshard_after_forward=True),
    ShardSpec(path="1", reshard_after_forward=True),
)


def parity(comp: Composition, seed: int = 21, training: Training = TRAINING) -> Case:
    return Case(
        property="parity", world_size=2, seed=seed, body=ParityBody(tree=TREE, composition=comp, training=training)
    )


def forward_prefetch() -> Case:
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(forward_prefetch=1)))


def backward_prefetch() -> Case:
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(backward_prefetch=1)))


def reshard_after_backward_last() -> Case:
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(reshard_after_backward_last=True)))


def resharded_after_forward() -> Case:
    """Every unit resharded after forward (a knob only so that the rank builds its KnobState
    without the composition hook for every fully_shard case)."""
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(force_sum_reduction=True)))


def plain_units() -> Case:
    """Three units, no knob: the contracts every fully_shard case carries (the reduce-scatter
    order, the memory in backward)."""
    return parity(Composition(shards=THREE_UNITS))


def checkpointed(context_fn: ContextFn = ContextFn.NONE) -> Case:
    """A checkpointed block (Linear, ReLU) inside the root unit."""
    comp = Composition(
        shards=(ShardSpec(path="", reshard_after_forward=True),),
        checkpoints=("1",),
        checkpoint_options=CheckpointOptions(context_fn=context_fn),
        knobs=Knobs(force_sum_reduction=True),
    )
    return parity(comp)


#: fault file -> the case whose contract must notice it
FAULT_CASES = {
    "C01_forward_prefetch_not_issued": forward_prefetch,
    "C02_backward_prefetch_not_issued": backward_prefetch,
    "C03_reshard_after_backward_ignored": reshard_after_backward_last,
    "C04_reshard_keeps_unsharded_storage": resharded_after_forward,
    "C05_checkpoint_region_not_checkpointed": checkpointed,
    "C06_sac_must_save_recomputed": lambda: checkpointed(ContextFn.SAVE_MATMULS),
    "C07_reduce_scatter_deferred_to_final_callback": plain_units,
    "C08_reshard_after_backward_deferred": plain_units,
}
