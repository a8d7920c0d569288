"""The known-bug registry (fuzz/known.py) and the corpus agree: every known entry names a record,
every record has an entry (its minimal case), upstream references are well formed, and the
records' conditions hold for their own entries' cases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fuzz import known, known_bugs
from fuzz.corpus import CorpusIndex, Entry, load_corpus
from fuzz.signature import Signature

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
ENTRIES: list[tuple[Path, Entry]] = load_corpus(CORPUS)[0]

#: Entries whose case also meets another bug that known_bug checks first (its order is fixed):
#: the pinned-metadata bug needs an accelerator, and on a CPU host the staging cache fails before
#: it; the rank-0 broadcast bug lives on a shard dimension of size 1.
MET_FIRST = {
    known.CACHED_STAGING_PINNED_METADATA.id: known.CACHED_STAGING_NEEDS_ACCELERATOR.id,
    known.FSDP1_HSDP_RANK0_BROADCAST.id: known.FSDP1_HSDP_SHARD1.id,
}


def test_every_known_entry_names_a_record_and_every_record_has_an_entry() -> None:
    known_entries = [e for _, e in ENTRIES if e.status == "known"]
    assert known_entries, "the corpus has known entries"
    unnamed = [e.signature for e in known_entries if e.bug is None]
    assert not unnamed, f"known entries without 'bug': {unnamed}"
    named = {e.bug for e in known_entries}
    assert named <= set(known.BUGS)
    assert set(known.BUGS) <= named, f"records with no corpus entry: {sorted(set(known.BUGS) - named)}"


def test_ids_are_unique_and_names_resolve() -> None:
    records = [v for v in vars(known_bugs).values() if isinstance(v, known.KnownBug)]
    assert len({r.id for r in records}) == len(records) == len(known.BUGS)
    for r in records:
        assert known.get(r.id) is r
    with pytest.raises(KeyError, match="no known bug"):
        known.get("not-a-bug")


@pytest.mark.parametrize("bug", sorted(known.BUGS))
def test_upstream_references_are_well_formed(bug: str) -> None:
    record = known.BUGS[bug]
    if record.upstream == known.NONE_FOUND:
        assert record.url is None
    else:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", record.upstream), record.upstream
        assert record.url is not None and record.url.endswith("/issues/" + record.upstream.split("#")[1])
    for ref in record.see_also:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", ref), ref
    assert record.odds >= 2 and Path(record.docs).suffix == ".md"


def test_an_entry_takes_its_upstream_from_its_record() -> None:
    for _, e in ENTRIES:
        if e.bug is not None:
            record = known.BUGS[e.bug]
            assert e.upstream == (None if record.upstream == known.NONE_FOUND else record.upstream)


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=[p.name for p, _ in ENTRIES])
def test_the_records_conditions_hold_for_their_entries(path: Path, entry: Entry) -> None:
    assert entry.bug is not None
    record = known.BUGS[entry.bug]
    parsed = Signature.parse(entry.signature)
    if entry.kind == "mismatch" and record.tag and parsed is not None and not parsed.check:
        # a mismatch charged to an API family is named by the degenerate setup the case meets
        # (fuzz.known.mismatch_tags); one charged to a check (a contract) names the check
        assert record.tag in entry.signature, (record.tag, entry.signature)
    if record.ends_ranks and entry.kind == "mismatch":
        pytest.fail(f"{path.name}: a mismatch entry for a bug recorded as ending its ranks")
    met = known.known_bug(entry.case)
    if met is not None:
        assert met in (entry.bug, MET_FIRST.get(entry.bug)), (met, entry.bug)
    # the state-dict properties tell from the case every bug that ends their ranks, except the
    # FSDP2 training bug met through get_optimizer_state_dict (a mismatch in training)
    ends = entry.case.property in ("state_dict", "dcp") and entry.kind in ("exception", "crash", "hang")
    if ends and entry.bug != known.UNFROZEN_UNRESHARDED.id:
        assert met is not None, f"{path.name}: known_bug does not tell {entry.bug} from the case"
    # every entry's case meets its own bug's condition, where the registry has one
    if entry.bug not in (known.CACHED_STAGING_PINNED_METADATA.id, known.FSDP1_HSDP_RANK0_BROADCAST.id):
        assert record in known.bugs_met(entry.case), f"{path.name}: its case does not meet {entry.bug}"


# ------------------------------------------------------------------ known bugs met another way


def _index() -> CorpusIndex:
    return CorpusIndex(ENTRIES)


def _entry(name: str) -> Entry:
    return next(e for p, e in ENTRIES if p.name == name)


def test_a_mismatch_through_another_layout_is_the_known_bug_its_case_meets() -> None:
    """The frozen-int-reshard FSDP2 bug met through the metamorphic property with an FSDP1
    variant: its signature names the variant's family (fsdp1), not fully_shard's, so only the
    registry's condition over the case ties it to its entry."""
    from fuzz.model import Case, Composition, MetamorphicBody, Wrapper

    body = _entry("parity-mismatch-e887f758b809.json").case.body
    variant = Composition(wrapper=Wrapper.FSDP1_FULL_SHARD)
    case = Case("metamorphic", 4, 0, MetamorphicBody(body.tree, body.composition, variant, body.training))
    signature = "mismatch:metamorphic@fsdp1:frozen-int-reshard"
    assert _index().match(signature) is None  # no signature rule ties them
    hit = _index().match(signature, case, "mismatch")
    assert hit is not None and hit[1].bug == known.FROZEN_INT_RESHARD.id
    assert hit[1].case.property == "parity"


def test_a_conditional_bugs_exact_signature_elsewhere_is_another_bug() -> None:
    """nn.Module.__getattr__'s AttributeError is the signature of the entry of
    dsd-fqn-modifiers-name-ignored-on-get, a conditional bug: in a case that does not meet its
    condition (the method under torch's default name) the same signature is another failure,
    even though it is the entry's own, exact signature (the fault K38 once passed for known)."""
    from dataclasses import replace

    from fuzz.model import DEFAULT_FQN_MODIFIERS

    entry = _entry("state_dict-exception-d4322b68deab.json")
    assert known.FUSED_CUSTOM_NAME.conditional
    hit = _index().match(entry.signature, entry.case, "exception")
    assert hit is not None and hit[1].bug == known.FUSED_CUSTOM_NAME.id
    default = replace(entry.case, body=replace(entry.case.body, fqn_modifiers=DEFAULT_FQN_MODIFIERS))
    assert not known.meets(default, known.FUSED_CUSTOM_NAME)
    assert _index().match(entry.signature, default, "exception") is None


def test_a_frozen_unit_recomputed_twice_in_one_backward_is_the_unresharded_bug() -> None:
    """Two forwards before one backward recompute a checkpointed region twice in that backward;
    a frozen fully_shard unit the region runs twice (a repeat block) then makes the second
    recomputation save other tensors than its forward did (CheckpointError at step 0, no
    unfreezing): the case meets fully_shard-frozen-unit-recomputed-unresharded and is its
    exception form. Run once per forward (no repeat), the case meets no condition of it."""
    import json
    from dataclasses import replace

    from fuzz.model import case_from_json

    path = Path(__file__).parent / "regressions" / "ckpt-frozen-unit-twice-two-forwards.json"
    case = case_from_json(json.loads(path.read_text()))
    signature = _entry("parity-exception-b2e07543b1f2.json").signature
    assert case.body.training.forwards == 2 and not case.body.training.unfreeze  # type: ignore[union-attr]
    assert known.meets(case, known_bugs.FROZEN_UNIT_RECOMPUTED_UNRESHARDED)
    hit = _index().match(signature, case, "exception")
    assert hit is not None and hit[1].bug == known_bugs.FROZEN_UNIT_RECOMPUTED_UNRESHARDED.id
    root = case.body.tree.root  # type: ignore[union-attr]
    block = root.children[1].children[1]
    assert block.repeat
    once = replace(block, repeat=False)
    middle = replace(root.children[1], children=(root.children[1].children[0], once, *root.children[1].children[2:]))
    tree = replace(case.body.tree, root=replace(root, children=(root.children[0], middle, *root.children[2:])))  # type: ignore[union-attr]
    plain = replace(case, body=replace(case.body, tree=tree))
    assert not known.meets(plain, known_bugs.FROZEN_UNIT_RECOMPUTED_UNRESHARDED)
    assert _index().match(signature, plain, "exception") is None


def test_a_contract_the_known_bug_breaks_through_another_property_is_that_bug() -> None:
    """The after-backward memory contract fully_shard-frozen-unit-recomputed-unresharded breaks
    in a parity case (its entry) breaks the same way in a metamorphic case that meets the bug's
    condition (met on torch 2.11 and 2.13): the same bug, not a new one. Without the repeated
    block the case meets no condition of it, and the same violated contract is new."""
    import json
    from dataclasses import replace

    from fuzz.model import case_from_json

    path = Path(__file__).parent / "regressions" / "ckpt-frozen-unit-twice-metamorphic-contract.json"
    case = case_from_json(json.loads(path.read_text()))
    signature = "mismatch:metamorphic:contract-knobs"
    assert case.property == "metamorphic" and _entry("parity-mismatch-565dd6c849aa.json").signature != signature
    hit = _index().match(signature, case, "mismatch")
    assert hit is not None and hit[1].bug == known_bugs.FROZEN_UNIT_RECOMPUTED_UNRESHARDED.id
    root = case.body.tree.root  # type: ignore[union-attr]
    assert root.repeat
    plain = replace(case, body=replace(case.body, tree=replace(case.body.tree, root=replace(root, repeat=False))))  # type: ignore[union-attr]
    assert not known.meets(plain, known_bugs.FROZEN_UNIT_RECOMPUTED_UNRESHARDED)
    assert _index().match(signature, plain, "mismatch") is None


def test_foreach_reduces_runtime_error_is_the_bug_whose_condition_the_case_meets() -> None:
    """foreach_reduce raises RuntimeError for two known bugs (a unit all frozen at lazy init under
    mixed precision; a changing set of used parameters under set_requires_all_reduce(False)):
    the signature alone once charged an SPMD case without mixed precision, which raised the size
    mismatch of the second, to the first. The second is charged where its case meets it; the
    first, whose condition is narrower than the bug, takes the rest."""
    signature = (
        "exception:parity:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce"
    )
    mp = _entry("mixed_precision-exception-6665b1eeed50.json")
    unused = _entry("parity-mismatch-cfc52991d173.json")
    assert known.UNUSED_NO_ALL_REDUCE.conditional
    assert known.meets(unused.case, known.UNUSED_NO_ALL_REDUCE)
    assert not known.meets(unused.case, known.MP_FROZEN_AT_LAZY_INIT)
    hit = _index().match(signature, unused.case, "exception")
    assert hit is not None and hit[1].bug == known.UNUSED_NO_ALL_REDUCE.id
    hit = _index().match(mp.signature, mp.case, "exception")
    assert hit is not None and hit[1].bug == known.MP_FROZEN_AT_LAZY_INIT.id
    # the mixed-precision record's condition is narrower than its bug, so it stays unconditional
    neither = _entry("parity-exception-3e90c3cc368a.json").case
    hit = _index().match(signature, neither, "exception")
    assert hit is not None and hit[1].bug == known.MP_FROZEN_AT_LAZY_INIT.id


def test_dtensor_conv_of_a_sharded_partial_input_is_the_conv_bug_where_the_case_meets_it() -> None:
    """Forward raises in DTensorSpec.dim_map where the conv1d leaf's input is [Shard(0), Partial]
    (a 4-rank SPMD campaign): the conv bug's entry takes that signature as an alias, in SPMD
    programs with tensor parallelism over a conv1d leaf only (the frame is any op's)."""
    from dataclasses import replace

    conv = _entry("parity-exception-49c62d6cb7ad.json")
    assert known.DTENSOR_CONV_PARTIAL.conditional and known.meets(conv.case, known.DTENSOR_CONV_PARTIAL)
    comp = conv.case.body.composition
    plain = replace(conv.case, body=replace(conv.case.body, composition=replace(comp, spmd=False)))
    assert not known.meets(plain, known.DTENSOR_CONV_PARTIAL)
    for signature in (
        "exception:parity:builtins.ValueError@torch/distributed/tensor/_dtensor_spec.py:dim_map",
        "exception:parity:builtins.RuntimeError@torch/_ops.py:__call__",  # a channel-sharded input
    ):
        hit = _index().match(signature, conv.case, "exception")
        assert hit is not None and hit[1].bug == known.DTENSOR_CONV_PARTIAL.id
        assert _index().match(signature, plain, "exception") is None


def test_another_failure_with_a_conditional_bugs_signature_is_saved_beside_its_entry(tmp_path: Path) -> None:
    """Saved, such a failure goes to a file of its own, and the known entry stays as it was."""
    import shutil
    from dataclasses import replace

    from fuzz.corpus import save_entry
    from fuzz.model import DEFAULT_FQN_MODIFIERS

    name = "state_dict-exception-d4322b68deab.json"
    shutil.copy(CORPUS / name, tmp_path / name)
    before = (tmp_path / name).read_text()
    entry = _entry(name)
    other = replace(
        entry,
        case=replace(entry.case, body=replace(entry.case.body, fqn_modifiers=DEFAULT_FQN_MODIFIERS)),
        status="new",
        bug=None,
        aliases=(),
    )
    path, saved = save_entry(tmp_path, other)
    assert path.name != name and path.name.startswith(name.removesuffix(".json")) and saved.status == "new"
    assert (tmp_path / name).read_text() == before
    again, _ = save_entry(tmp_path, other)  # the next one merges with it
    assert again == path
    counts = {p.name: e.count for p, e in load_corpus(tmp_path)[0]}
    assert counts[path.name] == 2 * other.count and counts[name] == entry.count
    index = CorpusIndex(load_corpus(tmp_path)[0])
    hit = index.match(entry.signature, other.case, "exception")
    assert hit is not None and hit[0] == path
    hit = index.match(entry.signature, entry.case, "exception")
    assert hit is not None and hit[0].name == name


def test_a_violated_contract_is_not_a_numerics_bug_the_case_meets() -> None:
    """A contract check (here the custom all-gather's) in a case that meets frozen-int-reshard
    is not that bug: a 4-rank soak once reported a false alarm of the suite as "known (as
    mismatch:parity@fsdp2:frozen-int-reshard)". Wrong values in the same case still are."""
    case = _entry("parity-mismatch-e887f758b809.json").case
    assert known.FROZEN_INT_RESHARD in known.bugs_met(case)
    assert _index().match("mismatch:parity:contract-knobs", case, "mismatch") is None
    hit = _index().match("mismatch:parity:loss", case, "mismatch")
    assert hit is not None and hit[1].bug == known.FROZEN_INT_RESHARD.id


def test_a_bug_met_as_a_mismatch_instead_of_its_crash_is_known() -> None:
    """FSDP1's full offload on CPU aliases optimizer states (exp_avg == exp_avg_sq) as often as
    it crashes: a mismatch in such a case is that bug's entry."""
    case = _entry("state_dict-crash-81ffab405f7f.json").case
    hit = _index().match("mismatch:state_dict:optimizer@fsdp1_optim_state_dict", case, "mismatch")
    assert hit is not None and hit[1].bug == known.FSDP1_FULL_OFFLOAD.id
    assert hit[1].case.property == "state_dict"  # the entry of the same property first


def test_the_registry_does_not_explain_errors_or_cases_that_meet_no_bug() -> None:
    from fuzz.model import Case, Composition, ParityBody, ShardSpec

    # an exception in a case that meets a bug's condition is matched by its detail alone
    case = _entry("parity-exception-c9b6f29fb81d.json").case
    assert known.INT_RESHARD_DIM1 in known.bugs_met(case)
    assert _index().match("exception:parity:builtins.ValueError@torch/x.py:f", case, "exception") is None
    # a mismatch in a case that meets no known bug is new
    body = _entry("parity-mismatch-e887f758b809.json").case.body
    plain = ParityBody(body.tree, Composition(shards=(ShardSpec(path=""),)), body.training)
    clean = Case("parity", 2, 0, plain)
    assert known.bugs_met(clean) == []
    assert _index().match("mismatch:parity@fsdp2", clean, "mismatch") is None


def test_present_reads_the_release_a_bug_was_fixed_in() -> None:
    bug = known.PLAN_CACHE_FAILED_SAVE
    assert bug.fixed_in == "2.13"
    assert known.present(bug, "2.11.0+cu130") and known.present(bug, "2.12.1")
    for fixed in ("2.13.0+cpu", "2.14.0a0+git1234", "3.0"):
        assert not known.present(bug, fixed)
    assert known.present(known.FLAT_FULL_OPTIM, "2.13.0")  # no fixed_in: present everywhere


def test_every_written_fix_is_a_known_bugs_and_says_why() -> None:
    """``fuzz/fixes/<id>.json``: one file per known bug whose fix is written, none for another
    id, each with its reason and at least one change."""
    import json

    for path in sorted(known.FIXES.glob("*.json")):
        bug_id = path.name.removesuffix(".json")
        assert bug_id in known.BUGS, f"{path.name} names no known bug"
        data = json.loads(path.read_text())
        assert data["why"].strip() and (data.get("changes") or data.get("same_as") in known.BUGS), path.name
        assert known.BUGS[bug_id].fix and all(p.old != p.new for p in known.BUGS[bug_id].fix)
        if "same_as" in data:  # one home for the changes: the other bug's file holds them
            assert "changes" not in data and known.BUGS[bug_id].fix == known.BUGS[data["same_as"]].fix


def test_present_reads_the_release_a_bug_came_in() -> None:
    bug = known.SAC_OVER_FSDP_UNIT
    assert bug.introduced_in == "2.13" and not bug.fixed_in
    assert not known.present(bug, "2.11.0+cu130")
    assert known.present(bug, "2.13.0+cpu") and known.present(bug, "2.14.0")


# --------------------------------------------------------------------------------- the docs

ROOT = Path(__file__).resolve().parent.parent
#: The docs that hold the known bugs' reproducers (``KnownBug.docs``).
DOCS = sorted({b.docs for b in known.BUGS.values()})
#: A doc's statement that no upstream issue was found, and that one was (an issue or pull request).
NONE_STATED = re.compile(r"no upstream issues? found|upstream: (?:none|no issue) found", re.IGNORECASE)
LINK_STATED = re.compile(
    r"upstream(?: \(related\))?: (?:open |closed )?(?:pull requests? )?pytorch/pytorch#(\d+)", re.IGNORECASE
)


def _prose(doc: str) -> str:
    """The doc's text without its generated upstream table and its code blocks."""
    text = (ROOT / doc).read_text()
    start, end = text.find(known.UPSTREAM_TABLE_START), text.find(known.UPSTREAM_TABLE_END)
    if start >= 0 and end > start:
        text = text[:start] + text[end + len(known.UPSTREAM_TABLE_END) :]
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def _blocks(text: str) -> list[str]:
    """Paragraphs and list items, each on one line."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if not line.strip() or line.startswith("#") or re.match(r"\s*(\d+\.|[-*]) ", line):
            blocks.append([])
        blocks[-1].append(line.strip())
    return [" ".join(b) for b in blocks if any(b)]


def _record_names() -> dict[str, known.KnownBug]:
    """What a doc may name a record by: its id, its name in fuzz.known, the predicate its
    condition is made of (whose docstring names the record first), its corpus entries."""
    names: dict[str, known.KnownBug] = {}
    for name in known.__all__:
        value = getattr(known, name)
        if isinstance(value, known.KnownBug):
            names[f"fuzz.known.{name}"] = value
        elif callable(value) and (m := re.search(r":data:`(\w+)`", value.__doc__ or "")):
            record = getattr(known, m.group(1), None)
            if isinstance(record, known.KnownBug):
                names[f"fuzz.known.{name}`"] = record
    for record in known.BUGS.values():
        names[f"`{record.id}`"] = record
    for path, entry in ENTRIES:
        if entry.bug is not None:
            names[path.stem] = known.BUGS[entry.bug]
    return names


def _numbers(record: known.KnownBug) -> set[str]:
    return {ref.split("#")[1] for ref in (record.upstream, *record.see_also) if "#" in ref}


@pytest.mark.parametrize("doc", DOCS)
def test_a_doc_shows_the_registrys_upstream_table(doc: str) -> None:
    """The upstream state a doc lists for its records is the registry's, generated."""
    generated = known.upstream_table(doc)
    assert generated in (ROOT / doc).read_text(), f"{doc}: replace its upstream table with:\n{generated}"


@pytest.mark.parametrize("doc", DOCS)
def test_a_doc_states_no_other_upstream_state_than_the_registry(doc: str) -> None:
    """Where a paragraph that names records (by id, fuzz.known name, condition or corpus entry)
    says no upstream issue was found, one of them has none; where it says "Upstream: #N", N is
    one of theirs (their upstream or see_also)."""
    names = _record_names()
    wrong = []
    for block in _blocks(_prose(doc)):
        named = {r.id: r for name, r in names.items() if name in block}
        if not named:
            continue
        if NONE_STATED.search(block) and all(r.upstream != known.NONE_FOUND for r in named.values()):
            wrong.append(f"says no upstream issue found, but the registry links one for {sorted(named)}: {block}")
        cited = set().union(*(_numbers(r) for r in named.values()))
        wrong += [
            f"cites #{n} as upstream, which no record of {sorted(named)} names: {block}"
            for n in LINK_STATED.findall(block)
            if n not in cited
        ]
    assert not wrong, "\n".join(wrong)
