"""The ``state_dict`` and ``dcp`` properties over the extended model world: what their
strategies draw of it, the rules they keep (a tied head on a plain meta-device target), and
round trips of the new ingredients whose state contracts the judges model: a head tied to the
embedding (its two state-dict keys, one of them left out of a non-strict load), non-persistent
buffers (out of every state dict; a meta-device target gets them as its initialisation would),
containers, bare parameters of rank 0 to 3, tuple outputs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.errors import CaseError
from fuzz.model import (
    Api,
    Block,
    Case,
    Composition,
    Container,
    DcpBody,
    DcpItem,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Options,
    Output,
    ShardSpec,
    StateDictBody,
    Training,
    Wrapper,
    tree_features,
)
from fuzz.model.state_dict_rules import meta_target_problem
from fuzz.pool import RankPool
from strategies import dcp_cases, state_dict_cases

#: A language model: a token embedding (padding_idx) and a head tied to it, around an
#: attention block with a non-persistent buffer and bare parameters of rank 2 and 3, an MLP
#: and an RMSNorm inside an nn.ModuleList, and a block returning a tuple whose activation the
#: loss reads too (a stash).
LM = ModuleTree(
    width=4,
    seq=3,
    vocab=5,
    root=Block(
        children=(
            Leaf(LeafKind.EMBEDDING, padding=True),
            Block(
                children=(Leaf(LeafKind.ATTENTION, causal=True),),
                residual=True,
                buffer=True,
                persistent=False,
                position=True,
                mix=True,
            ),
            Block(children=(Leaf(LeafKind.MLP), Leaf(LeafKind.RMS_NORM)), container=Container.LIST),
            Block(children=(Leaf(LeafKind.LINEAR),), buffer=True, output=Output.TUPLE, stash=True),
            Leaf(LeafKind.HEAD, tied=True),
        )
    ),
)
ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2)
#: The ingredients each property must draw (tree_features' names).
INGREDIENTS = (
    "model:tokens",
    "leaf:embedding:padding_idx",
    "param:tied",
    "leaf:rms_norm",
    "leaf:attention",
    "leaf:mlp",
    "block:buffer",
    "block:buffer:non-persistent",
    "block:list",
    "block:dict",
    "param:rank0",
    "param:rank2",
    "param:rank3",
)


def fsdp(*paths: str) -> Composition:
    return Composition(shards=(*(ShardSpec(p) for p in paths), ShardSpec("")))


def test_lm_has_the_ingredients() -> None:
    features = set(tree_features(LM, 2))
    assert {"param:tied", "block:buffer:non-persistent", "block:list", "leaf:attention", "output:tuple"} <= features


@pytest.mark.parametrize("strategy", [state_dict_cases, dcp_cases])
def test_strategies_draw_the_extended_world(strategy: Any) -> None:
    """Each new ingredient is drawn in at least one case in 100 of each property (at 2 ranks;
    a scalar parameter, rank 0, is the rarest: only plain, DDP and replicate sides take it)."""
    seen: Counter[str] = Counter()

    @settings(max_examples=400, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def draw(data: Any) -> None:
        case = data.draw(strategy(world_size=2))
        seen.update(set(tree_features(case.body.tree, case.world_size)))

    draw()
    rare = {name: seen[name] for name in INGREDIENTS if seen[name] < 4}
    assert not rare, f"drawn in fewer than 4 of 400 cases: {rare}"


@settings(max_examples=200, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_meta_target_unties_a_tied_head(data: Any) -> None:
    case = data.draw(st.one_of(state_dict_cases(world_size=2), dcp_cases(world_size=2)))
    body = case.body
    if body.target_meta_init:
        assert meta_target_problem(body.tree, body.target) is None
        assigns = isinstance(body, StateDictBody) and body.load.full_state_dict
        assert body.tree.tied is None or (body.target.shards and not assigns)


def test_a_tied_head_on_a_meta_target_is_refused_where_it_unties() -> None:
    assert meta_target_problem(LM, Composition()) is not None
    assert meta_target_problem(LM, fsdp("1", "3")) is None
    assert meta_target_problem(LM, fsdp("1", "3"), assigns=True) is not None
    with pytest.raises(CaseError, match="unties"):
        StateDictBody(tree=LM, source=Composition(), target=Composition(), training=ADAM, target_meta_init=True)
    full = Options(full_state_dict=True)
    with pytest.raises(CaseError, match="unties"):
        StateDictBody(
            tree=LM,
            source=Composition(),
            target=fsdp("1", "3"),
            training=ADAM,
            save=full,
            load=full,
            target_meta_init=True,
        )


@pytest.mark.parametrize(
    "name, body",
    [
        # the head's key left out of a non-strict load takes the embedding's with it
        (
            "drop_tied",
            StateDictBody(
                tree=LM,
                source=fsdp("1", "3"),
                target=Composition(wrapper=Wrapper.DDP),
                training=ADAM,
                save=Options(full_state_dict=True),
                load=Options(full_state_dict=True, strict=False),
                drop=(20,),  # 4.weight, the head's key
            ),
        ),
        # a sharded load into a meta-device fully_shard model (to_empty keeps the tied pair):
        # the non-persistent buffer is set after it
        (
            "meta_sharded",
            StateDictBody(
                tree=LM,
                source=fsdp("1", "3"),
                target=fsdp("1", "3"),
                training=ADAM,
                api=Api.SPLIT,
                target_meta_init=True,
            ),
        ),
        (
            "fsdp1",
            StateDictBody(
                tree=LM,
                source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, auto_wrap=True),
                target=fsdp("1", "3"),
                training=ADAM,
                save=Options(full_state_dict=True),
                load=Options(full_state_dict=True),
            ),
        ),
    ],
)
def test_state_dicts_of_the_extended_world(
    name: str, body: StateDictBody, rank_pool: RankPool, check_case: Any
) -> None:
    check_case(Case("state_dict", rank_pool.world_size, 31, body))


@pytest.mark.parametrize("meta", [False, True])
def test_checkpoints_of_the_extended_world(meta: bool, rank_pool: RankPool, check_case: Any) -> None:
    """Both keys of the tied pair saved and loaded (also into a plain model on one process and
    by dcp_to_torch_save), the non-persistent buffer in neither."""
    body = DcpBody(
        tree=LM,
        source=fsdp("1", "3"),
        target=fsdp("1") if meta else Composition(),
        entries=(DcpItem.MODEL, DcpItem.OPTIMIZER),
        training=ADAM,
        convert=not meta,
        target_meta_init=meta,
        drop=() if meta else (0,),  # 0.weight, the embedding's key
    )
    check_case(Case("dcp", rank_pool.world_size, 32, body))


def test_state_dict_keys_are_the_plain_models() -> None:
    """For a tree with a tied weight or a non-persistent buffer the judge holds the state dict
    taken to the plain model's keys: a tied name missing, or a non-persistent buffer present,
    is a mismatch (check ``state_dict_keys``)."""
    from fuzz._rank.state_dict import keyed_apart, plain_keys
    from fuzz.properties.state_dict import check_model_keys

    body = StateDictBody(tree=LM, source=fsdp("1", "3"), target=fsdp("1", "3"), training=ADAM)
    assert keyed_apart(LM)
    want = plain_keys(LM)
    assert "4.weight" in want and "0.weight" in want and "1.shift" not in want and "3.shift" in want
    assert check_model_keys("state_dict", "w", body, {"keys": want, "expected": want}) is None
    for keys in ([k for k in want if k != "4.weight"], sorted([*want, "1.shift"])):
        failure = check_model_keys("state_dict", "w", body, {"keys": keys, "expected": want})
        assert failure is not None and failure.details["check"] == "state_dict_keys"
