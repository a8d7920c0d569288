"""The generated world holds the models people train (issue 46): sequences, token inputs
through an embedding, a vocabulary head tied to it or not, cross-entropy, RMSNorm, MLPs that
change the width, attention, convolutions over the sequence. Their validity rules, how they are
built, how they shrink, and that they train like the reference on the session's rank pool."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from fuzz._rank.models import build_leaf, build_model, loss_of, sample_batch
from fuzz.errors import CaseError
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Container,
    Dtype,
    InvalidBody,
    Leaf,
    LeafKind,
    MetamorphicBody,
    Misuse,
    MixedPrecision,
    ModuleTree,
    Node,
    Optimizer,
    Output,
    ParityBody,
    Reinit,
    ReinitHow,
    ShardSpec,
    Skip,
    Training,
    Wrapper,
    case_from_json,
    case_to_json,
    is_classic,
    param_names,
)
from fuzz.properties import get_property
from strategies import compositions, invalid_cases, module_trees, parity_cases, tied_trees, trainings
from strategies._options import fully_shard_refuses_shared

FAST = settings(
    max_examples=50,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


def _lm(*, seq: int = 3, vocab: int = 7, head: bool = True, tied: bool = True, bias: bool = True) -> ModuleTree:
    """Embedding, an attention block (RMSNorm, causal attention, residual, own scale), an MLP
    block, a convolution over the sequence, a head tied to the embedding."""
    children: list[Any] = [Leaf(LeafKind.EMBEDDING, padding=True)] if vocab else []
    children += [
        Block(
            children=(Leaf(LeafKind.RMS_NORM), Leaf(LeafKind.ATTENTION, causal=True, bias=bias)),
            residual=True,
            scale=True,
        ),
        Block(children=(Leaf(LeafKind.LAYER_NORM), Leaf(LeafKind.MLP, bias=bias)), residual=True),
        Leaf(LeafKind.CONV1D, kernel=3),
    ]
    if head and vocab:
        children.append(Leaf(LeafKind.HEAD, tied=tied, bias=bias))
    return ModuleTree(width=4, seq=seq, vocab=vocab, root=Block(children=tuple(children)))


def _ranked(*, seq: int = 3, gain: bool = True) -> ModuleTree:
    """A block holding bare parameters of rank 0 (with ``gain``), 1, 2 and 3 around an MLP
    block, after a linear leaf."""
    inner = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.MLP)), scale=True, gain=gain, position=True, mix=True)
    return ModuleTree(width=4, seq=seq, root=Block(children=(Leaf(LeafKind.LINEAR), inner), position=True))


def _outputs(*, root: Output = Output.TUPLE, stash: bool = True, vocab: int = 0) -> ModuleTree:
    """A root (returning ``root``) over a block that returns a tuple and stashes its activation
    for the loss (with ``stash``) and a block that returns a dict; behind an embedding and
    before a head with ``vocab``."""
    pair = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)), output=Output.TUPLE, stash=stash)
    named = Block(children=(Leaf(LeafKind.LAYER_NORM), Leaf(LeafKind.LINEAR)), residual=True, output=Output.DICT)
    children: tuple[Node, ...] = (Leaf(LeafKind.LINEAR), pair, named)
    if vocab:
        children = (Leaf(LeafKind.EMBEDDING), pair, named, Leaf(LeafKind.HEAD, tied=True))
    return ModuleTree(width=4, seq=2 if vocab else 0, vocab=vocab, root=Block(children=children, output=root))


# --------------------------------------------------------------------------------------------
# Validity rules


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda: Leaf(LeafKind.LINEAR, kernel=3), "kernel"),
        (lambda: Leaf(LeafKind.CONV1D, kernel=2), "kernel"),  # padding 'same' takes odd kernels
        (lambda: Leaf(LeafKind.RMS_NORM, bias=False), "bias"),
        (lambda: Leaf(LeafKind.EMBEDDING, bias=False), "bias"),
        (lambda: Leaf(LeafKind.MLP, causal=True), "causal"),
        (lambda: Leaf(LeafKind.LINEAR, padding=True), "padding"),
        (lambda: Leaf(LeafKind.LINEAR, tied=True), "tied"),
        (lambda: Leaf(LeafKind.HEAD, tied=True, frozen=True), "frozen"),
        (lambda: ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.EMBEDDING),))), "root.children[0]"),
        (lambda: ModuleTree(width=4, vocab=5, root=Block(children=(Leaf(LeafKind.LINEAR),))), "root.children[0]"),
        (
            lambda: ModuleTree(
                width=4,
                vocab=5,
                root=Block(children=(Leaf(LeafKind.EMBEDDING), Leaf(LeafKind.HEAD), Leaf(LeafKind.GELU))),
            ),
            "root.children[1]",
        ),
        (
            lambda: ModuleTree(
                width=4, vocab=5, root=Block(children=(Leaf(LeafKind.EMBEDDING), Leaf(LeafKind.HEAD)), scale=True)
            ),
            "root",
        ),
        (
            lambda: ModuleTree(width=4, vocab=5, root=Block(children=(Leaf(LeafKind.EMBEDDING),), residual=True)),
            "root.residual",
        ),
        (
            lambda: ModuleTree(
                width=4,
                vocab=5,
                root=Block(children=(Leaf(LeafKind.EMBEDDING, frozen=True), Leaf(LeafKind.HEAD, tied=True))),
            ),
            "root.children[0].frozen",
        ),
        (lambda: ModuleTree(width=4, seq=9, root=Block(children=(Leaf(LeafKind.LINEAR),))), "seq"),
        (lambda: ModuleTree(width=4, vocab=1, root=Block(children=(Leaf(LeafKind.EMBEDDING),))), "vocab"),
    ],
)
def test_malformed_trees_are_refused_with_the_field_named(make: Any, path: str) -> None:
    with pytest.raises(CaseError) as err:
        make()
    assert err.value.path == path


def test_a_tied_pair_split_over_two_units_is_refused_with_the_documented_reason() -> None:
    tree = _lm()
    split = Composition(shards=(ShardSpec(path="0"), ShardSpec(path="")))
    with pytest.raises(CaseError, match=r"two units.*fully_shard\(\[embedding, head\]\)"):
        ParityBody(tree=tree, composition=split)
    with pytest.raises(CaseError, match="two units"):
        ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path=""),), replicates=("4",)))
    # one unit for both: valid, grouped or under the root; and the wrappers take the whole model
    ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path="0", group=("4",)), ShardSpec(path=""))))
    ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))))
    ParityBody(tree=tree, composition=Composition(wrapper=Wrapper.DDP))
    # untied, the same split is fine
    ParityBody(tree=_lm(tied=False), composition=split)


def test_a_scalar_parameter_is_managed_by_replicate_or_ddp_only() -> None:
    tree = _ranked()
    for refused in (
        Composition(shards=(ShardSpec(path=""),)),
        Composition(shards=(ShardSpec(path="1"), ShardSpec(path="")), replicates=()),
        Composition(wrapper=Wrapper.FSDP1_FULL_SHARD),
    ):
        with pytest.raises(CaseError, match="scalar parameter"):
            ParityBody(tree=tree, composition=refused)
    ParityBody(tree=tree, composition=Composition(replicates=("",)))
    ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path="0"), ShardSpec(path="")), replicates=("1",)))
    ParityBody(tree=tree, composition=Composition(wrapper=Wrapper.DDP))
    ParityBody(tree=_ranked(gain=False), composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))))
    with pytest.raises(CaseError, match="no block with a scalar"):
        InvalidBody(tree=_ranked(gain=False), misuse=Misuse.SCALAR_UNDER_FULLY_SHARD, path="1")


def test_a_parameter_is_replaced_only_where_fully_shard_or_no_api_manages_it() -> None:
    replaced = Training(reinit=(Reinit("1", ReinitHow.REPLACE),))
    for refused, reason in (
        (Composition(wrapper=Wrapper.DDP), "DDP and FSDP1"),
        (Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), "DDP and FSDP1"),
        (Composition(shards=(ShardSpec(path="0"),), replicates=("",)), "replicate keeps"),
    ):
        with pytest.raises(CaseError, match=reason):
            ParityBody(tree=_ranked(gain=False), composition=refused, training=replaced)
    with pytest.raises(CaseError, match="unties"):
        ParityBody(
            tree=_lm(),
            composition=Composition(shards=(ShardSpec(path=""),)),
            training=Training(reinit=(Reinit("4", ReinitHow.REPLACE),)),
        )
    with pytest.raises(CaseError, match="no module with parameters"):  # a container holds none of its own
        ParityBody(tree=_held(), composition=Composition(replicates=("",)), training=Training(reinit=(Reinit("1"),)))
    units = Composition(shards=(ShardSpec(path="1"), ShardSpec(path="")))
    ParityBody(tree=_ranked(gain=False), composition=units, training=replaced)
    ParityBody(tree=_ranked(), composition=Composition(wrapper=Wrapper.DDP), training=Training(reinit=(Reinit("1"),)))
    with pytest.raises(CaseError, match="twice"):
        Training(reinit=(Reinit("1"), Reinit("1", ReinitHow.CONSTANT)))


def _held(kind: Container = Container.LIST) -> ModuleTree:
    """A root over a linear leaf and a container of two blocks (each a linear leaf and a tanh)."""
    layer = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)), residual=True)
    return ModuleTree(
        width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Block(children=(layer, layer), container=kind)))
    )


def test_no_api_is_applied_to_a_container() -> None:
    tree = _held()
    for refused in (
        Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
        Composition(shards=(ShardSpec(path="0"),), replicates=("1",)),
        Composition(shards=(ShardSpec(path=""),), checkpoints=("1",)),
    ):
        with pytest.raises(CaseError, match="container without forward"):
            ParityBody(tree=tree, composition=refused)
    ParityBody(
        tree=tree,
        composition=Composition(shards=(ShardSpec(path="1.0"), ShardSpec(path="1.1", group=()), ShardSpec(path=""))),
    )
    with pytest.raises(CaseError, match="no residual"):
        Block(children=(Leaf(LeafKind.LINEAR),), container=Container.DICT, residual=True)
    with pytest.raises(CaseError, match=r"root\.container"):
        ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR),), container=Container.LIST))


@pytest.mark.parametrize("kind", [Container.LIST, Container.DICT])
def test_a_container_is_a_torch_container_its_parent_iterates(kind: Container) -> None:
    torch.manual_seed(0)
    model = build_model(_held(kind), torch.device("cpu"))
    held = model.get_submodule("1")
    assert isinstance(held, torch.nn.ModuleList if kind is Container.LIST else torch.nn.ModuleDict)
    x = torch.randn(2, 4)
    expected = model.get_submodule("0")(x)
    for name in ("1.0", "1.1"):
        expected = model.get_submodule(name)(expected)
    assert torch.equal(model(x), expected)


def test_the_embedding_and_the_head_are_never_left_out_of_forward() -> None:
    tree = _lm()
    comp = Composition(shards=(ShardSpec(path=""),))
    for path in ("0", "4"):
        with pytest.raises(CaseError, match="changes the activation's shape"):
            ParityBody(tree=tree, composition=comp, training=Training(skips=(Skip(path=path, step=0),)))
    ParityBody(tree=tree, composition=comp, training=Training(skips=(Skip(path="1", step=0),)))


def test_spmd_and_tensor_parallel_compositions_keep_to_trees_of_the_first_kind() -> None:
    with pytest.raises(CaseError, match="first leaf kinds"):
        ParityBody(tree=_lm(), composition=Composition(shards=(ShardSpec(path=""),), spmd=True))


def test_a_schema_1_entry_decodes_as_the_case_it_always_was() -> None:
    tree = ModuleTree(width=3, root=Block(children=(Leaf(LeafKind.CONV1D), Leaf(LeafKind.LINEAR, bias=False))))
    case = Case("parity", 2, 1, ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path=""),))))
    data = case_to_json(case)
    assert data["schema"] == 2
    old = json.loads(json.dumps(data))
    old["schema"] = 1
    del old["body"]["tree"]["seq"], old["body"]["tree"]["vocab"]
    for leaf in old["body"]["tree"]["root"]["children"]:
        for name in ("kernel", "causal", "padding", "tied"):
            del leaf[name]
    assert case_from_json(old) == case
    new = Case("parity", 2, 1, ParityBody(tree=_lm(), composition=Composition(shards=(ShardSpec(path=""),))))
    assert case_from_json(json.loads(json.dumps(case_to_json(new)))) == new


# --------------------------------------------------------------------------------------------
# Building


@pytest.mark.parametrize("kind", [LeafKind.MLP, LeafKind.ATTENTION, LeafKind.RMS_NORM, LeafKind.CONV1D])
@pytest.mark.parametrize("bias", [True, False])
def test_param_names_are_the_names_torch_registers(kind: LeafKind, bias: bool) -> None:
    if kind is LeafKind.RMS_NORM and not bias:
        return
    leaf = Leaf(kind, bias=bias)
    assert [n for n, _ in build_leaf(leaf, 4).named_parameters()] == param_names(leaf)


@pytest.mark.parametrize("seq", [0, 3])
def test_bare_parameters_have_their_ranks_and_the_names_torch_registers(seq: int) -> None:
    tree = _ranked(seq=seq)
    model = build_model(tree, torch.device("cpu"))
    block = model.get_submodule("1")
    assert [n for n, _ in block.named_parameters(recurse=False)] == param_names(tree.paths()["1"])
    shapes = {n: tuple(p.shape) for n, p in block.named_parameters(recurse=False)}
    assert shapes == {"scale": (4,), "gain": (), "position": (max(seq, 1), 4), "mix": (2, 4, 4)}
    x, _ = sample_batch(tree, 2, torch.Generator().manual_seed(0), torch.float32)
    out = model(x)
    assert out.shape == x.shape
    for name in ("gain", "position", "mix"):  # each takes part in forward
        grad = torch.autograd.grad(out.sum(), getattr(block, name), retain_graph=True)[0]
        assert grad.abs().sum() > 0, name


def test_outputs_are_read_by_their_first_element_and_a_stash_enters_the_loss() -> None:
    from fuzz._rank.models import main_output, tree_blocks, tree_loss

    torch.manual_seed(0)
    model = build_model(_outputs(), torch.device("cpu"))
    x, y = sample_batch(_outputs(), 2, torch.Generator().manual_seed(0), torch.float32)
    out = model(x)
    assert isinstance(out, tuple) and out[1] is x
    pair = model.get_submodule("1")(model.get_submodule("0")(x))
    assert isinstance(pair, tuple) and isinstance(model.get_submodule("2")(pair[0]), dict)
    assert torch.equal(main_output(out), main_output(model.get_submodule("2")(pair[0])))
    blocks = tree_blocks(model)
    stashed = blocks["1"].stashed
    assert stashed is not None and torch.equal(stashed, pair[0])
    loss = tree_loss(out, y, torch.float32, blocks)
    expected = loss_of(out, y, torch.float32) + 0.1 * stashed.pow(2).mean()
    assert torch.allclose(loss, expected) and blocks["1"].stashed is None
    assert not is_classic(_outputs(stash=False)) and not is_classic(
        replace(_outputs(), root=Block(children=(Leaf(LeafKind.LINEAR),), stash=True))
    )
    with pytest.raises(CaseError, match="no forward"):
        Block(children=(Leaf(LeafKind.LINEAR),), container=Container.LIST, output=Output.TUPLE)


def test_a_tied_head_holds_the_embeddings_parameter() -> None:
    model = build_model(_lm(), torch.device("cpu"))
    head, embedding = model.get_submodule("4"), model.get_submodule("0")
    assert head.weight is embedding.weight
    names = [n for n, _ in model.named_parameters()]
    assert "0.weight" in names and "4.weight" not in names  # listed once, under the embedding
    assert "4.weight" in [n for n, _ in model.named_parameters(remove_duplicate=False)]
    untied = build_model(_lm(tied=False), torch.device("cpu"))
    assert untied.get_submodule("4").weight is not untied.get_submodule("0").weight


@pytest.mark.parametrize(("seq", "vocab", "head"), [(0, 0, False), (3, 0, False), (0, 5, False), (4, 5, True)])
def test_batches_and_losses_have_the_trees_shapes(seq: int, vocab: int, head: bool) -> None:
    tree = _lm(seq=seq, vocab=vocab, head=head)
    x, y = sample_batch(tree, 6, torch.Generator().manual_seed(0), torch.float32)
    lead = (6, seq) if seq else (6,)
    assert x.shape == (lead if vocab else (*lead, 4))
    assert x.dtype == (torch.int64 if vocab else torch.float32)
    out = build_model(tree, torch.device("cpu"))(x)
    assert out.shape == (*lead, vocab if head else 4)
    loss = loss_of(out, y, torch.float32)
    assert loss.shape == () and torch.isfinite(loss)
    if head:  # cross-entropy over the vocabulary
        assert torch.allclose(loss, torch.nn.functional.cross_entropy(out.reshape(-1, vocab), y.reshape(-1)))


def test_a_tree_of_the_first_kind_draws_the_batches_it_always_drew() -> None:
    tree = ModuleTree(width=3, root=Block(children=(Leaf(LeafKind.LINEAR),)))
    gen = torch.Generator().manual_seed(11)
    x, y = sample_batch(tree, 4, gen, torch.float64)
    again = torch.Generator().manual_seed(11)
    assert torch.equal(x, torch.randn(4, 3, generator=again, dtype=torch.float64))
    assert torch.equal(y, torch.randn(4, 3, generator=again, dtype=torch.float64))


def test_attention_is_causal_when_asked() -> None:
    torch.manual_seed(0)
    causal = build_leaf(Leaf(LeafKind.ATTENTION, causal=True), 4)
    x = torch.randn(1, 5, 4)
    changed = x.clone()
    changed[0, -1] += 1.0  # the last position cannot change the earlier ones under a causal mask
    assert torch.equal(causal(x)[0, :-1], causal(changed)[0, :-1])
    full = build_leaf(Leaf(LeafKind.ATTENTION), 4)
    full.load_state_dict(causal.state_dict())
    assert not torch.equal(full(x)[0, :-1], full(changed)[0, :-1])


def test_a_repeated_block_calls_its_children_twice_and_keeps_a_non_persistent_buffer_out() -> None:
    block = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)), buffer=True, persistent=False, repeat=True)
    torch.manual_seed(0)
    model = build_model(ModuleTree(width=3, root=block), torch.device("cpu"))
    assert "shift" not in model.state_dict() and "shift" in dict(model.named_buffers())
    calls: list[int] = []
    model.get_submodule("0").register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(2, 3)
    once = torch.tanh(model.get_submodule("0")(x))
    calls.clear()
    out = model(x)
    assert len(calls) == 2
    assert torch.allclose(out, torch.tanh(model.get_submodule("0")(once)) + model.get_buffer("shift"))
    with pytest.raises(CaseError, match="persistent"):
        Block(children=(Leaf(LeafKind.LINEAR),), persistent=False)


def test_unshard_in_backward_is_not_drawn_over_modules_called_twice() -> None:
    from fuzz.model import Knobs

    tree = ModuleTree(width=4, root=Block(children=(Block(children=(Leaf(LeafKind.LINEAR),), repeat=True),)))
    comp = Composition(shards=(ShardSpec(path="0.0"), ShardSpec(path="")), knobs=Knobs(no_unshard_in_backward=True))
    with pytest.raises(CaseError, match="twice"):
        ParityBody(tree=tree, composition=comp)


def test_clipping_is_drawn_where_torch_can_clip() -> None:
    tree = _lm(vocab=0)
    clip = Training(clip_grad_norm=0.1)
    ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))), training=clip)
    ParityBody(tree=tree, composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=clip)
    mixed = Composition(shards=(ShardSpec(path=""),), replicates=("1",))
    with pytest.raises(CaseError, match="mix of DTensor and plain"):
        ParityBody(tree=tree, composition=mixed, training=clip)
    fsdp1_double = Training(clip_grad_norm=0.1, optimizer=Optimizer.ADAM, dtype=Dtype.FLOAT64)
    with pytest.raises(CaseError, match="float64"):
        ParityBody(tree=tree, composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=fsdp1_double)
    with pytest.raises(CaseError, match="positive"):
        Training(clip_grad_norm=0.0)


def test_eval_forwards_are_drawn_where_the_oracles_describe_them() -> None:
    from fuzz.model import Knobs, Unfreeze

    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.LAYER_NORM, frozen=True))))
    evaluate = Training(eval_forward=True, steps=2, unfreeze=(Unfreeze(path="1", step=1),))
    ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path=""),)), training=evaluate)
    kept = Composition(shards=(ShardSpec(path="", reshard_after_forward=False),))
    with pytest.raises(CaseError, match="torch bug"):  # the unfreeze after an inference forward
        ParityBody(tree=tree, composition=kept, training=evaluate)
    knobs = Composition(shards=(ShardSpec(path=""),), knobs=Knobs(forward_prefetch=1))
    with pytest.raises(CaseError, match="knobs"):
        ParityBody(tree=tree, composition=knobs, training=Training(eval_forward=True))


# --------------------------------------------------------------------------------------------
# Drawing and shrinking


@pytest.mark.parametrize(
    ("condition", "check"),
    [
        # 4 nodes (embedding, a linear leaf, head, root) or 5 (a parameter-free leaf under a block
        # with its own scale): the shrinker stops at either
        (lambda t: t.tied is not None, lambda t: t.size <= 5 and t.seq == 0 and not t.root.children[0].frozen),
        (lambda t: t.seq > 0, lambda t: t.seq == 1 and t.vocab == 0),
        (
            lambda t: any(isinstance(n, Leaf) and n.kind is LeafKind.ATTENTION for n in t.paths().values()),
            lambda t: t.size == 2 and t.vocab == 0 and t.seq == 0,
        ),
        (lambda t: t.head is not None and t.seq > 0, lambda t: t.seq == 1 and t.size <= 5),
    ],
)
@pytest.mark.slow  # 10-20 s each on 2 shared cores: Hypothesis shrinks a few hundred trees
def test_new_ingredients_shrink_to_their_smallest_trees(condition: Any, check: Any) -> None:
    smallest = find(
        module_trees(extended=True), condition, settings=settings(database=None, max_examples=300, deadline=None)
    )
    assert check(smallest), smallest


def test_extended_ingredients_are_drawn_at_a_useful_rate() -> None:
    seen: dict[str, int] = {}

    @settings(FAST, max_examples=200, derandomize=True)
    @given(parity_cases(world_size=2))
    def draw(case: Case) -> None:
        for f in get_property("parity").features(case):
            seen[f] = seen.get(f, 0) + 1

    draw()
    for feature in ("model:sequence", "model:tokens", "loss:cross_entropy", "leaf:attention", "leaf:embedding"):
        assert seen.get(feature, 0) >= 3, (feature, seen)
    later = ("output:tuple", "output:dict", "loss:intermediate", "training:forwards:2", "training:reinit:scale")
    for feature in (*later, "training:reinit:replace"):
        assert seen.get(feature, 0) >= 2, (feature, seen)


@FAST
@given(st.data())
def test_trainings_drawn_for_a_composition_make_valid_cases(data: st.DataObject) -> None:
    """Issue 48 item 6: the public strategies drawn apart, README style, compose: no CaseError."""
    tree = data.draw(module_trees(extended=True))
    comp = data.draw(compositions(tree, world_size=2))
    training = data.draw(trainings(composition=comp))
    body = ParityBody(tree=tree, composition=comp, training=training)  # raises CaseError if invalid
    assert Case(property="parity", world_size=2, seed=0, body=body).body is body
    if comp.replicates:
        assert training.accum_sync is AccumSync.ALWAYS


@FAST
@given(tied_trees())
def test_tied_trees_tie(tree: ModuleTree) -> None:
    assert tree.tied == ("0", tree.head)


# --------------------------------------------------------------------------------------------
# End to end on the rank pool

_MP = MixedPrecision(param_dtype=Dtype.BFLOAT16, reduce_dtype=Dtype.FLOAT32, cast_forward_inputs=True)
_REPEATED = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(
                children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH), Block(children=(Leaf(LeafKind.LAYER_NORM),))),
                repeat=True,
                buffer=True,
                persistent=False,
            ),
        ),
        buffer=True,
        persistent=False,
    ),
)
_MP_OUT = MixedPrecision(param_dtype=Dtype.BFLOAT16, reduce_dtype=Dtype.FLOAT32, output_dtype=Dtype.FLOAT32)
_SCALE, _CONST, _NEW = ReinitHow.SCALE, ReinitHow.CONSTANT, ReinitHow.REPLACE
_CASES = [
    (
        "parity",  # parameters replaced and re-initialised after fully_shard, before its lazy init
        ParityBody(
            tree=_ranked(gain=False),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
            training=Training(steps=2, reinit=(Reinit("1.1", _NEW), Reinit("1", _NEW), Reinit("0", _CONST))),
        ),
    ),
    (
        "parity",  # after meta-device construction, under shard_dim 1
        ParityBody(
            tree=_lm(),
            composition=Composition(shards=(ShardSpec(path="1", shard_dim=1), ShardSpec(path="")), meta_init=True),
            training=Training(steps=2, reinit=(Reinit("1", _NEW), Reinit("0", _SCALE))),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_ranked(), composition=Composition(wrapper=Wrapper.DDP), training=Training(reinit=(Reinit("1"),))
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_lm(seq=0),
            composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD),
            training=Training(reinit=(Reinit("1", _CONST), Reinit("4"))),
        ),
    ),
    (
        "mixed_precision",
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="1", mixed_precision=_MP), ShardSpec(path="", mixed_precision=_MP))
            ),
            training=Training(reinit=(Reinit("1", _NEW), Reinit("2.1", _CONST))),
        ),
    ),
    (
        "metamorphic",
        MetamorphicBody(
            tree=_lm(),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
            variant=Composition(replicates=("",)),
            training=Training(steps=2, reinit=(Reinit("1", _CONST), Reinit("0"))),
        ),
    ),
    (
        "parity",  # units returning a tuple and a dict, one checkpointed, a stashed activation in the loss
        ParityBody(
            tree=_outputs(),
            composition=Composition(
                shards=(ShardSpec(path="1"), ShardSpec(path="2"), ShardSpec(path="")), checkpoints=("1",)
            ),
            training=Training(steps=2, grad_accum=2, forwards=2),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_outputs(root=Output.DICT, vocab=7),
            composition=Composition(
                shards=(ShardSpec(path="2"), ShardSpec(path="")), replicates=(), checkpoints=("1",)
            ),
            training=Training(steps=2, eval_forward=True, skips=(Skip(path="1", step=1),)),
        ),
    ),
    ("parity", ParityBody(tree=_outputs(), composition=Composition(wrapper=Wrapper.DDP), training=Training(steps=2))),
    (
        "parity",
        ParityBody(tree=_outputs(), composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=Training()),
    ),
    (
        "mixed_precision",  # output_dtype casts the tuple's and the dict's tensors
        ParityBody(
            tree=_outputs(),
            composition=Composition(shards=(ShardSpec(path="", mixed_precision=_MP_OUT),), checkpoints=("1",)),
        ),
    ),
    (
        "metamorphic",
        MetamorphicBody(
            tree=_outputs(vocab=7),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
            variant=Composition(replicates=("",)),
            training=Training(steps=2),
        ),
    ),
    (
        "parity",  # two forwards of a unit resharded after each, their losses summed, one backward
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="1"), ShardSpec(path="0", group=("4",)), ShardSpec(path=""))
            ),
            training=Training(steps=2, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC, forwards=2),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_REPEATED,
            composition=Composition(shards=(ShardSpec(path="1"),), replicates=("",), checkpoints=("1.2",)),
            training=Training(steps=2, forwards=3),
        ),
    ),
    ("parity", ParityBody(tree=_ranked(), composition=Composition(wrapper=Wrapper.DDP), training=Training(forwards=2))),
    (
        "parity",
        ParityBody(
            tree=_lm(seq=0), composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=Training(forwards=2)
        ),
    ),
    (
        "mixed_precision",
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="1", mixed_precision=_MP), ShardSpec(path="", mixed_precision=_MP))
            ),
            training=Training(forwards=2),
        ),
    ),
    (
        "metamorphic",
        MetamorphicBody(
            tree=_ranked(gain=False),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
            variant=Composition(shards=(ShardSpec(path="1", reshard_after_forward=False), ShardSpec(path=""))),
            training=Training(forwards=2, eval_forward=True),
        ),
    ),
    (
        "parity",  # ranks 1-3 under fully_shard, dim 1 where it splits; the scalar under replicate
        ParityBody(
            tree=_ranked(),
            composition=Composition(
                shards=(ShardSpec(path="0", shard_dim=1), ShardSpec(path="")), replicates=("1",), find_unused=True
            ),
            training=Training(steps=2, optimizer=Optimizer.ADAM, dtype=Dtype.FLOAT64),
        ),
    ),
    ("parity", ParityBody(tree=_ranked(), composition=Composition(wrapper=Wrapper.DDP), training=Training(steps=2))),
    (
        "parity",
        ParityBody(
            tree=_ranked(gain=False),
            composition=Composition(shards=(ShardSpec(path="1", shard_dim=1), ShardSpec(path="")), meta_init=True),
            training=Training(steps=2, clip_grad_norm=0.1),
        ),
    ),
    (
        "mixed_precision",
        ParityBody(
            tree=_ranked(gain=False),
            composition=Composition(
                shards=(ShardSpec(path="1", mixed_precision=_MP), ShardSpec(path="", mixed_precision=_MP))
            ),
        ),
    ),
    (
        "metamorphic",
        MetamorphicBody(
            tree=_ranked(gain=False),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path=""))),
            variant=Composition(wrapper=Wrapper.FSDP1_SHARD_GRAD_OP),
        ),
    ),
    ("invalid", InvalidBody(tree=_ranked(), misuse=Misuse.SCALAR_UNDER_FULLY_SHARD, path="1")),
    ("invalid", InvalidBody(tree=_held(Container.DICT), misuse=Misuse.CONTAINER_UNIT, path="1")),
    (
        "parity",  # the items of a list as units (the layers of a model), one left out at a microbatch
        ParityBody(
            tree=_held(),
            composition=Composition(shards=(ShardSpec(path="1.0"), ShardSpec(path="1.1"), ShardSpec(path=""))),
            training=Training(steps=2, grad_accum=2, skips=(Skip(path="1.1", step=1, microbatch=0),)),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_held(Container.DICT),
            composition=Composition(shards=(ShardSpec(path=""),), replicates=("1.1",), checkpoints=("1.0",)),
        ),
    ),
    ("parity", ParityBody(tree=_lm(), composition=Composition(shards=(ShardSpec(path=""),)))),
    (
        "parity",  # meta-device init keeps the tie: the unit sets the shared Parameter on both modules
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="0", group=("4",)), ShardSpec(path="1"), ShardSpec(path="")), meta_init=True
            ),
            training=Training(steps=2),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_REPEATED,
            composition=Composition(shards=(ShardSpec(path="1.0"), ShardSpec(path="1.2"), ShardSpec(path=""))),
            training=Training(steps=2, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_REPEATED, composition=Composition(shards=(ShardSpec(path="1.0"), ShardSpec(path="")), meta_init=True)
        ),
    ),
    ("parity", ParityBody(tree=_REPEATED, composition=Composition(shards=(ShardSpec(path=""),), replicates=("1.0",)))),
    (
        "parity",
        ParityBody(
            tree=_lm(),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path="")), mesh=(2, 1)),
            training=Training(steps=2, clip_grad_norm=0.1, optimizer=Optimizer.ADAM, dtype=Dtype.FLOAT64),
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_lm(), composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=Training(clip_grad_norm=0.1)
        ),
    ),
    (
        "parity",
        ParityBody(
            tree=_REPEATED,
            composition=Composition(shards=(ShardSpec(path="1", reshard_after_forward=False), ShardSpec(path=""))),
            training=Training(steps=2, eval_forward=True),
        ),
    ),
    (
        "parity",
        ParityBody(tree=_lm(), composition=Composition(wrapper=Wrapper.DDP), training=Training(eval_forward=True)),
    ),
    (
        "parity",
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="1", shard_dim=1), ShardSpec(path="0", group=("4",)), ShardSpec(path="")),
                checkpoints=("2",),
            ),
            training=Training(steps=2, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC),
        ),
    ),
    ("parity", ParityBody(tree=_lm(), composition=Composition(shards=(ShardSpec(path="2"),), replicates=("",)))),
    ("parity", ParityBody(tree=_lm(seq=0, bias=False), composition=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD))),
    (
        "parity",
        ParityBody(
            tree=_lm(vocab=0),
            composition=Composition(shards=(ShardSpec(path="1"), ShardSpec(path="")), meta_init=True),
            training=Training(optimizer=Optimizer.ADAM, dtype=Dtype.FLOAT64),
        ),
    ),
    (
        "mixed_precision",
        ParityBody(
            tree=_lm(),
            composition=Composition(
                shards=(ShardSpec(path="1", mixed_precision=_MP), ShardSpec(path="", mixed_precision=_MP))
            ),
        ),
    ),
    (
        "metamorphic",
        MetamorphicBody(
            tree=_lm(tied=False),
            composition=Composition(shards=(ShardSpec(path="0"), ShardSpec(path="4"), ShardSpec(path=""))),
            variant=Composition(wrapper=Wrapper.DDP),
        ),
    ),
]


@pytest.mark.parametrize(("prop", "body"), _CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(_CASES)])
def test_language_models_train_like_the_reference(rank_pool: Any, check_case: Any, prop: str, body: Any) -> None:
    check_case(Case(property=prop, world_size=rank_pool.world_size, seed=3, body=body))


@pytest.mark.skipif(not fully_shard_refuses_shared(), reason="torch before 2.13 accepts a parameter in two units")
@pytest.mark.parametrize("path", ["0", "4"])
def test_a_tied_pair_over_two_units_raises_on_every_rank(rank_pool: Any, check_case: Any, path: str) -> None:
    body = InvalidBody(tree=_lm(), misuse=Misuse.TIED_ACROSS_UNITS, path=path)
    check_case(Case(property="invalid", world_size=rank_pool.world_size, seed=0, body=body))


@FAST
@given(invalid_cases(world_size=2))
def test_invalid_cases_over_extended_trees_are_valid(case: Case) -> None:
    body = case.body
    assert isinstance(body, InvalidBody)
    if body.misuse is Misuse.TIED_ACROSS_UNITS:
        assert body.tree.tied is not None and body.path in body.tree.tied


# --------------------------------------------------------------------------------------------
# Coverage


def test_the_new_ingredients_are_checklist_items_counted_per_property() -> None:
    from fuzz.coverage import CHECKLIST, coverage_per_property, format_per_property

    models = [i for i in CHECKLIST if i.area == "models"]
    assert {i.id for i in models if i.generated} >= {
        "model.sequence",
        "model.tokens",
        "model.cross_entropy",
        "model.tied",
        "model.tied_misuse",
        "model.rms_norm",
        "model.mlp",
        "model.attention",
        "model.conv_sequence",
        "model.multi_forward",
        "model.outputs",
        "model.intermediate_loss",
        "model.reinit",
        "model.replaced",
    }
    case = Case("parity", 2, 0, ParityBody(tree=_lm(), composition=Composition(shards=(ShardSpec(path=""),))))
    names = get_property("parity").features(case)
    counted = {"parity": dict.fromkeys(names, 2), "invalid": {"misuse:tied_across_units": 1}}
    rows = {r["id"]: r for r in coverage_per_property(counted, "models")}
    assert rows["model.tied"]["per_property"] == {"invalid": 0, "parity": 2}
    assert rows["model.tied_misuse"]["per_property"] == {"invalid": 1, "parity": 0}
    assert rows["model.attention"]["per_property"]["parity"] == 4  # leaf:attention and :causal
    assert rows["model.reinit"]["count"] == 0 and rows["model.reinit"]["generated"]
    table = format_per_property(list(rows.values()))
    assert table.splitlines()[0].split()[:3] == ["item", "invalid", "parity"]
    assert "model.tied " in table
