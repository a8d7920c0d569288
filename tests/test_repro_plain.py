"""The plain form of an exception's reduced script (fuzz/repro/harness.py): the case without the
check around it, the exception left to propagate; the check's rule applied from outside to what
the ranks printed, and the checked form recovered from the plain one for a further reduction."""

from __future__ import annotations

import ast

from fuzz.corpus import load_entry
from fuzz.repro.harness import NO_RANK_RAISED, checked, exception_rule, is_plain, plain, raised_verdicts
from fuzz.repro.printed import is_printed
from fuzz.repro.specialize import render_flat
from tests.conftest import ROOT

#: An exception entry whose rule names its entry API and its message's shape.
ENTRY = "state_dict-exception-b39fcc19147a"


def _entry():  # type: ignore[no-untyped-def]
    return load_entry(ROOT / "corpus" / f"{ENTRY}.json")


def _checked_script() -> str:
    """A checked flat script as the reducer holds one: ``attempt`` runs a case in the check."""
    entry = _entry()
    body = "    import torch\n    torch.zeros(1)\n    return None\n"
    plain_code = f"import torch\n\ndef attempt(rank, world_size):\n{body}"
    return checked(plain_code, entry, entry.signature)


def test_the_plain_form_drops_the_check_and_keeps_the_case() -> None:
    code = _checked_script()
    entry = _entry()
    assert "REPRODUCED" in code and "except BaseException" in code and not is_plain(code)
    out = plain(code, entry, entry.signature)
    assert out is not None and is_plain(out)
    tree = ast.parse(out)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attempt")
    assert [ast.unparse(s) for s in fn.body] == ["import torch", "torch.zeros(1)", "return None"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    # the check is the __main__ block's: the signature's rule, exit 1 / 2, rank 0's PASS once all passed
    block = ast.unparse(tree.body[-1])
    assert "except BaseException" in block and "os._exit(2)" in block and "print('PASS: no rank raised'" in block
    assert "torch_frame(p, f)" in block
    # Undone, it is the checked form again (the further reduction's attempts are judged by it).
    assert ast.dump(ast.parse(checked(out, entry, entry.signature))) == ast.dump(ast.parse(code))
    assert plain(out, entry, entry.signature) is None  # nothing to take out


def test_a_plain_script_s_header_says_what_it_raises() -> None:
    entry = _entry()
    out = plain(_checked_script(), entry, entry.signature)
    assert out is not None
    script = render_flat(entry, "", entry.signature, out)
    head = [line for line in script.splitlines() if line.startswith("# ")]
    said = " ".join(line[2:] for line in head)
    assert "builtins.KeyError in torch/distributed/_state_dict_utils.py:_unflatten_state_dict" in said
    assert "a rank raises builtins.KeyError" in said and "prints its traceback and REPRODUCED and exits 1" in said
    assert "rank 0 prints PASS" in said and "exits 2" in said
    assert ast.get_docstring(ast.parse(script)) is None  # prose as comments, not code


def _printed(rank: int, text: str) -> str:
    """``text`` as torch's excepthook prints it on rank ``rank`` (blank lines bare)."""
    return "\n".join(f"[rank{rank}]: {line}" if line else "" for line in text.splitlines())


_SITE = "/venv/lib/python3.11/site-packages/torch"
_TRACEBACK = f'''Traceback (most recent call last):
  File "/tmp/repro.py", line 40, in <module>
    attempt(dist.get_rank(), dist.get_world_size())
  File "/tmp/repro.py", line 30, in attempt
    set_optimizer_state_dict(model, opt, osd, options=options_)
  File "{_SITE}/distributed/checkpoint/state_dict.py", line 1300, in set_optimizer_state_dict
    _load_optim_state_dict(model, optimizers, optim_state_dict, info)
  File "{_SITE}/distributed/_state_dict_utils.py", line 700, in _unflatten_state_dict
    return state_dict[key]
           ~~~~~~~~~~^^^^^
KeyError: 'param_groups.0.params.0'
'''


def test_the_rule_read_from_the_ranks_tracebacks_matches_the_check_s() -> None:
    entry = _entry()
    expected, entered, shape = exception_rule(entry, entry.signature)
    assert "builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict" in expected
    assert entered == "torch/distributed/checkpoint/state_dict.py:set_optimizer_state_dict"
    assert shape == "'param_groups.#.params.#'"
    noise = "/tmp/repro.py:5: UserWarning: x\n  warnings.warn('x')\nW1128 some torchrun line\n"
    output = noise + _printed(1, _TRACEBACK) + "\n" + _printed(0, _TRACEBACK)
    verdicts = raised_verdicts(entry, output)
    assert [v.split(": rank ")[1][:1] for v in verdicts] == ["0", "1"]
    assert all(v.startswith(f"REPRODUCED {entry.signature}: rank ") for v in verdicts), verdicts
    # Another exception at the same place, another message, another way in: not the entry's.
    other = _TRACEBACK.replace("KeyError: 'param_groups.0.params.0'", "ValueError: bad")
    assert raised_verdicts(entry, _printed(0, other))[0].startswith("FAIL (not the entry's failure): rank 0")
    words = _TRACEBACK.replace("'param_groups.0.params.0'", "'state.0.exp_avg'")
    assert raised_verdicts(entry, _printed(0, words))[0].startswith("FAIL")
    elsewhere = _TRACEBACK.replace("in set_optimizer_state_dict", "in set_state_dict")
    assert raised_verdicts(entry, _printed(0, elsewhere))[0].startswith("FAIL")
    # No traceback printed (a rank that finished, or one torchrun ended): no verdict.
    assert raised_verdicts(entry, f"{NO_RANK_RAISED}\n[rank1]: something else\n") == []


def test_a_chained_exception_is_read_by_its_last_part_and_a_message_s_own_traceback_is_not() -> None:
    entry = _entry()
    cause = 'Traceback (most recent call last):\n  File "/x.py", line 1, in f\n    g()\nOSError: disk\n'
    chained = f"{cause}\nThe above exception was the direct cause of the following exception:\n\n{_TRACEBACK}"
    assert raised_verdicts(entry, _printed(0, chained))[0].startswith("REPRODUCED")
    # DCP's CheckpointException holds the other ranks' tracebacks in its message.
    message = _TRACEBACK.replace(
        "KeyError: 'param_groups.0.params.0'",
        "KeyError: 'param_groups.0.params.0'\nTraceback (most recent call last): (RANK 1)\n"
        '  File "/x.py", line 3, in h\n    h()\nRuntimeError: other',
    )
    assert raised_verdicts(entry, _printed(0, message))[0].startswith("REPRODUCED"), raised_verdicts(
        entry, _printed(0, message)
    )


def test_stored_exception_scripts_are_plain_where_they_were_confirmed_so() -> None:
    """The reducer keeps the plain form of an exception's script only where it reproduced under
    torchrun (and passed with the bug's fix where that is checked); the checked form otherwise."""
    stored = [p for p in sorted((ROOT / "corpus").glob("*-exception-*.repro.py")) if not is_printed(p.read_text())]
    plain_ones = [p for p in stored if is_plain(p.read_text())]
    assert len(plain_ones) >= len(stored) // 2, [p.name for p in stored if p not in plain_ones]
    for path in plain_ones:
        text = path.read_text()
        tree = ast.parse(text)
        assert text.count("def attempt(") == 1, path.name
        assert not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), path.name
        assert ast.unparse(tree.body[-1]).endswith("os._exit(0)") and f"print({NO_RANK_RAISED!r}" in text, path.name


def test_a_mismatch_script_is_never_given_an_exception_s_check() -> None:
    """A mismatch's ``attempt`` has no ``try`` either: :func:`checked` leaves it as it is."""
    entry = load_entry(ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json")
    code = "def attempt(rank, world_size):\n    return 'PASS or another failure: None'\n"
    assert checked(code, entry, entry.signature) == code
    text = (ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.repro.py").read_text()
    assert not is_plain(text) and checked(text, entry, entry.signature) == text


def test_a_message_s_shape_is_the_same_in_the_script_and_outside_whatever_a_set_s_order() -> None:
    """A set's repr in a message follows its items' hashes, which differ from one process to the
    next ("expects uniform gradient dtype but got {torch.float32, torch.bfloat16}"): both orders
    are one shape, in the checked script's own expression and in :func:`message_shape`."""
    import re

    from fuzz.repro.harness import _SHAPE_IN_SCRIPT, message_shape

    one = "FSDP reduce-scatter expects uniform gradient dtype but got {torch.float32, torch.bfloat16}"
    other = "FSDP reduce-scatter expects uniform gradient dtype but got {torch.bfloat16, torch.float32}\nmore"
    assert (
        message_shape(one)
        == message_shape(other)
        == ("FSDP reduce-scatter expects uniform gradient dtype but got {torch.bfloat#, torch.float#}")
    )
    for text in (one, other, "size 4 != 12 at 0.weight", "no braces", "{}", "{'b': 1, 'a': 22} and {x}"):
        assert eval(_SHAPE_IN_SCRIPT, {"re": re, "e": ValueError(text)}) == message_shape(text), text
    assert message_shape("got 'state.0.exp_avg'") != message_shape("got 'param_groups.0.params.0'")


def test_python_s_did_you_mean_is_not_part_of_the_message() -> None:
    """The traceback adds "Did you mean" to an AttributeError's line; ``str(e)``, which the
    entry holds, has none."""
    from fuzz.repro.harness import _exception_line

    text = (
        'Traceback (most recent call last):\n  File "/x/torch/a.py", line 1, in f\n    g()\n'
        "AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'. Did you mean: 'unsharded_param'?"
    )
    assert _exception_line(text) == (
        "builtins.AttributeError",
        "'FSDPParam' object has no attribute '_unsharded_param'",
    )


_MISMATCH_CHECK = """\
def attempt(rank, world_size):
    failure = judge(rank)
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2:tag']:
        import hashlib
        observed = hashlib.sha256(b'x').hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'
"""


def test_the_signature_free_check_takes_any_failure_and_names_the_entry_s_signature() -> None:
    from types import SimpleNamespace

    from fuzz.repro.harness import signature_free
    from fuzz.repro.reduce import passed, reproduced

    free = signature_free(_MISMATCH_CHECK, "mismatch:parity@fsdp2:tag")
    assert free is not None and ".signature" not in free and "hashlib" not in free
    assert signature_free("def attempt(rank, world_size):\n    return ''\n", "x") is None
    space: dict[str, object] = {}
    found = SimpleNamespace(signature="mismatch:parity@fsdp2", summary="w[0] is 1.0, expected 2.0")
    space["judge"] = lambda rank: found
    exec(free, space)
    verdict = space["attempt"](0, 2)  # type: ignore[operator]
    assert reproduced(1, verdict) == "mismatch:parity@fsdp2:tag" and verdict.endswith(found.summary)
    space["judge"] = lambda rank: None
    assert passed(space["attempt"](0, 2))  # type: ignore[operator]
