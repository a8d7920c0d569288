"""The meaning-keeping rewrites of reduced scripts (fuzz/repro/simplify.py): each one on its own,
the script's result unchanged, and what must not be rewritten left alone. Fast: pure AST work,
the scripts executed in this process."""

from __future__ import annotations

import textwrap
from typing import Any

from fuzz.repro.simplify import simplify

HEAD = """
import enum
from dataclasses import dataclass, field


class Kind(str, enum.Enum):
    A = 'a'
    B = 'b'


@dataclass
class Composed:
    model: object


@dataclass
class Side:
    composed: object
    training: object = 3
    opt: object = None

    @property
    def model(self):
        return self.composed.model
"""


def _run(code: str) -> Any:
    space: dict[str, Any] = {}
    exec(compile(code, "<script>", "exec"), space)
    return space["attempt"]()


def _script(body: str) -> str:
    return HEAD + "\n\ndef attempt():\n" + textwrap.indent(textwrap.dedent(body), "    ")


def _simplified(body: str) -> str:
    code = _script(body)
    out = simplify(code)
    assert out is not None, "no rewrite applied"
    assert _run(out) == _run(code)
    return out[out.index("def attempt") :]


def test_an_object_used_by_its_attributes_becomes_locals() -> None:
    out = _simplified(
        """
        model = [1, 2]
        composed = Composed(model)
        side = Side(composed=composed)
        side.opt = len(side.model)
        return side.opt + side.training
        """
    )
    assert "Side(" not in out and "Composed(" not in out
    # model, read once by the next statement, is computed there (the read-next rewrite)
    assert "side_opt = len([1, 2])" in out and "side_opt + 3" in out, out


def test_a_field_handed_away_with_its_object_is_not_replaced() -> None:
    code = _script(
        """
        def fill(s):
            s.opt = 7
        side = Side(composed=Composed(1))
        fill(side)
        return side.opt
        """
    )
    out = simplify(code)
    assert _run(out or code) == 7
    assert out is None or "return side.opt" in out


def test_a_table_lookup_becomes_its_value_and_an_enum_test_its_branch() -> None:
    code = HEAD + textwrap.dedent(
        """
        TABLE = {Kind.A: 'x', Kind.B: 'y'}


        def attempt():
            kind = Kind.B
            if kind is Kind.A:
                return 'wrong'
            first = next(iter((Kind.A, Kind.B)))
            extra = {n: 1 for n in ()}
            return TABLE[first] + str(dict(**extra)) + str(kind in (Kind.A,))
        """
    )
    out = simplify(code)
    assert out is not None and _run(out) == _run(code) == "x{}False"
    body = out[out.index("def attempt") :]
    assert "if " not in body and "TABLE[" not in body and "next(" not in body and "extra" not in body


def test_an_enum_members_value_becomes_its_constant_and_a_loop_over_members_is_written_out() -> None:
    """``Kind.A.value`` is the constant the class assigns; a loop over a display of members is
    written out like one over constants, and its tests of the member become branches taken."""
    from fuzz.repro import delta

    code = HEAD + textwrap.dedent(
        """
        def attempt():
            out = {}
            for kind in (Kind.A, Kind.B):
                if kind is Kind.A:
                    out[kind.value] = 1
                else:
                    out[kind.value] = 2
            return out[Kind.B.value] + out[Kind.A.value]
        """
    )
    (key,) = delta.literal_loops(code)
    out = delta.unroll_loop(code, key)
    assert out is not None and "for kind" not in out
    out = simplify(out) or out
    assert _run(out) == _run(code) == 3
    body = out[out.index("def attempt") :]
    assert ".value" not in body and "if " not in body, body
    # a loop whose body rebinds the members' class is left
    rebinding = code.replace("out[kind.value] = 2", "Kind = None")
    assert delta.literal_loops(rebinding) == []


#: A table of builds of a dataclass whose decorator has lost ``frozen=True``.
POLICY = """

@dataclass()
class Tolerance:
    rtol: object
    atol: object


POLICY = {'float32': Tolerance(rtol=1e-05, atol=1e-06)}
"""


def test_a_table_of_builds_becomes_the_build_and_its_fields_their_values() -> None:
    """``POLICY['float32'].atol``, where ``POLICY`` maps to builds of a dataclass whose fields
    nothing in the script assigns (its decorator has lost ``frozen=True``), becomes the value."""
    code = (
        HEAD
        + POLICY
        + textwrap.dedent(
            """
        def attempt():
            tol = POLICY['float32']
            return tol.atol + tol.rtol * 2
        """
        )
    )
    out = simplify(code)
    assert out is not None and _run(out) == _run(code)
    body = out[out.index("def attempt") :]
    assert "POLICY" not in body and "tol." not in body, body


def test_a_table_of_builds_of_a_class_something_changes_is_left() -> None:
    code = (
        HEAD
        + POLICY
        + textwrap.dedent(
            """
        def attempt():
            POLICY['float32'].atol = 0.5
            tol = POLICY['float32']
            return tol.atol
        """
        )
    )
    out = simplify(code)
    assert _run(out or code) == 0.5
    assert out is None or "POLICY['float32']" in out


def test_a_table_something_changes_is_left() -> None:
    code = HEAD + textwrap.dedent(
        """
        TABLE = {'a': 1}


        def attempt():
            TABLE['a'] = 2
            return TABLE['a']
        """
    )
    out = simplify(code)
    assert out is None or "return TABLE['a']" in out
    assert _run(out or code) == 2


def test_main_and_frozen_definitions_are_not_rewritten() -> None:
    code = HEAD + textwrap.dedent(
        """
        def judge():
            kind = Kind.A
            return kind is Kind.A


        def main():
            kind = Kind.A
            return kind is Kind.B
        """
    )
    assert simplify(code, frozenset({"judge"})) is None


def test_a_dict_of_constant_keys_becomes_locals_and_unread_imports_go() -> None:
    out = _simplified(
        """
        from math import pi, tau
        from math import e
        out = {}
        out[Kind.A] = 2
        out['total'] = out[Kind.A] + 1
        return out['total'] * e
        """
    )
    # out_a, bound to a constant, went too, and out_total, read once next, is computed there
    assert "out = {}" not in out and "return (2 + 1) * e" in out, out
    assert "from math import e\n" in out and "pi" not in out


def test_a_dict_keyed_by_locals_bound_to_one_constant_becomes_one_local() -> None:
    """``meshes[key] = ...`` then ``meshes[key_]``, ``key`` and ``key_`` both bound once to ``()``
    (a cache of the rank context, flattened): one local, read twice."""
    out = _simplified(
        """
        meshes = {}
        key = ()
        meshes[key] = [3]
        first = meshes[key]
        again = ()
        second = meshes[again]
        width = 2
        return first is second, first * width
        """
    )
    assert "meshes = {}" not in out and "key" not in out and "again" not in out, out
    assert "meshes_empty = [3]" in out and "* 2" in out, out


def test_an_empty_dict_unpacked_into_a_display_goes() -> None:
    out = _simplified(
        """
        extra = {}
        seen = {'a': 1}
        return {**seen, **extra}
        """
    )
    assert "extra" not in out and "{**{'a': 1}}" in out, out  # seen, read once next, is written there


def test_a_local_bound_again_keeps_its_name() -> None:
    code = _script(
        """
        width = 2
        width = width + 1
        print(width)
        return width * 10
        """
    )
    out = simplify(code)
    assert out is None or "width = width + 1" in out
    assert _run(out or code) == 30


def test_a_local_returned_at_once_is_the_returned_expression() -> None:
    out = _simplified(
        """
        width = 2
        width = width + 1
        return width
        """
    )
    assert "return 2 + 1" in out, out


def test_a_dict_handed_on_whole_stays_a_dict() -> None:
    code = _script(
        """
        out = {}
        out['a'] = 1
        return sorted(out)
        """
    )
    out = simplify(code)
    # Not split into one local per key (the bags rewrite); filled in place is the same dict.
    assert out is None or "out = {}" in out or "sorted({'a': 1})" in out, out
    assert _run(out or code) == ["a"]


def test_a_comprehension_over_one_element_becomes_its_item() -> None:
    out = _simplified(
        """
        specs = {'': s for s in (Composed(model=2),)}
        paths = [p + '.' for p in ('a',)]
        return specs[''].model, paths
        """
    )
    assert " for " not in out and "['a' + '.']" in out


def test_a_test_on_a_display_takes_its_branch_and_a_tuple_assignment_splits() -> None:
    out = _simplified(
        """
        modules = [1, 2]
        first = modules if () else modules[0]
        a, b = (first, 3)
        return a + b
        """
    )
    assert " if " not in out and "a, b" not in out


def test_identities_go() -> None:
    code = (
        "def f(rank, world_size, x):\n"
        "    lo = rank // 1 * 1\n"
        "    return (lo, [] + [], (x, *()), world_size * 1 + 0, x - 0)\n"
        "def attempt(rank, world_size):\n"
        "    return str(f(rank, world_size, 3))\n"
    )
    out = simplify(code)
    assert out is not None and "return (rank, [], (x,), world_size, x)" in out


def test_appends_to_an_empty_list_become_its_display() -> None:
    code = (
        "def f(a, b, xs):\n"
        "    out = []\n"
        "    out.append(a)\n"
        "    out += [b]\n"
        "    more = []\n"
        "    more += [x * 2 for x in xs]\n"
        "    mine = dict()\n"
        "    mine['k'] = out\n"
        "    return mine, more\n"
        "def attempt(rank, world_size):\n"
        "    return str(f(1, 2, [3]))\n"
    )
    out = simplify(code)
    assert out is not None and "{'k': [a, b]}" in out and "[x * 2 for x in xs]" in out, out
    assert "append" not in out and "dict()" not in out
    scope: dict[str, Any] = {}
    exec(out, scope)
    assert scope["attempt"](0, 1) == "({'k': [1, 2]}, [6])"


def test_appends_after_statements_that_do_not_name_the_list_move_its_binding_down() -> None:
    code = (
        "def f(a, b):\n"
        "    out = []\n"
        "    step = []\n"
        "    x = a + 1\n"
        "    step.append((x, b))\n"
        "    out.append(step)\n"
        "    return out, x\n"
        "def attempt(rank, world_size):\n"
        "    return str(f(1, 2))\n"
    )
    out = simplify(code)
    # step and out, each read once next, are written where they are read
    assert out is not None and "append" not in out and "return ([[(x, b)]], x)" in out, out
    assert out.index("x = a + 1") < out.index("[(x, b)]")
    scope: dict[str, Any] = {}
    exec(out, scope)
    assert scope["attempt"](0, 1) == "([[(2, 2)]], 2)"


def test_a_starred_display_is_spliced() -> None:
    code = (
        "def f(a, b):\n    return (max(*[a, b]), [*(a,), b])\ndef attempt(rank, world_size):\n    return str(f(1, 2))\n"
    )
    out = simplify(code)
    assert out is not None and "return (max(a, b), [a, b])" in out, out


def test_keywords_unpacked_from_a_local_display_become_keywords() -> None:
    code = HEAD + textwrap.dedent(
        """

        def f(a, *, b=0, c=0):
            return a + b * c


        def attempt():
            kw = {'b': 2, 'c': 3}
            return [f(1, **kw), f(2, **kw)]
        """
    )
    out = simplify(code)
    assert out is not None and _run(out) == _run(code) == [7, 8]
    assert "**kw" not in out and "kw = " not in out and "f(2, b=2, c=3)" in out


def test_keywords_of_a_display_used_otherwise_stay_unpacked() -> None:
    code = HEAD + textwrap.dedent(
        """

        def f(**k):
            return sorted(k)


        def attempt():
            kw = {'b': 2}
            key = 'c' + str(len(kw))
            kw[key] = 3
            return f(**kw)
        """
    )
    out = simplify(code)
    assert out is None or "**kw" in out
    assert _run(out or code) == ["b", "c1"]


def test_a_comparison_of_constants_takes_its_branch() -> None:
    out = _simplified(
        """
        out = []
        if 'fully_shard' == 'checkpoint':
            out.append(1)
        else:
            out.append(2)
        if '' in ('', '0'):
            out.append(3)
        if not 'a' != 'a':
            out.append(4)
        if 1 == 1.0:
            out.append(5)
        return out
        """
    )
    assert " if " not in out and "if " not in out.split("\n", 1)[1], out


def test_a_display_indexed_in_place_becomes_the_item() -> None:
    out = _simplified(
        """
        a, b = [1], [2]
        first = {Kind.A: a, Kind.B: b}[Kind.A]
        second = [a, b][-1]
        both = [a, b, a][:2]
        return first, second, both, [a, b][1:]
        """
    )
    assert "Kind.B" not in out and "][" not in out and "[:2]" not in out, out


def test_a_display_read_once_where_only_its_items_matter_is_written_in_place() -> None:
    out = _simplified(
        """
        a, b = [1], [2]
        pair = (a, b)
        batches = [pair]
        data = [step[0] for step in batches]
        first = data[:1]
        x = next(iter(first))
        steps = [x]
        s, step = next(iter(enumerate(steps)))
        kept = [a]
        n = len(kept)
        kept.append(b)
        return step, s, n, kept
        """
    )
    assert "batches" not in out and "data" not in out and "first" not in out and "enumerate" not in out, out
    assert "kept = [a]" in out, out  # read twice: written in place, the append would be lost


def test_a_conditional_expression_with_the_same_branches_is_that_branch() -> None:
    code = "def f(model, comp):\n    forward = model.m if comp is not None else model.m\n    return forward\n"
    out = simplify(code)
    assert out is not None and "if comp" not in out and "model.m" in out
    impure = "def f(model, comp):\n    return model.m if g(comp) else model.m\n"
    assert "if g(comp)" in (simplify(impure) or impure)


def test_a_function_that_ends_in_if_return_returns_a_conditional_expression() -> None:
    code = "def f(bad):\n    x = 1\n    if bad is not None:\n        return x + bad\n"
    out = simplify(code)
    assert out is not None and "return 1 + bad if bad is not None else None" in out
    namespace: dict[str, Any] = {}
    exec(out, namespace)
    assert namespace["f"](None) is None and namespace["f"](2) == 3
    two = "def f(bad):\n    if bad:\n        return 1\n    if bad is None:\n        return 2\n"
    assert "if bad is None:\n        return 2" in (simplify(two) or two)  # two returns: left


def test_an_enum_member_is_never_none() -> None:
    code = (
        "import enum\n"
        "class Kind(str, enum.Enum):\n"
        "    A = 'a'\n"
        "def f(table):\n"
        "    return None if Kind.A is None else table[Kind.A]\n"
    )
    out = simplify(code)
    assert out is not None and "return table[Kind.A]" in out


def test_a_dict_filled_key_by_key_and_unpacked_next_becomes_keywords() -> None:
    code = "def f(m, g, make):\n    kwargs = {}\n    kwargs['policy'] = make()\n    g(m, **kwargs)\n"
    out = simplify(code)
    assert out is not None and "g(m, policy=make())" in out and "kwargs" not in out
    # Read later than the next statement: ``make()`` stays where it was computed.
    later = code.replace("    g(m, **kwargs)\n", "    print(m)\n    g(m, **kwargs)\n")
    out = simplify(later) or later
    assert "kwargs = {'policy': make()}" in out and "g(m, **kwargs)" in out


def test_imports_of_one_thing_under_several_names_become_one() -> None:
    code = (
        "def f():\n"
        "    import os.path as p_\n"
        "    x = p_.join('a', 'b')\n"
        "    import os.path as p\n"
        "    from os import sep as SEP__\n"
        "    from os import sep as SEP\n"
        "    return (x, p.basename(x), SEP__, SEP)\n"
    )
    out = simplify(code)
    assert out is not None and out.count("import") == 2, out
    assert "import os.path as p\n" in out and "from os import sep as SEP\n" in out
    namespace: dict[str, Any] = {}
    exec(out, namespace)
    assert namespace["f"]()[:2] == ("a/b", "b")


def test_getattr_of_an_object_built_in_place_and_its_none_tests_become_values() -> None:
    out = _simplified(
        """
        side = Side(composed=Composed(1))
        count = getattr(side, '_cases', 0)
        given = getattr(side, 'training', 9)
        known = 1 if side is not None else 2
        return (count, given, known, side is None)
        """
    )
    assert "getattr" not in out and " is " not in out, out
    assert "(0, 3, 1, False)" in out, out


def test_getattr_of_a_name_something_may_set_is_left() -> None:
    code = _script(
        """
        def fill(s):
            s._cases = 7
        side = Side(composed=Composed(1))
        fill(side)
        return getattr(side, '_cases', 0)
        """
    )
    out = simplify(code)
    assert _run(out or code) == 7
    assert out is None or "getattr(side, '_cases', 0)" in out


PARAMETERS = """
@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    kind: object = Kind.A


@dataclass(frozen=True)
class Case:
    training: object
    steps: object = 2


def train(case, n):
    return (case.training.lr * n + case.steps, case.training.kind is Kind.A, case is None)


def run(case, n):
    return train(case, n)
"""


def _with_parameters(body: str) -> str:
    return HEAD + PARAMETERS + "\n\ndef attempt():\n" + textwrap.indent(textwrap.dedent(body), "    ")


def test_a_parameter_every_call_passes_the_same_build_reads_its_fields_across_the_calls() -> None:
    code = _with_parameters(
        """
        case = Case(training=Training(lr=0.5))
        return [run(case, 3), train(Case(Training(0.5)), 4)]
        """
    )
    out = simplify(code)
    assert out is not None
    assert _run(out) == _run(code)
    train = out[out.index("def train") : out.index("def run")]
    # through the caller's local, the caller's own parameter, a positional build and a
    # default: the fields of the one build every call passes
    assert "case." not in train and "0.5 * n + 2" in train, train
    assert "False" in train  # a parameter bound to a build is never None


def test_a_parameter_calls_pass_different_builds_for_keeps_its_fields() -> None:
    code = _with_parameters(
        """
        return [run(Case(Training(lr=0.5)), 3), train(Case(Training(lr=0.7)), 4)]
        """
    )
    out = simplify(code) or code
    assert _run(out) == _run(code)
    train = out[out.index("def train") : out.index("def run")]
    assert "case.training.lr" in train, train


def test_a_function_named_other_than_in_a_call_keeps_its_parameters() -> None:
    code = _with_parameters(
        """
        step = train
        return [run(Case(Training(lr=0.5)), 3), step(Case(Training(lr=0.7)), 4)]
        """
    )
    out = simplify(code) or code
    assert _run(out) == _run(code)
    train = out[out.index("def train") : out.index("def run")]
    assert "case.training.lr" in train, train


def test_a_build_of_a_mutable_dataclass_is_not_followed_across_calls() -> None:
    code = HEAD + textwrap.dedent(
        """
        def peek(side):
            return side.training


        def attempt():
            side = Side(composed=Composed(model=1), training=4)
            side.training = 5
            return peek(side)
        """
    )
    out = simplify(code) or code
    assert _run(out) == _run(code) == 5


def test_a_value_read_once_by_the_next_statement_is_computed_there() -> None:
    """``x = f(); g(x)`` becomes ``g(f())`` where nothing runs before the read; a read after a
    call, one in a branch that may not run, and a value read twice stay as they are."""
    out = _simplified(
        """
        log = []
        def f(v):
            log.append(v)
            return v
        a = f(1)
        b = [a, 2]
        c = f(3)
        d = f(4) if c else f(c)
        e = f(5)
        g = f(6) + e
        h = f(7)
        return (b, d, g, h, h, log)
        """
    )
    assert "b = [f(1), 2]" in out, out
    assert "c = f(3)" in out, out  # read in a branch: it could run once, or never
    assert "e = f(5)" in out, out  # read after f(6) runs
    assert "h = f(7)" in out, out  # read twice


def test_keys_of_enum_members_fill_a_dict_display() -> None:
    out = _simplified(
        """
        out = {}
        out[Kind.A] = 1
        out[Kind.B] = 2
        return out
        """
    )
    assert "out = {Kind.A: 1, Kind.B: 2}" in out or "return {Kind.A: 1, Kind.B: 2}" in out, out


def test_a_tuple_assignment_of_any_values_splits_and_an_update_fills_the_display() -> None:
    out = _simplified(
        """
        obs = {}
        done = {}
        done['a'], done['b'] = (len('xy'), [1])
        obs.update(done)
        seen = {}
        seen.update({'k': sorted('ba')})
        first, rest = (seen, obs)
        return first, rest
        """
    )
    assert "done" not in out and "update" not in out, out
    assert "{'a': len('xy'), 'b': [1]}" in out and "{'k': sorted('ba')}" in out, out


def test_a_tuple_assignment_whose_values_read_its_targets_stays() -> None:
    code = _script(
        """
        d = {'a': 1}
        d['a'], d['b'] = (2, d['a'])
        return d
        """
    )
    out = simplify(code) or code
    assert _run(out) == _run(code) == {"a": 2, "b": 1}
