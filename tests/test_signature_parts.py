"""Signatures as parts (fuzz.signature.Signature): every signature the corpus holds parses into
parts that write back the same text, and text the suite did not write is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fuzz.corpus import load_corpus
from fuzz.signature import Signature, same_bug, shorten

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
SIGNATURES = sorted({s for _, e in load_corpus(CORPUS)[0] for s in e.signatures})


@pytest.mark.parametrize("text", SIGNATURES)
def test_corpus_signatures_round_trip(text: str) -> None:
    parts = Signature.parse(text)
    assert parts is not None and str(parts) == text


def test_parts() -> None:
    assert Signature.parse("mismatch:metamorphic@fsdp1:frozen-int-reshard") == Signature(
        "mismatch", "metamorphic", "", "fsdp1", ("frozen-int-reshard",)
    )
    assert Signature.parse("exception:parity:builtins.IndexError@torch/a.py:f") == Signature(
        "exception", "parity", "builtins.IndexError", "torch/a.py:f"
    )
    hang = "hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone"
    assert Signature.parse(hang) == Signature("hang", "dcp", "", hang.split("@")[1])
    assert Signature.parse("mismatch:invalid:uneven_shard_dim_1:no-error") == Signature(
        "mismatch", "invalid", "uneven_shard_dim_1:no-error"
    )


@pytest.mark.parametrize("text", ["", "foo", "mismatch:", "exception:parity", "exception:parity:X", "other:p:x@y"])
def test_text_the_suite_did_not_write_is_refused(text: str) -> None:
    assert Signature.parse(text) is None


def test_same_bug_reads_the_parts() -> None:
    assert same_bug("mismatch:parity@fsdp2:shard1", "mismatch:metamorphic@fsdp2:shard1:frozen-int-reshard")
    assert not same_bug("mismatch:parity@fsdp2:shard1", "mismatch:parity@fsdp1:shard1")
    assert not same_bug("mismatch:parity@fsdp2", "mismatch:parity@fsdp2:shard1")  # an untagged family is no bug
    assert not same_bug("mismatch:dcp:optimizer@save", "mismatch:dcp:resume_loss@save")
    assert same_bug("exception:parity:builtins.X@torch/a.py:f", "exception:dcp:builtins.X@torch/a.py:f")
    assert not same_bug("exception:parity:builtins.X@torch/a.py:f", "exception:parity:builtins.Y@torch/a.py:f")


def test_shorten_cuts_at_a_word() -> None:
    text = "attempting to assign a gradient with dtype BFloat16 to a tensor with grad_dtype Float"
    out = shorten(text, 40)
    assert len(out) <= 40 and out.endswith("…") and text.startswith(out[:-1]) and not out[:-1].endswith(" ")
    assert text[len(out) - 1] == " "
    assert shorten("short", 40) == "short"


def test_the_torch_frame_rule_has_one_home_which_every_script_carries() -> None:
    """fuzz.signature.torch_frame is the rule; scripts carry its source (without the docstring),
    and what they carry behaves as it does."""
    import inspect
    import textwrap

    from fuzz.repro.print_model import PRINTED_MARK
    from fuzz.signature import location, torch_frame

    def torch_frame_source() -> str:  # as the kept reduced scripts carry it: without the docstring
        fn = ast.parse(textwrap.dedent(inspect.getsource(torch_frame))).body[0]
        assert isinstance(fn, ast.FunctionDef)
        fn.body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        return ast.unparse(fn) + "\n"

    carried: dict[str, object] = {}
    exec(compile(torch_frame_source(), "carried", "exec"), carried)
    frames = [
        ("/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "shard"),
        ("/home/u/torch/.venv/lib/python3.11/site-packages/tqdm/_monitor.py", "run"),  # another package
        ("/work/fuzz/_rank/torch/x.py", "f"),  # shardfuzz's own
        ("/venv/site-packages/torch/nn/modules/module.py", "<listcomp>"),  # inlined on 3.12
        ("/tmp/repro.py", "attempt"),
    ]
    for path, function in frames:
        assert carried["torch_frame"](path, function) == torch_frame(path, function)  # type: ignore[operator]
    assert torch_frame(*frames[0]) == "torch/distributed/fsdp/_fully_shard/_fsdp_param.py:shard"
    assert [torch_frame(*f) for f in frames[1:]] == [None] * 4
    text = "".join(f'  File "{p}", line 1, in {f}\n' for p, f in frames[:2])
    assert location(text) == torch_frame(*frames[0])
    for path in sorted(CORPUS.glob("*.repro.py")):
        if "-mismatch-" in path.name or PRINTED_MARK in path.read_text():
            continue  # a mismatch's script reads no frames; a printed one reads them with print_check.FRAME
        tree = ast.parse(path.read_text())
        kept = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "torch_frame"]
        assert [ast.dump(n) for n in kept] == [ast.dump(ast.parse(torch_frame_source()).body[0])], path.name
