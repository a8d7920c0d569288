"""Delta debugging of flat reduced scripts (fuzz/repro/delta.py): each cut on its own, the harness
left alone (``main``, the guard, ``attempt``'s verdicts and exception check), frozen definitions
left as they are, and a whole run that cuts a script down while it reproduces. Fast: the oracle
executes the script in this process."""

from __future__ import annotations

import ast
import sys
import time
import types

from fuzz.repro import delta
from fuzz.repro.script import code_lines

SCRIPT = """
from __future__ import annotations
from contextlib import nullcontext
from dataclasses import dataclass


@dataclass(frozen=True)
class Body:
    width: object
    depth: object = 1


@dataclass(frozen=True)
class Case:
    body: object


TABLE = {"a": 1, "b": 2}


def unused_helper(x):
    return x * TABLE["a"]


def side_effect(log):
    log.append("side")
    log.append("more")


def build(width):
    size = width * 2
    if size == 6:
        raise ValueError("boom")
    return size


def run(case, log):
    side_effect(log)
    for i in range(3):
        log.append(i)
    with nullcontext() as unused:
        value = build(case.body.width) + 1
    return value


def attempt(rank, world_size):
    case = Case(body=Body(width=3))
    log = []
    try:
        run(case, log)
    except BaseException as e:
        if "boom" in str(e):
            return "REPRODUCED x: boom"
        return f"FAIL {e}"
    return "PASS " + repr(log)


def main():
    print(attempt(0, 1))


if __name__ == "__main__":
    main()
"""


def verdict(code: str) -> str:
    """What the script's ``attempt`` returns, run as the pool's ranks run it: a module of its own."""
    module = types.ModuleType("_candidate")
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "candidate", "exec"), module.__dict__)
        return str(module.attempt(0, 1))
    finally:
        del sys.modules[module.__name__]


def reproduces(code: str) -> bool:
    try:
        return verdict(code).startswith("REPRODUCED")
    except Exception:
        return False


def test_the_script_reproduces_as_written() -> None:
    assert reproduces(SCRIPT)


def test_the_harness_is_never_a_unit() -> None:
    tree = ast.parse(SCRIPT)
    cut = {ast.unparse(stmt) for stmt, _ in delta.units(tree)}
    assert not any("REPRODUCED" in text or "FAIL" in text or "PASS" in text for text in cut)
    assert not any(text.startswith(("def main", "def attempt", "if __name__", "print(")) for text in cut)
    assert "case = Case(body=Body(width=3))" in cut  # attempt's other statements may go
    assert "run(case, log)" in cut


def test_a_definition_goes_with_the_statements_that_name_it() -> None:
    out = delta.cut_definition(SCRIPT, "side_effect")
    assert out is not None and "side_effect" not in out and reproduces(out)
    assert delta.cut_definition(SCRIPT, "attempt") is None
    assert delta.cut_definition(SCRIPT, "nothing") is None


def test_a_body_becomes_pass_and_its_calls_go() -> None:
    out = delta.cut_body(SCRIPT, "side_effect")
    assert out is not None
    tidied = ast.unparse(delta.drop_idle_calls(ast.parse(out)))
    assert tidied.count("side_effect(") == 1 and reproduces(tidied)  # the definition alone
    assert "attempt" not in delta.bodies(SCRIPT) and "main" not in delta.bodies(SCRIPT)


def test_inlining_binds_the_parameters_and_hoists_a_nested_call() -> None:
    assert "build" in delta.inlinable(SCRIPT) and "run" in delta.inlinable(SCRIPT)
    out = delta.inline(SCRIPT, "build")
    assert out is not None and "def build" not in out and "build_out" in out and reproduces(out)
    out = delta.inline(out, "run")
    assert out is not None and "def run" not in out and reproduces(out)


def test_unwrapping_keeps_the_body() -> None:
    keys = delta.compounds(SCRIPT)
    assert any(k.startswith("for i in range(3)") for k in keys)
    assert not any(k.startswith("try") for k in keys)  # attempt's try holds its verdicts
    for key in keys:
        out = delta.unwrap(SCRIPT, key)
        assert out is not None
        ast.parse(out)
    loop = next(k for k in keys if k.startswith("for"))
    out = delta.unwrap(SCRIPT, loop)
    assert out is not None and "i = next(iter(range(3)))" in out and reproduces(out)


LOOP = """
def attempt():
    out = []
    for api, path in [('fully_shard', '0'), ('checkpoint', ''), ('fully_shard', '')]:
        if api == 'checkpoint':
            out.append('checkpoint ' + path)
        else:
            out.append([p for p in (path,)])
    for i in (1, 2):
        i = i + 1
    for f in [1, 2]:
        out.append(lambda: f)
    return out
"""


def test_a_loop_over_a_literal_is_written_out() -> None:
    """One copy of the body per item, the targets replaced by the item's values; not where the
    body binds a target or a function in it could read one later."""
    keys = delta.literal_loops(LOOP)
    assert len(keys) == 1 and keys[0].startswith("for api, path in"), keys
    out = delta.unroll_loop(LOOP, keys[0])
    assert out is not None and "for api" not in out
    assert "if 'checkpoint' == 'checkpoint':" in out and "out.append([p for p in ('0',)])" in out, out
    space: dict[str, object] = {}
    exec(out, space)
    before: dict[str, object] = {}
    exec(LOOP, before)
    got, want = space["attempt"](), before["attempt"]()  # type: ignore[operator]
    assert got[:3] == want[:3] and len(got) == len(want)


def test_an_element_goes_one_at_a_time() -> None:
    found = delta._elements(ast.parse(SCRIPT), frozenset())
    index = next(i for i, (node, field, _) in enumerate(found) if isinstance(node, ast.Dict))
    out = delta.cut_element(SCRIPT, index)
    assert out is not None and "TABLE = {'b': 2}" in out


def test_a_comprehension_s_condition_may_be_cut() -> None:
    code = "def attempt():\n    out = {'b': 2}\n    state = {k: out[k] for k in ('b',) if k in out}\n    return state\n"
    found = delta._elements(ast.parse(code), frozenset())
    (index,) = [i for i, (node, field, _) in enumerate(found) if field == "ifs"]
    out = delta.cut_element(code, index)
    assert out is not None and "for k in ('b',)}" in out, out


def test_fields_of_the_case_become_what_they_were_built_with() -> None:
    out = delta.propagate_objects(SCRIPT)
    assert out is None  # `case` is passed whole: nothing reads a field in the same function
    inlined = delta.inline(SCRIPT, "run")
    assert inlined is not None
    out = delta.propagate_objects(inlined)
    assert out is not None and "build(3)" in out and reproduces(out)


def test_aliases_are_replaced_by_what_they_name() -> None:
    tree = ast.parse("def f(a):\n    b = a\n    c = 2\n    return b + c\n")
    assert ast.unparse(delta.propagate_aliases(tree)) == "def f(a):\n    return a + 2"


def test_ddmin_cuts_the_script_down_and_leaves_the_harness() -> None:
    out = delta.ddmin(SCRIPT, reproduces, time.monotonic() + 60)
    assert reproduces(out)
    assert code_lines(out) < code_lines(SCRIPT) // 2, out
    for kept in ('return "REPRODUCED x: boom"', 'if "boom" in str(e):', "def main():", 'if __name__ == "__main__":'):
        assert kept.replace('"', "'") in out, out
    assert "side_effect" not in out and "TABLE" not in out and "unused_helper" not in out
    assert "log = []" in out  # a verdict reads it


def test_frozen_definitions_are_left_as_they_are() -> None:
    out = delta.ddmin(SCRIPT, reproduces, time.monotonic() + 60, frozen=frozenset({"build"}))
    assert reproduces(out)
    original = next(n for n in ast.parse(SCRIPT).body if isinstance(n, ast.FunctionDef) and n.name == "build")
    assert ast.unparse(original) in out
    assert delta.frozen_for(SCRIPT, {"unused_helper"}) == {"unused_helper", "TABLE"}


def test_a_frozen_class_loses_its_case_checks_and_what_only_they_name() -> None:
    code = (
        "from dataclasses import dataclass\n"
        "def rules(x):\n"
        "    if x < 0:\n"
        "        raise ValueError(x)\n"
        "@dataclass(frozen=True)\n"
        "class Body:\n"
        "    x: int\n"
        "    def __post_init__(self):\n"
        "        rules(self.x)\n"
        "    def double(self):\n"
        "        return 2 * self.x\n"
        "def judge(body):\n"
        "    assert isinstance(body, Body)\n"
        "    return body.double() > 2\n"
    )
    frozen = delta.frozen_for(code, {"judge"})
    assert frozen == {"judge", "Body", "rules"}
    out = delta.drop_validation(code, frozen)
    assert out is not None and "__post_init__" not in out and "def double" in out
    assert delta.frozen_for(out, {"judge"}) == {"judge", "Body"}
    assert delta.drop_validation(out, frozen) is None
    assert delta.drop_validation(code, frozenset({"judge"})) is None  # only the judge's classes


def test_a_parameter_nothing_reads_or_every_call_passes_alike_goes() -> None:
    code = (
        "class T:\n"
        "    def __init__(self, a, b, c=3):\n"
        "        self.a = a + c\n"
        "def f(case, x, tp=1, *, k=2):\n"
        "    return x // tp + k\n"
        "def g(n):\n"
        "    return n\n"
        "def attempt(rank, world_size):\n"
        "    t = T(1, 2)\n"
        "    y = [v for v in range(f(None, 4, k=2))]\n"
        "    h = g\n"
        "    return str((t.a, y, f(0, 5), h(g(1)), g(2)))\n"
    )
    keys = delta.parameters(code)
    # `case` (never read), `tp` and `k` (every call passes the same constant), `T.b`
    # (never read) and `T.a`, `T.c` (constants alike); `f.x` differs between calls, and `g` is
    # passed as a value: its calls cannot all be seen.
    assert set(keys) == {"T.a", "T.b", "T.c", "f.case", "f.tp", "f.k"}
    before = verdict(code)
    out = code
    for key in keys:
        out = delta.drop_parameter(out, key) or out
    assert "def f(x):" in out and "return x // 1 + 2" in out and "f(4)" in out and "T()" in out
    assert verdict(out) == before
    assert delta.drop_parameter(code, "f.x") is None and delta.drop_parameter(code, "g.n") is None


def test_a_call_that_is_a_comprehension_s_first_iterable_is_inlined() -> None:
    code = (
        "def f(n):\n    return range(n)\n"
        "def g():\n    y = [i for i in f(3)]\n    return y\n"
        "def attempt(rank, world_size):\n    return str(g())\n"
    )
    out = delta.inline(code, "f")
    assert out is not None and "def f" not in out and verdict(out) == verdict(code)


def test_a_method_called_on_an_object_built_in_place_becomes_a_function() -> None:
    code = (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class C:\n"
        "    shards: object = ()\n"
        "    def steps(self, extra):\n"
        "        return sorted(self.shards) + extra\n"
        "    @property\n"
        "    def first(self):\n"
        "        return self.shards[0]\n"
        "def run(c):\n"
        "    return c.steps([])\n"
        "def attempt(rank, world_size):\n"
        "    comp = C(shards=('b', 'a'))\n"
        "    y = comp.steps([1])\n"
        "    return str((y, comp.first, run(comp)))\n"
    )
    assert delta.methods(code) == ["C.steps", "C.first"]
    out = delta.hoist_method(delta.hoist_method(code, "C.steps") or "", "C.first")
    assert out is not None and "C_steps(comp, [1])" in out and "C_first(comp)" in out
    assert "return c.steps([])" in out  # a receiver the function did not build stays a method call
    assert verdict(out) == verdict(code)


def test_a_cut_may_not_leave_a_name_unbound() -> None:
    """The failure comes before ``table`` is read, so a script without ``table = {}`` still
    reproduces; but on a build without the failure it would stop at a NameError instead of
    saying PASS. No cut may leave a name that the script did bind unbound."""
    code = (
        "def boom(n):\n"
        "    if n > 0:\n"
        "        raise ValueError('boom')\n"
        "    return n\n"
        "def attempt(rank, world_size):\n"
        "    table = {}\n"
        "    key = 'k'\n"
        "    try:\n"
        "        table[key] = boom(1)\n"
        "    except BaseException as e:\n"
        "        if 'boom' in str(e):\n"
        "            return 'REPRODUCED x: boom'\n"
        "        return f'FAIL {e}'\n"
        "    return 'PASS'\n"
        "def main():\n"
        "    print(attempt(0, 1), boom(0))\n"
    )
    assert delta.undefined(code) == frozenset()
    assert delta.undefined(code.replace("    table = {}\n", "")) == {"table"}
    out = delta.ddmin(code, reproduces, time.monotonic() + 60)
    assert reproduces(out) and delta.undefined(out) == frozenset(), out


def test_a_cut_may_not_leave_a_draw_unseeded() -> None:
    """Comparing two draws reproduces with or without the seeds (the oracle here seeds nothing
    and the draws differ), but a script without them compares values the process's start drew:
    torch 2.13 seeds each process anew, so a one-sided comparison flips a coin. No cut may
    lessen the seeding calls or the ``generator=`` keywords; the rest is cut."""
    code = (
        (
            "import random\n"
            "def draw(rng):\n"
            "    return rng.random()\n"
            "def attempt(rank, world_size):\n"
            "    random.seed(0)\n"
            "    a = random.random()\n"
            "    gen = random.Random(1)\n"
            "    b = draw(rng=gen)\n"
            "    noise = [random.random() for _ in range(3)]\n"
            "    if a != b:\n"
            "        return 'REPRODUCED x: apart'\n"
            "    return 'PASS'\n"
            "def main():\n"
            "    print(attempt(0, 1))\n"
        )
        .replace("rng=gen", "generator=gen")
        .replace("def draw(rng)", "def draw(generator)")
        .replace("return rng.random()", "return generator.random()")
    )
    assert delta.seeding(code) == 2  # random.seed(0) and generator=gen
    assert delta.seeding(code.replace("    random.seed(0)\n", "")) == 1
    out = delta.ddmin(code, reproduces, time.monotonic() + 60)
    assert reproduces(out), out
    assert "random.seed(0)" in out and "generator=" in out, out
    assert "noise" not in out, out  # what draws nothing the judge reads is still cut


def test_a_decorators_arguments_are_not_elements() -> None:
    """``frozen=True`` is a keyword of a call, but cutting it saves no line and hides from the
    rewrites that nothing changes the class's objects."""
    code = (
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class T:\n"
        "    a: object\n"
        "def attempt(rank, world_size):\n"
        "    t = T(a=dict(x=1))\n"
        "    return 'REPRODUCED x: y'\n"
    )
    found = [ast.unparse(node) for node, _, _ in delta._elements(ast.parse(code), frozenset())]
    assert found == ["T(a=dict(x=1))", "dict(x=1)"], found  # the keywords a= and x=, not frozen=


def test_a_conditional_expression_is_cut_to_a_branch_in_the_harness_too() -> None:
    code = (
        "TAG = ':shard1'\n"
        "def judge():\n"
        "    return 'mismatch:x'\n"
        "def attempt(rank, world_size):\n"
        "    found = judge()\n"
        "    failure = found if found is None or not found.endswith(TAG) else None\n"
        "    if failure is not None:\n"
        "        return f'REPRODUCED x: {failure}'\n"
        "    return 'PASS'\n"
    )
    pairs = [(ast.unparse(n), ast.unparse(b)) for n, b in delta._conditionals(ast.parse(code), frozenset())]
    assert [b for _, b in pairs] == ["found", "None"], pairs
    out = delta.cut_to_branch(code, 0)
    assert out is not None and "failure = found\n" in out and reproduces(out)
    assert delta.cut_to_branch(code, 2) is None


def test_a_function_called_twice_is_inlined_at_both_calls() -> None:
    code = SCRIPT.replace("        run(case, log)\n", "        build(1)\n        run(case, log)\n")
    assert reproduces(code)
    assert "build" in delta.called_often(code) and "build" not in delta.inlinable(code)
    out = delta.inline_everywhere(code, "build")
    assert out is not None and "def build" not in out and "build(" not in out
    assert reproduces(out)
    assert out.count("size") >= 4  # each copy binds its own local


JUDGED = """
def check_first(obs):
    pass


def compare(obs, tol):
    if obs > tol:
        return "too far"


def tolerance():
    return TABLE["tol"]


def twice(x):
    return x + x


def double(x):
    return 2 * x


TABLE = {"tol": 1}


def judge(obs):
    seen = obs
    failure = check_first(seen) or compare(seen, tolerance())
    return failure


def attempt(rank, world_size):
    obs = double(3)
    failure = judge(obs)
    if failure is not None:
        return "REPRODUCED " + failure
    return "PASS"
"""


def test_the_judge_call_the_harness_binds_its_verdict_from_is_inlined() -> None:
    # ``failure = judge(obs)`` is the harness's: never cut, but the call in it may be inlined.
    assert "failure = judge(obs)" not in {ast.unparse(s) for s, _ in delta.units(ast.parse(JUDGED))}
    out = delta.inline(JUDGED, "judge")
    assert out is not None and "def judge" not in out and reproduces(out), out
    assert "failure = failure_" in out or "failure = check_first" in out, out


def test_an_idle_call_among_or_operands_goes_but_for_the_last() -> None:
    tree = delta.drop_idle_calls(ast.parse(JUDGED))
    assert "failure = compare(seen, tolerance())" in ast.unparse(tree)
    kept = delta.drop_idle_calls(ast.parse("def f():\n    pass\n\ndef g(a):\n    return a or f()\n"))
    assert "a or f()" in ast.unparse(kept)  # ``'' or f()`` is None, not ''
    computed = delta.drop_idle_calls(ast.parse("def f(x):\n    pass\n\ndef g(a):\n    return f(h(a)) or a\n"))
    assert "f(h(a)) or a" in ast.unparse(computed)  # its argument computes something


def test_a_function_that_returns_an_expression_is_written_where_it_is_called() -> None:
    names = delta.expression_functions(JUDGED)
    assert "tolerance" in names and "double" in names
    assert "twice" not in names  # its parameter is read twice: the argument would be computed twice
    assert "compare" not in names and "judge" not in names
    out = delta.inline_expression(JUDGED, "tolerance")
    assert out is not None and "def tolerance" not in out and "compare(seen, TABLE['tol'])" in out
    out = delta.inline_expression(out, "double")
    assert out is not None and "obs = 2 * 3" in out and reproduces(out)
    # A name the expression reads that the caller binds: the call is left.
    shadowed = JUDGED.replace("    seen = obs\n", "    seen = obs\n    TABLE = {}\n")
    assert delta.inline_expression(shadowed, "tolerance") is None


def test_a_function_with_star_star_keywords_is_inlined_with_them_as_a_display() -> None:
    code = (
        "def failure(kind, **details):\n"
        "    return (kind, details)\n"
        "def attempt(rank, world_size):\n"
        "    out = failure('x', step=2)\n"
        "    return 'REPRODUCED ' + repr(out)\n"
    )
    assert "failure" in delta.inlinable(code)
    out = delta.inline(code, "failure")
    assert out is not None and "def failure" not in out and "{'step': 2}" in out
    assert verdict(out) == verdict(code) == "REPRODUCED ('x', {'step': 2})"


def test_an_operand_of_or_in_the_harness_s_own_assignment_may_be_cut() -> None:
    tree = ast.parse(JUDGED)
    operands = [k for k, (node, field, _) in enumerate(delta._elements(tree, frozenset())) if field == "values"]
    cuts = {delta.cut_element(JUDGED, k) for k in operands}
    assert any(c is not None and "failure = compare(seen, tolerance())" in c for c in cuts)


def test_a_method_call_whose_value_is_used_may_become_its_object() -> None:
    code = (
        "import torch\n"
        "def run():\n"
        "    x = torch.ones(2)\n"
        "    y = x.to(torch.float32)\n"
        "    y.add_(1)\n"
        "    return x\n"
        "def attempt(rank, world_size):\n"
        "    if run().sum().item() == 4.0:\n"
        "        return 'REPRODUCED x'\n"
        "    return 'PASS'\n"
    )
    tree = ast.parse(code)
    calls = [ast.unparse(c) for c in delta._receivers(tree, frozenset())]
    assert "x.to(torch.float32)" in calls
    assert "torch.ones(2)" not in calls  # a module's function: no object to keep
    assert "y.add_(1)" not in calls  # a statement of its own: cut as a statement
    out = delta.cut_receiver(code, calls.index("x.to(torch.float32)"))
    assert out is not None and "y = x\n" in out and verdict(out) == verdict(code) == "REPRODUCED x"


def test_a_local_bound_once_to_an_attribute_of_an_imported_module_is_replaced_by_it() -> None:
    code = "import torch\ndef f():\n    dtype = torch.float32\n    return torch.ones(1).to(dtype)\n"
    tree = delta.propagate_aliases(ast.parse(code))
    assert "dtype" not in ast.unparse(tree) and ".to(torch.float32)" in ast.unparse(tree)
    rebound = "import torch\ndef f(torch):\n    dtype = torch.float32\n    return dtype\n"
    assert "dtype = torch.float32" in ast.unparse(delta.propagate_aliases(ast.parse(rebound)))


def test_a_nested_function_that_returns_an_expression_is_written_where_it_is_called() -> None:
    code = (
        "TABLE = {'a': 1}\n"
        "def policy(k):\n"
        "    def dt(d):\n"
        "        return None if d is None else TABLE[d]\n"
        "    return [dt(k), dt(g(k))]\n"
        "def g(k):\n"
        "    return k\n"
    )
    assert "policy.dt" in delta.expression_functions(code)
    # ``d`` is read twice: ``g(k)`` would be computed twice where it was computed once
    assert delta.inline_expression(code, "policy.dt") is None
    once = code.replace("dt(g(k))", "dt(k)")
    out = delta.inline_expression(once, "policy.dt")
    assert out is not None and "def dt" not in out and "None if k is None else TABLE[k]" in out


def test_a_cut_may_not_leave_a_function_reading_a_name_only_another_function_binds() -> None:
    # ``case`` is a parameter of ``run``: cutting ``attempt``'s own binding of it left a
    # NameError at run time that the module-wide check did not see.
    assert delta.unbound_reads(SCRIPT) == frozenset()
    cut = SCRIPT.replace("    case = Case(body=Body(width=3))\n", "")
    assert delta.undefined(cut) == frozenset() and delta.unbound_reads(cut) == {"attempt:case"}
    assert not reproduces(cut)


def test_where_folding_every_plain_value_fails_each_site_is_tried_alone() -> None:
    """``fold_values`` gives every site folded first, then each site alone: one bad site (a
    value that differs where the fold is run) no longer costs the folds of the others."""
    code = (
        "def attempt(rank, world_size):\n"
        "    a = len('xyz')\n"
        "    b = len('pq')\n"
        "    return 'REPRODUCED x' if a == 3 and b == 2 else 'PASS'\n"
    )
    bad_all = code.replace("len('xyz')", "4").replace("len('pq')", "2")  # the first site's fold is wrong
    alone = code.replace("len('pq')", "2")
    offered: list[list[str]] = []

    def fold_values(text: str) -> list[str]:
        out = [bad_all, alone] if text == code else []
        offered.append(out)
        return out

    out = delta.ddmin(code, reproduces, time.monotonic() + 30, fold_values=fold_values)
    assert offered and offered[0] == [bad_all, alone]
    assert reproduces(out) and "len('pq')" not in out and "len('xyz')" in out, out


def test_definitions_are_cut_a_group_at_a_time_before_one_at_a_time() -> None:
    """Sixteen dead functions and one the failure needs: the first attempts cut several at once,
    and the dead ones all go in fewer attempts than one each."""
    dead = "".join(f"\n\ndef dead_{i}(x):\n    return x + {i}\n" for i in range(16))
    code = (
        "from __future__ import annotations\n"
        + dead
        + "\n\ndef needed():\n    return 'boom'\n\n\ndef attempt(rank, world_size):\n"
        "    if needed() == 'boom':\n        return 'REPRODUCED x: boom'\n    return 'PASS'\n"
    )
    seen: list[str] = []

    def test(candidate: str) -> bool:
        seen.append(candidate)
        return "def needed" in candidate

    out = delta.ddmin(code, test, time.monotonic() + 60)
    assert "dead_" not in out and "def needed" in out
    cutting = [c for c in seen if c.count("def dead_") < 16]
    assert cutting[0].count("def dead_") <= 16 - delta.SMALLEST_GROUP
    assert len([c for c in cutting if "def needed" in c]) < 16


def test_a_call_whose_value_is_used_may_become_one_of_its_arguments_or_theirs() -> None:
    code = (
        "import json\n"
        "def run():\n"
        "    obs = {'x': 4.0}\n"
        "    out = json.loads(json.dumps(obs))\n"
        "    print(len(out))\n"
        "    return float(out['x'])\n"
        "def attempt(rank, world_size):\n"
        "    if run() == 4.0:\n"
        "        return 'REPRODUCED x'\n"
        "    return 'PASS'\n"
    )
    tree = ast.parse(code)
    pairs = [(ast.unparse(c), ast.unparse(a)) for c, a in delta._arguments(tree, frozenset())]
    loads = "json.loads(json.dumps(obs))"
    assert (loads, "json.dumps(obs)") in pairs and (loads, "obs") in pairs  # an argument's argument too
    assert ("float(out['x'])", "out['x']") in pairs
    assert not any(c == "print(len(out))" for c, _ in pairs)  # a statement of its own: cut as a statement
    assert not any(a == "4.0" for _, a in pairs)  # no constant takes a call's place
    out = delta.cut_to_argument(code, pairs.index((loads, "obs")))
    assert out is not None and "out = obs\n" in out and verdict(out) == verdict(code) == "REPRODUCED x"
    assert not reproduces(delta.cut_to_argument(code, pairs.index((loads, "json.dumps(obs)"))) or "")


def test_a_dataclass_field_nothing_reads_goes_from_the_class_and_its_calls() -> None:
    code = (
        "from dataclasses import dataclass, replace\n"
        "@dataclass\n"
        "class Side:\n"
        "    model: object\n"
        "    comp: object\n"
        "    training: object = None\n"
        "    label: object = None\n"
        "def attempt(rank, world_size):\n"
        "    side = Side(model=2, comp=[1], training=3, label=5)\n"
        "    other = replace(side, training=4)\n"
        "    if side.model + other.model + getattr(side, 'label') == 9:\n"
        "        return 'REPRODUCED x'\n"
        "    return 'PASS'\n"
    )
    keys = delta.fields(code)
    # model is read; training is passed to replace() too; label is named by a string; comp is unread
    assert keys == ["Side.comp"], keys
    out = delta.drop_field(code, "Side.comp")
    assert out is not None and "comp" not in out
    assert verdict(out) == verdict(code) == "REPRODUCED x"
    assert delta.drop_field(code, "Side.model") is None
    positional = code.replace("Side(model=2, comp=[1]", "Side(2, [1]")
    assert delta.fields(positional) == []  # passed by position: the call would shift


def test_a_definition_named_only_in_a_finally_block_is_cut_to_valid_code() -> None:
    """A ``try``/``finally`` whose ``finally`` held only the definition's calls keeps a
    ``finally: pass`` (a ``try`` with neither is no statement; the next cut could not parse it)."""
    code = (
        "def helper():\n    pass\n\n\n"
        "def attempt(rank, world_size):\n    try:\n        x = 2\n    finally:\n        helper()\n    return str(x)\n"
    )
    out = delta.cut_definition(code, "helper")
    assert out is not None and "helper" not in out
    space: dict[str, object] = {}
    exec(compile(out, "<cut>", "exec"), space)
    assert space["attempt"](0, 1) == "2"  # type: ignore[operator]
