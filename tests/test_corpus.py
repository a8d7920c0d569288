"""The corpus: entries round-trip through plain JSON files, merge by signature, and bad files are
reported (naming the file) instead of crashing the reader."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from fuzz.corpus import (
    ENTRY_SCHEMA,
    CorpusIndex,
    Entry,
    KnownBugs,
    entry_from_failure,
    load_corpus,
    load_entry,
    save_entry,
)
from fuzz.errors import ShardfuzzError
from fuzz.model import (
    Block,
    Case,
    Composition,
    Leaf,
    LeafKind,
    ModuleTree,
    ParityBody,
    ShardSpec,
    Training,
    case_to_json,
)
from fuzz.signature import Failure, location, same_bug

SIGNATURE = "mismatch:parity:loss"


def _small_case() -> Case:
    tree = ModuleTree(width=3, root=Block(children=(Leaf(LeafKind.LINEAR),)))
    return Case(
        property="parity",
        world_size=2,
        seed=11,
        body=ParityBody(tree=tree, composition=Composition(shards=(ShardSpec(path=""),)), training=Training(steps=1)),
    )


def _large_case() -> Case:
    inner = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU), Leaf(LeafKind.LAYER_NORM)), residual=True)
    tree = ModuleTree(width=5, root=Block(children=(inner, Leaf(LeafKind.LINEAR, bias=False), Leaf(LeafKind.TANH))))
    return Case(
        property="parity",
        world_size=2,
        seed=22,
        body=ParityBody(
            tree=tree,
            composition=Composition(
                shards=(ShardSpec(path="0", reshard_after_forward=False), ShardSpec(path="", shard_dim=1))
            ),
            training=Training(steps=3),
        ),
    )


def _entry(case: Case | None = None, **overrides: Any) -> Entry:
    fields: dict[str, Any] = {
        "case": case if case is not None else _small_case(),
        "kind": "mismatch",
        "signature": SIGNATURE,
        "summary": "loss at step 0 is 1.0, reference 2.0",
        "details": {"check": "loss", "observed": [1.0], "expected": [2.0]},
        "versions": {"torch": "2.13.0"},
        "found_at": "2025-01-01T00:00:00+00:00",
        "reruns": 3,
        "reproduced": 3,
    }
    fields.update(overrides)
    return Entry(**fields)


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_case_sizes_differ() -> None:
    # The merge tests below rely on this.
    assert _small_case().size < _large_case().size


# --------------------------------------------------------------------------------------------
# Saving and loading


def test_save_then_load_round_trip(tmp_path: Path) -> None:
    entry = _entry(
        _large_case(), backend="gloo", device_kind="cpu", count=2, status="flaky", upstream="pytorch/pytorch#1"
    )
    path, saved = save_entry(tmp_path, entry)
    assert saved == entry
    assert path == tmp_path / entry.file_name
    assert path.exists()
    assert load_entry(path) == entry


def test_aliases_round_trip_survive_merge_and_are_validated(tmp_path: Path) -> None:
    alias = "exception:parity:builtins.RuntimeError@torch/x.py:f"
    entry = _entry(status="known", aliases=(alias,))
    path, _ = save_entry(tmp_path, entry)
    assert load_entry(path).aliases == (alias,)
    assert load_entry(path).signatures == {SIGNATURE, alias}
    _, merged = save_entry(tmp_path, _entry())  # a campaign re-hit carries no aliases
    assert merged.aliases == (alias,)
    data = json.loads(path.read_text())
    data["aliases"] = "not a list"
    path.write_text(json.dumps(data))
    with pytest.raises(ShardfuzzError, match="aliases"):
        load_entry(path)


# --------------------------------------------------------------------------------------------
# One bug, several signatures

SEGV = "signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook"
HANG_AT = "torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone"


@pytest.mark.parametrize(
    ("entry", "found"),
    [
        # exceptions, crashes and hangs: the same detail met through another property
        (f"crash:state_dict:{SEGV}", f"crash:dcp:{SEGV}"),
        ("exception:parity:builtins.IndexError@torch/a.py:f", "exception:metamorphic:builtins.IndexError@torch/a.py:f"),
        (f"hang:state_dict@{HANG_AT}", f"hang:dcp@{HANG_AT}"),
        # mismatches: the entry's tags are among the failure's, in the same API family
        ("mismatch:parity@fsdp2:unfrozen-unresharded", "mismatch:parity@fsdp2:shard1:unfrozen-unresharded"),
        ("mismatch:parity@fsdp2:unfrozen-unresharded", "mismatch:metamorphic@fsdp2:unfrozen-unresharded"),
        ("mismatch:parity@fsdp1:shard1", "mismatch:parity@fsdp1:shard1:unfrozen-frozen-unit"),
        ("mismatch:dcp@save:shard1", "mismatch:dcp@save:shard1:fsdp1-hsdp-load_sharded_optimizer_state_dict"),
    ],
)
def test_same_bug_met_another_way(entry: str, found: str) -> None:
    assert same_bug(entry, found)
    assert same_bug(found, found)


@pytest.mark.parametrize(
    ("entry", "found"),
    [
        ("exception:parity:builtins.IndexError@torch/a.py:f", "exception:parity:builtins.IndexError@torch/a.py:g"),
        ("exception:parity:builtins.IndexError@torch/a.py:f", "exception:parity:builtins.KeyError@torch/a.py:f"),
        (f"crash:state_dict:{SEGV}", f"exception:state_dict:{SEGV}"),
        (f"crash:state_dict:{SEGV}", f"crash:state_dict:{SEGV.replace('SIGSEGV', 'SIGABRT')}"),
        (f"hang:state_dict@{HANG_AT}", "hang:state_dict@torch/distributed/_state_dict_utils.py:_broadcast_state_dict"),
        # a tag names a bug of one API family only
        ("mismatch:parity@fsdp1:shard1", "mismatch:parity@fsdp2:shard1"),
        # a failure without the entry's tag does not meet that bug's conditions
        ("mismatch:parity@fsdp2:unfrozen-unresharded", "mismatch:parity@fsdp2"),
        ("mismatch:parity@fsdp2:unfrozen-unresharded", "mismatch:parity@fsdp2:frozen-int-reshard"),
        # an entry without tags is a whole API family: only itself
        ("mismatch:parity@fsdp2", "mismatch:parity@fsdp2:shard1"),
        ("mismatch:parity@fsdp2", "mismatch:metamorphic@fsdp2"),
        # checks are not families
        ("mismatch:mixed_precision:contract-output-dtype", "mismatch:parity:contract-output-dtype"),
        ("mismatch:state_dict@split:shard1", "mismatch:dcp@save:shard1"),
        ("not a signature", "not a signature either"),
    ],
)
def test_different_bugs(entry: str, found: str) -> None:
    assert not same_bug(entry, found)


# A rank's faulthandler dump on SIGSEGV (torch 2.11 on the device machine): another thread is
# listed before the one that faulted.
_DUMP = """Fatal Python error: Segmentation fault

Thread 0x00007faa7adde6c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/opt/torch/.venv/lib/python3.12/site-packages/tqdm/_monitor.py", line 69 in run
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007faac6eff6c0 (most recent call first):
  <no Python frame>

Current thread 0x00007fada55de140 (most recent call first):
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 3 in param_hook
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py", line 2276 in state_dict
  File "/work/main/fuzz/_rank/state_dict.py", line 349 in _take

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


def test_a_crash_is_located_in_the_thread_that_faulted() -> None:
    param_hook = "torch/distributed/fsdp/_state_dict_utils.py:param_hook"
    assert location(_DUMP) == param_hook
    # without a current thread's block: the innermost torch frame of the whole dump (tqdm under
    # /opt/torch/.venv is not torch)
    assert location(_DUMP.replace("Current thread", "Thread")) == param_hook
    assert location(_DUMP.split("Current thread")[0]) == "threading.py:wait"  # no torch frame: the innermost
    traceback = 'Traceback (most recent call last):\n  File "/x/torch/a/b.py", line 3, in f\nValueError: no\n'
    assert location(traceback) == "torch/a/b.py:f"


def test_a_comprehension_is_located_in_its_function_on_every_python() -> None:
    """Python 3.11 gives a list comprehension a frame of its own; 3.12 inlines it (PEP 709)."""
    tb, frame = "Traceback (most recent call last):\n", '  File "/x/torch/distributed/checkpoint/state_dict.py", line 9'
    py311 = f"{tb}{frame}, in _get_optim_state_dict\n{frame}, in <listcomp>\nKeyError: 1\n"
    py312 = f"{tb}{frame}, in _get_optim_state_dict\nKeyError: 1\n"
    want = "torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict"
    assert location(py311) == location(py312) == want
    dump = 'Current thread 0x1 (most recent call first):\n  File "/x/torch/a.py", line 2 in <dictcomp>\n'
    assert location(dump + '  File "/x/torch/a.py", line 1 in f\n') == "torch/a.py:f"


def test_index_takes_any_entry_exactly_and_known_ones_met_another_way(tmp_path: Path) -> None:
    known_sig = "mismatch:parity@fsdp2:unfrozen-unresharded"
    new_sig = "exception:parity:builtins.IndexError@torch/a.py:f"
    known = save_entry(tmp_path, _entry(signature=known_sig, status="known", upstream="pytorch/pytorch#7"))
    new = save_entry(tmp_path, _entry(signature=new_sig, kind="exception"))
    index = CorpusIndex(load_corpus(tmp_path)[0])
    assert index.match(known_sig) == known
    assert index.match(new_sig) == new
    assert index.match("mismatch:metamorphic@fsdp2:shard1:unfrozen-unresharded") == known
    assert index.known("mismatch:metamorphic@fsdp2:shard1:unfrozen-unresharded") == known[1]
    # Only a person's "known" mark makes a bug one that other signatures can be counted against.
    assert index.match("exception:dcp:builtins.IndexError@torch/a.py:f") is None
    assert index.known(new_sig) is None
    bugs = KnownBugs(load_corpus(tmp_path)[0])
    assert list(bugs) == [known_sig]
    assert bugs["mismatch:parity@fsdp2:shard1:unfrozen-unresharded"] == "pytorch/pytorch#7"
    assert "mismatch:parity@fsdp2:shard1" not in bugs
    assert new_sig not in bugs


def test_save_creates_missing_directory(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    path, _ = save_entry(directory, _entry())
    assert path.parent == directory
    assert load_entry(path) == _entry()


def test_saved_file_is_plain_json_with_every_field(tmp_path: Path) -> None:
    entry = _entry(_large_case())
    path, _ = save_entry(tmp_path, entry)
    with open(path) as f:
        data = json.load(f)
    assert isinstance(data, dict)
    for key in (
        "schema",
        "property",
        "kind",
        "signature",
        "case",
        "versions",
        "reruns",
        "reproduced",
        "count",
        "found_at",
        "world_size",
        "backend",
    ):
        assert key in data, key
    assert data["schema"] == ENTRY_SCHEMA
    assert data["property"] == "parity"
    assert data["kind"] == "mismatch"
    assert data["signature"] == SIGNATURE
    assert data["case"] == case_to_json(entry.case)
    assert data["versions"] == {"torch": "2.13.0"}
    assert data["reruns"] == 3
    assert data["reproduced"] == 3
    assert data["count"] == 1
    assert data["found_at"] == "2025-01-01T00:00:00+00:00"
    assert data["world_size"] == 2
    assert data["backend"] == "gloo"
    assert data["size"] == {"nodes": entry.case.size[0], "steps": entry.case.size[1]}


def test_file_name_depends_on_signature(tmp_path: Path) -> None:
    a, _ = save_entry(tmp_path, _entry(signature="mismatch:parity:loss"))
    b, _ = save_entry(tmp_path, _entry(signature="mismatch:parity:param"))
    assert a != b
    assert a.name.startswith("parity-mismatch-")
    assert len(_files(tmp_path)) == 2
    entries, problems = load_corpus(tmp_path)
    assert problems == []
    assert sorted(e.signature for _, e in entries) == ["mismatch:parity:loss", "mismatch:parity:param"]


# --------------------------------------------------------------------------------------------
# Merging


def test_merge_large_then_small_keeps_small_and_adds_counts(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry(_large_case(), count=2, summary="large"))
    path, merged = save_entry(tmp_path, _entry(_small_case(), count=3, summary="small"))
    assert merged.case == _small_case()
    assert merged.summary == "small"
    assert merged.count == 5
    assert load_entry(path) == merged
    assert len(_files(tmp_path)) == 1


def test_merge_small_then_large_keeps_small_and_adds_counts(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry(_small_case(), summary="small"))
    path, merged = save_entry(tmp_path, _entry(_large_case(), summary="large"))
    assert merged.case == _small_case()
    assert merged.summary == "small"
    assert merged.count == 2
    assert load_entry(path) == merged
    assert len(_files(tmp_path)) == 1


def test_merge_counts_accumulate_over_many_saves(tmp_path: Path) -> None:
    for _ in range(4):
        path, merged = save_entry(tmp_path, _entry())
    assert merged.count == 4
    assert load_entry(path).count == 4


@pytest.mark.parametrize("new_case", [_small_case, _large_case], ids=["new-is-smaller", "new-is-larger"])
def test_known_status_and_upstream_survive_merge(tmp_path: Path, new_case: Any) -> None:
    old_case = _large_case() if new_case is _small_case else _small_case()
    save_entry(tmp_path, _entry(old_case, status="known", upstream="pytorch/pytorch#12345"))
    path, merged = save_entry(tmp_path, _entry(new_case(), status="new", upstream=None))
    assert merged.status == "known"
    assert merged.upstream == "pytorch/pytorch#12345"
    on_disk = load_entry(path)
    assert on_disk.status == "known"
    assert on_disk.upstream == "pytorch/pytorch#12345"
    assert on_disk.count == 2


def test_upstream_set_by_person_survives_without_known_status(tmp_path: Path) -> None:
    save_entry(tmp_path, _entry(_large_case(), upstream="pytorch/pytorch#777"))
    _, merged = save_entry(tmp_path, _entry(_small_case()))
    assert merged.upstream == "pytorch/pytorch#777"


def test_person_edited_file_survives_merge(tmp_path: Path) -> None:
    """A person marks the entry known by editing the JSON file; the next hit keeps the mark."""
    path, _ = save_entry(tmp_path, _entry(_large_case()))
    data = json.loads(path.read_text())
    data["status"] = "known"
    data["upstream"] = "https://github.com/pytorch/pytorch/issues/42"
    path.write_text(json.dumps(data))
    _, merged = save_entry(tmp_path, _entry(_small_case()))
    assert merged.case == _small_case()
    assert merged.status == "known"
    assert merged.upstream == "https://github.com/pytorch/pytorch/issues/42"
    assert load_entry(path).status == "known"


def test_save_over_corrupted_entry_replaces_it(tmp_path: Path) -> None:
    entry = _entry()
    (tmp_path / entry.file_name).write_text("{not json")
    path, saved = save_entry(tmp_path, entry)
    assert saved == entry
    assert load_entry(path) == entry


# --------------------------------------------------------------------------------------------
# Atomic writes


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path, _ = save_entry(tmp_path, _entry(_large_case()))
    save_entry(tmp_path, _entry(_small_case()))
    save_entry(tmp_path, _entry(signature="exception:parity:RuntimeError@torch/x.py:f"))
    names = _files(tmp_path)
    assert len(names) == 2
    assert path.name in names
    assert all(n.endswith(".json") and not n.startswith(".") for n in names), names


def test_failed_write_leaves_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, first = save_entry(tmp_path, _entry(_large_case()))
    before = path.read_text()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_entry(tmp_path, _entry(_small_case()))
    monkeypatch.undo()
    assert _files(tmp_path) == [path.name]
    assert path.read_text() == before
    assert load_entry(path) == first


# --------------------------------------------------------------------------------------------
# Bad files


def _good_data() -> dict[str, Any]:
    return _entry().to_json()


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _load_error(path: Path) -> ShardfuzzError:
    with pytest.raises(ShardfuzzError) as info:
        load_entry(path)
    assert str(path) in str(info.value)
    return info.value


def test_load_corrupted_json(tmp_path: Path) -> None:
    err = _load_error(_write(tmp_path / "broken.json", '{"schema": 1, "kind": '))
    assert "cannot read" in str(err)


def test_load_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    _load_error(path)


def test_load_missing_file(tmp_path: Path) -> None:
    _load_error(tmp_path / "nope.json")


@pytest.mark.parametrize("data", [[1, 2], "a string", 3, None])
def test_load_non_object(tmp_path: Path, data: Any) -> None:
    err = _load_error(_write(tmp_path / "list.json", json.dumps(data)))
    assert "JSON object" in str(err)
    assert type(data).__name__ in str(err)


def test_load_newer_schema(tmp_path: Path) -> None:
    data = _good_data()
    data["schema"] = ENTRY_SCHEMA + 1
    err = _load_error(_write(tmp_path / "future.json", data))
    assert "newer" in str(err)
    assert "upgrade" in str(err)


def test_load_missing_schema(tmp_path: Path) -> None:
    data = _good_data()
    del data["schema"]
    err = _load_error(_write(tmp_path / "noschema.json", data))
    assert "schema" in str(err)


def test_load_bad_case_names_file_and_field(tmp_path: Path) -> None:
    data = _good_data()
    data["case"]["body"]["tree"]["root"]["children"][0]["kind"] = "conv3d"
    err = _load_error(_write(tmp_path / "badcase.json", data))
    assert "case.body.tree.root.children[0].kind" in str(err)
    assert "conv3d" in str(err)


def test_load_missing_case(tmp_path: Path) -> None:
    data = _good_data()
    del data["case"]
    _load_error(_write(tmp_path / "nocase.json", data))


@pytest.mark.parametrize("name", ["kind", "signature"])
def test_load_non_string_kind_or_signature(tmp_path: Path, name: str) -> None:
    data = _good_data()
    data[name] = 3
    err = _load_error(_write(tmp_path / "badfield.json", data))
    assert repr(name) in str(err)


def test_load_unknown_status(tmp_path: Path) -> None:
    data = _good_data()
    data["status"] = "fixed"
    err = _load_error(_write(tmp_path / "status.json", data))
    assert "'fixed'" in str(err)


@pytest.mark.parametrize("name", ["count", "reruns", "reproduced"])
def test_load_non_integer_counter(tmp_path: Path, name: str) -> None:
    data = _good_data()
    data[name] = "many"
    path = _write(tmp_path / "counter.json", data)
    with pytest.raises(ShardfuzzError) as info:
        load_entry(path)
    assert str(path) in str(info.value)


def test_load_corpus_skips_bad_files_with_one_problem_each(tmp_path: Path) -> None:
    good_a, _ = save_entry(tmp_path, _entry(_small_case()))
    good_b, _ = save_entry(tmp_path, _entry(_large_case(), signature="hang:parity@torch/distributed/x.py:wait"))
    future = _good_data()
    future["schema"] = ENTRY_SCHEMA + 1
    badcase = _good_data()
    badcase["case"]["world_size"] = "two"
    bad = [
        _write(tmp_path / "corrupt.json", "{{{"),
        _write(tmp_path / "array.json", "[]"),
        _write(tmp_path / "future.json", future),
        _write(tmp_path / "badcase.json", badcase),
    ]
    (tmp_path / "notes.txt").write_text("not an entry, ignored")

    entries, problems = load_corpus(tmp_path)

    assert sorted(p for p, _ in entries) == sorted([good_a, good_b])
    assert {e.signature for _, e in entries} == {SIGNATURE, "hang:parity@torch/distributed/x.py:wait"}
    assert len(problems) == len(bad)
    for path in bad:
        assert sum(str(path) in message for message in problems) == 1, (path, problems)


def test_load_corpus_of_missing_directory(tmp_path: Path) -> None:
    assert load_corpus(tmp_path / "absent") == ([], [])


def test_load_corpus_of_empty_directory(tmp_path: Path) -> None:
    assert load_corpus(tmp_path) == ([], [])


# --------------------------------------------------------------------------------------------
# entry_from_failure


def _failure() -> Failure:
    return Failure("mismatch", SIGNATURE, "loss differs", {"check": "loss"})


@pytest.mark.parametrize(("reruns", "reproduced", "status"), [(3, 3, "new"), (3, 1, "flaky"), (0, 0, "new")])
def test_entry_from_failure(tmp_path: Path, reruns: int, reproduced: int, status: str) -> None:
    entry = entry_from_failure(
        _small_case(),
        _failure(),
        versions={"torch": "2.13.0"},
        backend="gloo",
        device_kind="cpu",
        reruns=reruns,
        reproduced=reproduced,
    )
    assert entry.case == _small_case()
    assert entry.kind == "mismatch"
    assert entry.signature == SIGNATURE
    assert entry.summary == "loss differs"
    assert entry.details == {"check": "loss"}
    assert entry.status == status
    assert entry.reruns == reruns
    assert entry.reproduced == reproduced
    assert entry.count == 1
    assert entry.versions["torch"] == "2.13.0"
    assert entry.versions["hypothesis"] == hypothesis.__version__
    assert entry.versions["python"] == platform.python_version()
    assert entry.found_at.endswith("+00:00")
    path, _ = save_entry(tmp_path, entry)
    assert load_entry(path) == entry
