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
    Skip,
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
#: the same with a Dropout after the block: the RNG moves between the block's forward and its
#: recomputation, which draws nothing itself.
DROPOUT_TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU))),
            Leaf(LeafKind.DROPOUT),
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


def parity(comp: Composition, seed: int = 21, training: Training = TRAINING, tree: ModuleTree = TREE) -> Case:
    return Case(
        property="parity", world_size=2, seed=seed, body=ParityBody(tree=tree, composition=comp, training=training)
    )


def forward_prefetch() -> Case:
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(forward_prefetch=1)))


def backward_prefetch() -> Case:
    return parity(Composition(shards=THREE_UNITS, knobs=Knobs(backward_prefetch=1)))


def backward_prefetch_kept_unsharded() -> Case:
    """Every unit with reshard_after_forward=False, the first one frozen: its output needs no
    gradient, so the next unit's post-backward (and reduce-scatter) runs from the root's final
    callback, after the frozen target's own has resharded it; the prefetch itself finds the
    target unsharded (the case a check at the reduce-scatter misread)."""
    tree = ModuleTree(
        width=4,
        root=Block(
            children=(
                Leaf(LeafKind.LINEAR, frozen=True),
                Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU))),
                Leaf(LeafKind.LINEAR),
            )
        ),
    )
    units = tuple(ShardSpec(path=p, reshard_after_forward=False) for p in ("", "0", "1"))
    return parity(Composition(shards=units, knobs=Knobs(backward_prefetch=1)), tree=tree)


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


def partial_group_twice() -> Case:
    """A grouped unit (the two Linears "0" and "2", reshard_after_forward=False) whose member
    "0" is skipped on step 0, two forwards per microbatch: torch 2.13 completes the partly run
    group at the root's post-forward, after which it holds its unsharded parameters as any unit
    kept unsharded after forward (the second forward's start must allow it)."""
    units = (
        ShardSpec(path="", reshard_after_forward=False),
        ShardSpec(path="0", group=("2",), reshard_after_forward=False),
    )
    training = Training(optimizer=Optimizer.SGD, lr=0.05, steps=2, batch_per_rank=2, forwards=2, skips=(Skip("0", 0),))
    return parity(Composition(shards=units), training=training)


def checkpointed(
    context_fn: ContextFn = ContextFn.NONE, early_stop: bool | None = None, tree: ModuleTree = TREE
) -> Case:
    """A checkpointed block (Linear, ReLU) inside the root unit."""
    comp = Composition(
        shards=(ShardSpec(path="", reshard_after_forward=True),),
        checkpoints=("1",),
        checkpoint_options=CheckpointOptions(context_fn=context_fn, early_stop=early_stop),
        knobs=Knobs(force_sum_reduction=True),
    )
    return parity(comp, tree=tree)


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
    "C09_checkpoint_early_stop_ignored": checkpointed,
    # early_stop=False: the block's ReLU, its last op, is recomputed in full (an early stop ends
    # the recomputation inside it, before its module's forward hook)
    "C10_sac_prefer_recompute_saved": lambda: checkpointed(ContextFn.SAVE_MATMULS, early_stop=False),
    "C11_checkpoint_rng_state_not_restored": lambda: checkpointed(tree=DROPOUT_TREE),
}
