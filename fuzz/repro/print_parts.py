"""The parts the state_dict and dcp printers share (:mod:`fuzz.repro.print_state`,
:mod:`fuzz.repro.print_dcp`): what a script says of itself, the data, the optimizers, the
training loop, the requires_grad schedule, the comparison a mismatch script computes, and the
``__main__`` block that turns what the ranks did into an exit status.

A round trip script trains a model under the source composition, moves its state into a freshly
built model under the target composition (other weights, other hyperparameters, so that a load
that does nothing shows), and trains both on over the same batches, as the rank programs do
(:mod:`fuzz._rank.state_dict`, :mod:`fuzz._rank.dcp`). Its verdict, by the entry's kind:

- an exception: the ranks run the program; a rank whose exception is the entry's (its type in
  the same innermost torch frame, :func:`fuzz.signature.torch_frame`, of which the script
  carries a copy) prints ``REPRODUCED`` and exits 1, any other exception prints ``FAIL`` and
  exits 2, and where every rank ran through rank 0 prints ``PASS`` and they exit 0;
- a hang or a crash: the same, under a watchdog that dumps every thread's stack and exits 1
  once the program has run past its deadline (a crashed rank leaves the others waiting);
- a mismatch (and a case printed without an entry): the program also compares the target, right
  after the load, with the source right after its state was taken (every parameter, its
  optimizer state and each group's lr, gathered in full; exactly), and both after training on
  (within the tolerance policy of :mod:`fuzz.tolerance`), and names the first that differs.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

from fuzz import known
from fuzz.model import Case, Composition, Dtype, Leaf, ModuleTree, Optimizer, RequiresGrad, Training, is_plain
from fuzz.repro.print_model import PRINTED_MARK, check_composition, check_default, check_tree, param_names, refuse
from fuzz.signature import torch_frame
from fuzz.tolerance import tolerance_for

#: Training fields a round trip script writes; every other must hold its default.
TRAINING_FIELDS = {
    "optimizer",
    "lr",
    "momentum",
    "eps",
    "steps",
    "batch_per_rank",
    "dtype",
    "same_input",
    "set_to_none",
    "param_groups",
}
#: Seed offset of the target's weights (:data:`fuzz._rank.state_dict.FRESH_SEED`, which the
#: rank side keeps; a test checks they agree).
FRESH_SEED = 0x5EED
#: Seconds a hang or crash script runs before its watchdog says it reproduced.
DEADLINE_S = 60


def check_training(training: Training) -> None:
    check_default(training, TRAINING_FIELDS, "training")
    if training.foreach is not None:
        raise refuse("training.foreach")


def check_sides(tree: ModuleTree, source: Composition, target: Composition) -> None:
    check_tree(tree)
    check_composition(source, "source")
    check_composition(target, "target")


def composed(comp: Composition) -> bool:
    """Whether ``comp`` makes any call (else the side is the plain model as built)."""
    return comp != Composition()


def side_line(name: str, comp: Composition, fused: bool) -> str:
    """``model = compose_source(build())`` (or ``target``, ``compose_target``)."""
    built = "fuse(build())" if fused else "build()"
    compose = "compose_source" if name == "model" else "compose_target"
    return f"    {name} = {compose}({built})" if composed(comp) else f"    {name} = {built}"


def meta_side_lines(comp: Composition, fused: bool) -> list[str]:
    """The target built on the meta device, then composed."""
    lines = [
        '    with torch.device("meta"):  # no storage until the load',
        f"        target = {'fuse(build())' if fused else 'build()'}",
    ]
    return lines + (["    target = compose_target(target)"] if composed(comp) else [])


def header(case: Case, entry: Any, what: str) -> list[str]:
    """The comment lines a script opens with: the mark, the bug, what it does, how to run it."""
    said = []
    if entry is not None and entry.bug:
        bug = known.get(entry.bug)
        said.append(f"Known torch bug: {bug.title}; upstream: {bug.url or bug.upstream or 'none found'}.")
    said.append(what)
    kind = "mismatch" if entry is None else entry.kind
    run = f"Run: torchrun --nproc-per-node {case.world_size} THIS_FILE.py. Exit 1 (REPRODUCED): "
    run += {
        "exception": "a rank raised the exception named below in the same torch function",
        "hang": f"a rank was still running after {DEADLINE_S} s (its stacks are printed)",
        "crash": f"a rank died, or waited for one that died for {DEADLINE_S} s (stacks printed)",
        "mismatch": "a value differs (named at run time)",
    }[kind]
    said.append(run + "; 0 (PASS): every rank ran through; 2: it failed another way.")
    lines = [PRINTED_MARK]
    lines += [f"# {line}" for text in said for line in textwrap.wrap(text, 96)]
    return lines


def data_lines(case: Case, tree: ModuleTree, training: Training, steps: int) -> list[str]:
    """``data``: this rank's (input, target) for ``steps`` steps (fuzz._rank.parity.batches)."""
    b = training.batch_per_rank
    dtype = ", dtype=torch.float64" if training.dtype is Dtype.FLOAT64 else ""
    if training.same_input:
        rows = f"slice(0, {b})  # every rank trains on the same rows"
    else:
        rows = "slice(rank, rank + 1)" if b == 1 else f"slice(rank * {b}, rank * {b} + {b})"
    n = "world_size" if b == 1 else f"world_size * {b}"
    return [
        f"    gen = torch.Generator().manual_seed({case.seed})  # the global batches, the same on every rank",
        f"    draw = partial(torch.randn, {n}, {tree.width}, generator=gen{dtype})",
        f"    rows = {rows}",
        f"    data = [(draw()[rows], draw()[rows]) for _ in range({steps})]",
    ]


def _trainable(tree: ModuleTree, frozen_in_optimizer: bool) -> int:
    """How many parameters the optimizer is built over (fuzz._rank.parity.make_optimizer)."""
    frozen = [p for p, n in tree.paths().items() if isinstance(n, Leaf) and n.frozen]
    names = param_names(tree)
    if frozen_in_optimizer:
        return len(names)
    return len([n for n in names if not any(n.startswith(f"{p}.") for p in frozen)])


def optimizer_def(tree: ModuleTree, training: Training, frozen_in_optimizer: bool, empty_group: bool) -> list[str]:
    """``def optimizer(model, lr, ...)``: the case's optimizer over the model's parameters."""
    sgd = training.optimizer is Optimizer.SGD
    extra = ("momentum" if training.momentum else "") if sgd else "eps"
    args = f"model, lr{', ' + extra if extra else ''}"
    frozen = any(isinstance(n, Leaf) and n.frozen for n in tree.paths().values())
    params = "list(model.parameters())"
    if frozen and not frozen_in_optimizer:
        params = "[p for p in model.parameters() if p.requires_grad]"
    groups = "params"
    if training.param_groups == 2 and _trainable(tree, frozen_in_optimizer) > 1:
        groups = '[{"params": params[0::2]}, {"params": params[1::2], "lr": lr / 2}]'
    name = {Optimizer.SGD: "SGD", Optimizer.ADAM: "Adam", Optimizer.ADAMW: "AdamW"}[training.optimizer]
    kwargs = f", {extra}={extra}" if extra else ""
    if groups == "params" and params.startswith("list("):
        groups, params = "model.parameters()", ""
    lines = [f"def optimizer({args}):"] + ([f"    params = {params}"] if params else [])
    make = f"torch.optim.{name}({groups}, lr=lr{kwargs})"
    if empty_group:
        lines += [f"    opt = {make}", '    opt.add_param_group({"params": [], "lr": lr / 4})', "    return opt"]
    else:
        lines.append(f"    return {make}")
    return lines


def optimizer_call(model: str, training: Training, fresh: bool) -> str:
    """``optimizer(...)`` with the case's hyperparameters, or for the target other ones, which
    the load must bring back (fuzz._rank.state_dict.fresh_training)."""
    sgd = training.optimizer is Optimizer.SGD
    lr = f"{training.lr!r} * 0.37" if fresh else repr(training.lr)
    extra = ""
    if sgd and training.momentum:
        extra = ", 0.5" if fresh else f", {training.momentum!r}"
    elif not sgd:
        extra = f", {training.eps!r} * 10" if fresh else f", {training.eps!r}"
    return f"optimizer({model}, {lr}{extra})"


def train_def(comps: list[Composition], training: Training) -> list[str]:
    """``def train(model, opt, batches)``: one step per batch; a plain model averages its
    gradients over the ranks by hand (``average``, where the sides differ in that)."""
    plain = [is_plain(c) for c in comps]
    mixed = len(set(plain)) > 1
    lines = [f"def train(model, opt, batches{', average' if mixed else ''}):", "    for x, y in batches:"]
    lines.append("        F.mse_loss(model(x), y).backward()")
    if any(plain):
        indent = "    " if mixed else ""
        if mixed:
            lines.append("        if average:  # a plain model, trained data-parallel by hand")
        lines += [
            f"        {indent}for p in model.parameters():"
            + ("" if mixed else "  # a plain model: data-parallel by hand"),
            f"            {indent}if p.grad is not None:",
            f"                {indent}dist.all_reduce(p.grad)",
            f"                {indent}p.grad /= dist.get_world_size()",
        ]
    lines += [
        "        opt.step()",
        "        opt.zero_grad()" if training.set_to_none else "        opt.zero_grad(set_to_none=False)",
    ]
    return lines


def train_calls(
    model: str, opt: str, lo: int, hi: int, schedule: tuple[RequiresGrad, ...], average: str = ""
) -> list[str]:
    """Train ``model`` on steps ``lo`` to ``hi``, applying the requires_grad changes made before
    each of those steps (fuzz._rank.state_dict.change_requires_grad)."""
    lines = []
    start = lo
    for step in range(lo, hi):
        changes = [c for c in schedule if c.step == step]
        if not changes:
            continue
        if step > start:
            lines.append(f"    train({model}, {opt}, data[{start}:{step}]{average})")
        lines += [_requires_grad(model, c) + f"  # before step {step}" for c in changes]
        start = step
    if hi > start:
        lines.append(f"    train({model}, {opt}, data[{start}:{hi}]{average})")
    return lines


def catch_up(model: str, steps: int, schedule: tuple[RequiresGrad, ...]) -> list[str]:
    """The changes a run of ``steps`` steps made, replayed on a fresh target."""
    changes = [c for c in schedule if c.step < steps]
    return [_requires_grad(model, c) + "  # as the source is by now" for c in changes]


def _requires_grad(model: str, change: RequiresGrad) -> str:
    return f'    {model}.get_submodule("{change.path}").requires_grad_({change.trainable})'


FUSED = '''\
class Fused(nn.Module):
    """A leaf held under a child, "fused", that its state dict hides (as fused modules keep the keys
    of the module they replaced); {method} tells the distributed state-dict API so."""

    def __init__(self, leaf):
        super().__init__()
        self.fused = leaf
        self.register_state_dict_post_hook(lambda m, sd, prefix, _: m.rename(sd, prefix + "fused.", prefix))
        self.register_load_state_dict_pre_hook(lambda m, sd, prefix, *_: m.rename(sd, prefix, prefix + "fused."))

    def {method}(self):
        return {{name: "fused" for name, _ in self.fused.named_parameters()}}

    def forward(self, x):
        return self.fused(x)

    def rename(self, state_dict, old, new):
        for name in self.{method}():
            if old + name in state_dict:
                state_dict[new + name] = state_dict.pop(old + name)'''


def fused_lines(fused: tuple[str, ...], method: str) -> list[str]:
    """The ``Fused`` class and ``fuse(model)``, which puts the leaves at ``fused`` under it."""
    paths = ", ".join(repr(p) for p in fused)
    return [
        FUSED.format(method=method),
        "",
        "",
        "def fuse(model):",
        f"    for path in ({paths}{',' if len(fused) == 1 else ''}):  # the leaves built as fused modules",
        '        owner, _, name = path.rpartition(".")',
        "        model.get_submodule(owner).add_module(name, Fused(model.get_submodule(path)))",
        "    return model",
    ]


def full_def(sharded: bool) -> list[str]:
    """``def full(model, opt=None)``: every parameter and buffer (and the optimizer's state and
    each group's lr), gathered in full, by name: what the judge compares."""
    gather = "(t.full_tensor() if isinstance(t, DTensor) else t)" if sharded else "t"
    return [
        "def gathered(t):",
        f"    return {gather}.detach().clone()",
        "",
        "",
        "def full(model, opt=None):",
        '    """Every parameter and buffer (and its optimizer state, each group\'s lr), in full, by name."""',
        "    out = {n: gathered(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}",
        "    for name, p in model.named_parameters() if opt is not None else ():",
        '        out.update({f"{name} {k}": gathered(t) for k, t in opt.state.get(p, {}).items() if torch.is_tensor(t)})',  # noqa: E501
        '    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})',  # noqa: E501
        "    return out",
    ]


def differs_def(dtype: Dtype) -> list[str]:
    """``def differs(what, got, want, exact)``: the first entry that differs, said, or None."""
    tol = tolerance_for(dtype.value)
    return [
        "def differs(what, got, want, exact):",
        '    """The first value of ``want`` that ``got`` lacks or differs in: exactly, or within the',
        f'    tolerance policy for {dtype.value} (rtol={tol.rtol!r}, atol={tol.atol!r})."""',
        "    for key, value in want.items():",
        "        mine = got.get(key)",
        "        if mine is None:",
        '            return f"{key} is missing {what}"',
        f"        if not (torch.equal if exact else partial(torch.allclose, rtol={tol.rtol!r}, atol={tol.atol!r}))(mine, value):",  # noqa: E501
        '            return f"{key} {what}: {mine.flatten().tolist()[:4]} where {value.flatten().tolist()[:4]} was expected"',  # noqa: E501
        "    return None",
    ]


def torch_frame_lines() -> list[str]:
    """:func:`fuzz.signature.torch_frame`'s source without its docstring and annotations."""
    source = inspect.getsource(torch_frame)
    body = source.split('"""')[2].strip("\n")
    return ["def torch_frame(path, function):  # fuzz.signature.torch_frame: a frame of torch's own code", body]


def main_block(case: Case, entry: Any) -> list[str]:
    """The ``__main__`` block: run ``main`` on every rank, then the verdict and exit status."""
    kind = "mismatch" if entry is None else entry.kind
    n = case.world_size
    lines = ["", "", 'if __name__ == "__main__":']
    if kind in ("hang", "crash"):
        lines.append(
            f"    faulthandler.dump_traceback_later({DEADLINE_S}, exit=True)  # the watchdog: stacks, then exit 1"
        )
    lines += [
        "    try:",
        '        dist.init_process_group("gloo")',
        f"        if dist.get_world_size() != {n}:",
        f'            raise SystemExit("run it with: torchrun --nproc-per-node {n} THIS_FILE.py")',
    ]
    if kind == "mismatch":
        lines += [
            "        said = [None] * dist.get_world_size()  # what each rank found to differ",
            "        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))",
        ]
    elif kind in ("hang", "crash"):
        lines += [
            "        main(dist.get_rank(), dist.get_world_size())",
            "        faulthandler.cancel_dump_traceback_later()  # a rank stuck in a collective is the one to report",
            '        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)',
            '        store.set(f"finished {dist.get_rank()}", "1")  # no collective: a rank stuck in one is seen',
            '        store.wait([f"finished {r}" for r in range(dist.get_world_size())])',
        ]
    else:
        lines += [
            "        main(dist.get_rank(), dist.get_world_size())",
            "        dist.barrier()  # every rank ran through",
        ]
    lines += [
        "    except BaseException as e:  # DCP's CheckpointException is a BaseException",
        "        text = traceback.format_exc()",
        '        frames = [torch_frame(p, f) for p, f in re.findall(r\'File "([^"]+)", line \\d+, in (\\S+)\', text)]',
        "        raised = f\"{type(e).__module__}.{type(e).__qualname__}@{([f for f in frames if f] or ['?'])[-1]}\"",
    ]
    if kind == "exception":
        lines += [
            '        verdict = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"',
            "        print(f\"{text}{verdict}: rank {os.environ.get('RANK')} raised {raised}\", flush=True)",
            "        os._exit(1 if raised in RAISED else 2)",
        ]
    else:
        lines += [
            "        print(f\"{text}FAIL (another failure): rank {os.environ.get('RANK')} raised {raised}\", flush=True)",  # noqa: E501
            "        os._exit(2)",
        ]
    if kind == "mismatch":
        lines += [
            "    if any(said):",
            '        print(f"REPRODUCED: {next(filter(None, said))}", flush=True)',
            "        os._exit(1)",
        ]
    passing = {"exception": "no rank raised", "hang": "every rank finished", "crash": "no rank died"}
    lines += [
        "    if dist.get_rank() == 0:",
        f'        print("PASS: {passing.get(kind, "every loss, gradient and parameter agrees")}", flush=True)',
        "    os._exit(0)",
    ]
    return lines


def raised_lines(entry: Any) -> list[str]:
    """``RAISED``: the exceptions (type@innermost torch frame) of the entry's signature and aliases."""
    found = sorted({s.split(":", 2)[2] for s in (entry.signature, *entry.aliases) if s.startswith("exception:")})
    return [
        "RAISED = {  # the entry's exception: its type, raised in this function of torch",
        *(f"    {s!r}," for s in found),
        "}",
    ]
