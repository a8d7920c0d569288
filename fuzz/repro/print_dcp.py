"""The dcp property's scripts printed from the case (:mod:`fuzz.repro.print_parts` says what every
round trip script does and how it judges): a :class:`~fuzz.model.DcpBody`'s program, as
:mod:`fuzz._rank.dcp` runs it. The source trains, its model and optimizer go into ``dcp.save`` as
get_*_state_dict's state dicts or inside an app Stateful over get/set_state_dict, into a fresh
temporary directory (one for every rank); a fresh target builds the same dict, ``dcp.load`` fills it
in place and set_*_state_dict hands it to the target (the app entry loads itself); both train on.

Written so far: round trips of the model, optimizer, app, scalars, counter and extra entries
(the model and optimizer as get_*_state_dict's state dicts, as Statefuls of their own, or with
their state_dict methods patched to the distributed state-dict functions), in one order on every
rank or each rank's own (``ORDERS``), with the state-dict options of the case, a requires_grad
schedule, frozen parameters in the optimizer, an empty param group, FSDP1's classic recipe,
FileSystemWriter / Reader objects with the writer's options, a save over an earlier checkpoint
(``overwrite=True``) or refused by one (``overwrite=False``), the save and load planners'
options, and ``dcp.async_save``: one save waited on at once, or several a training step apart
over a gloo group of their own (the source trains on before each future is waited on; one
``FileSystemWriter(cache_staged_state_dict=True)`` or one explicit ``DefaultStager`` for all of
them, closed after the last), as :mod:`fuzz._rank.dcp` runs them. Anything else (partial loads,
an asynchronous stager, the other modes, ...) is refused by name.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from fuzz.model import Case, DcpBody, DcpItem, DcpMode, Overwrite, is_plain
from fuzz.repro.print_cut import mark
from fuzz.repro.print_model import check_default, refuse
from fuzz.repro.print_parts import (
    FRESH_SEED,
    call_lines,
    catch_up,
    check_sides,
    data_lines,
    optimizer_lines,
    round_trip,
    side_line,
    train_calls,
)
from fuzz.repro.print_train import check_training

#: DcpBody fields a script writes; every other must hold its default.
_BODY_FIELDS = {
    "tree",
    "source",
    "target",
    "entries",
    "training",
    "steps_after",
    "orders",
    "save_full_state_dict",
    "save_cpu_offload",
    "load_full_state_dict",
    "load_cpu_offload",
    "frozen_in_optimizer",
    "empty_group",
    "requires_grad",
    "async_save",
    "async_saves",
    "cache_staged",
    "stager",
    "storage_objects",
    "writer",
    "save_planner",
    "load_planner",
    "overwrite",
    "module_stateful",
    "patched",
}
_ENTRIES = {DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.APP, DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA}


def check_printable(case: Case, kind: str = "mismatch") -> None:
    """Raise :class:`~fuzz.repro.print_model.NotPrintable` naming what of ``case`` (of an entry of
    ``kind``) is not written."""
    body: Any = case.body
    check_sides(body.tree, body.source, body.target, kind)
    check_training(replace(body.training, foreach=None), loop=False)  # the optimizer writes foreach
    check_default(body, _BODY_FIELDS, "body")
    for entry in body.entries:
        if entry not in _ENTRIES:
            raise refuse(f"the {entry.value} entry")
    if body.mode is not DcpMode.ROUND_TRIP:
        raise refuse(f"mode={body.mode.value}")
    if body.module_stateful and body.classic_fsdp1:
        raise refuse("module_stateful with FSDP1's classic recipe")
    if body.overwrite is not Overwrite.NONE and (body.async_saves or not body.storage_objects):
        raise refuse(f"overwrite={body.overwrite.value} with async_saves or without storage_objects")
    if body.stager is not None and body.stager.use_async_staging:
        raise refuse("an asynchronous stager (use_async_staging=True: async_save's AsyncSaveResponse)")


def _options(full: bool, offload: bool, load: bool) -> str:
    """StateDictOptions arguments as :func:`fuzz._rank.dcp._options` makes them."""
    args = [n for n, on in (("full_state_dict", full), ("cpu_offload", offload)) if on]
    args += ["broadcast_from_rank0"] if load and full and offload else []
    return ", ".join(f"{a}=True" for a in args)


_APP = """\
class App:  # a Stateful over the model and its optimizer, as DCP's recipe writes it

    def __init__(self, model, opt, get, put):
        self.model, self.opt, self.get, self.put = model, opt, get, put

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=self.get)
        return {"model": model_sd, "optimizer": optim_sd}

    def load_state_dict(self, state_dict):
        model_sd, optim_sd = state_dict["model"], state_dict["optimizer"]
        set_state_dict(self.model, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd, options=self.put)"""

_SCALARS = """\
class Scalars:  # a Stateful holding Python scalars

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        self.values = dict(state_dict)"""

_COUNTER = """\
class Counter:  # a Stateful whose state_dict and load_state_dict all-reduce on every rank

    def __init__(self, value):
        self.value = torch.tensor([value], dtype=torch.float64)

    def state_dict(self):
        total = self.value.clone()
        dist.all_reduce(total)
        return {"value": self.value, "total": total}

    def load_state_dict(self, state_dict):
        self.value = state_dict["value"]
        dist.all_reduce(self.value.clone())"""


def _changed(options: Any) -> list[str]:
    """``name=value`` of each field of the dataclass ``options`` that differs from its default
    (the torch class's own: the case's options are named and defaulted as torch's are)."""
    return [f"{f.name}={getattr(options, f.name)!r}" for f in fields(options) if getattr(options, f.name) != f.default]


def _save(body: DcpBody, where: str, indent: str = "    ", tail: str = "", overwrite: str = "") -> list[str]:
    """dcp.save / dcp.async_save of ``state`` into ``where`` with what the case passes (as
    :func:`fuzz._rank.dcp_calls.writer_kwargs` and ``async_kwargs`` make it)."""
    if body.cache_staged and body.async_saves:
        args = [f"checkpoint_id={where}", "storage_writer=writer"]
    elif body.storage_objects:
        writer = [where, *([f"overwrite={overwrite}"] if overwrite else []), *_changed(body.writer)]
        args = [f"storage_writer=dcp.FileSystemWriter({', '.join(writer)})"]
    else:
        args = [f"checkpoint_id={where}"]
    if body.save_planner is not None and _changed(body.save_planner):  # else DCP's default planner
        args.append(f"planner=DefaultSavePlanner({', '.join(_changed(body.save_planner))})")
    args += ["process_group=group"] if body.async_saves else []
    args += ["async_stager=stager"] if body.stager is not None else []
    head = "future = dcp.async_save" if body.async_saves else "dcp.async_save" if body.async_save else "dcp.save"
    return call_lines(indent, head, ["state", *args], tail)


def _load(body: DcpBody) -> list[str]:
    """dcp.load of ``state`` in place, with the case's reader and planner."""
    args = ["storage_reader=dcp.FileSystemReader(path[0])" if body.storage_objects else "checkpoint_id=path[0]"]
    if body.load_planner is not None and _changed(body.load_planner):
        args.append(f"planner=DefaultLoadPlanner({', '.join(_changed(body.load_planner))})")
    return call_lines("    ", "dcp.load", ["state", *args], "  # in place")


def _state(
    body: DcpBody, model: str, opt: str, options: str, put: str = "", fresh: bool = False, counter: float = 0.0
) -> list[str]:
    """``state = {...}``: the top-level dict of ``model`` and ``opt``, its values taken in the
    case's entries order, the dict built in each rank's order (FSDP1's classic recipe: its own
    sharded state dicts; a ``fresh`` optimizer's state is read after dcp.load)."""
    kw = f", options={options}" if options else ""
    value = {
        DcpItem.MODEL: f"get_model_state_dict({model}{kw})",
        DcpItem.OPTIMIZER: f"get_optimizer_state_dict({model}, {opt}{kw})",
        DcpItem.APP: f"App({model}, {opt}, {options or 'None'}, {put or 'None'})",
    }
    if body.classic_fsdp1:
        value = {DcpItem.MODEL: f"{model}.state_dict()", DcpItem.OPTIMIZER: f"FSDP.optim_state_dict({model}, {opt})"}
    if body.module_stateful:
        value[DcpItem.MODEL] = f"{model}  # its own state_dict / load_state_dict"
    if body.patched:  # their state_dict / load_state_dict patched to get/set_*_state_dict
        value[DcpItem.MODEL], value[DcpItem.OPTIMIZER] = model, opt
    value[DcpItem.EXTRA] = "torch.zeros(5, dtype=torch.float64)" if fresh else "extra"
    fresh_scalars = "{k: type(v)() for k, v in scalars.items()}"  # as the rank side makes them
    value[DcpItem.SCALARS] = f"Scalars({fresh_scalars if fresh else 'scalars'})"
    value[DcpItem.COUNTER] = f"Counter({0.0 if fresh else counter!r})"
    entries = [e for e in body.entries if not (fresh and body.classic_fsdp1 and e is DcpItem.OPTIMIZER)]
    items = [f'"{e.value}": {value[e]}' for e in entries]
    name = "values" if _per_rank(body) else "state"
    one = f"    {name} = {{" + ", ".join(items) + "}"
    lines = [one] if len(one) <= 110 and "#" not in one else [f"    {name} = {{", *_packed(items), "    }"]
    if not _per_rank(body):
        return lines
    return [*lines, "    state = {k: values[k] for k in ORDERS[rank] if k in values}  # in this rank's order"]


def _orders(body: DcpBody) -> list[str]:
    """``ORDERS = [...]``: each rank's order of the top-level dict, where the ranks' differ."""
    if not _per_rank(body):
        return []
    rows = [[body.entries[i].value for i in order] for order in body.orders]
    return [
        "ORDERS = [  # each rank's order of the top-level dict",
        *(f"    {r!r},".replace("'", '"') for r in rows),
        "]",
    ]


def _packed(items: list[str]) -> list[str]:
    """A dict's items, as many a line as fit (an item with a comment ends its line)."""
    lines: list[str] = []
    line = ""
    for item in items:
        code, _, comment = item.partition("  # ")
        if line and len(f"{line} {code},") > 116:
            lines.append(line)
            line = ""
        line = f"{line} {code}," if line else f"        {code},"
        if comment:
            lines.append(f"{line}  # {comment}")
            line = ""
    return lines + ([line] if line else [])


def _per_rank(body: DcpBody) -> bool:
    """Whether the ranks build the top-level dict in orders of their own."""
    return any(list(order) != sorted(order) for order in body.orders)


def print_case(case: Case, entry: Any = None) -> str:
    check_printable(case, "mismatch" if entry is None else entry.kind)
    body: DcpBody = case.body  # type: ignore[assignment]
    judged = entry is None or entry.kind == "mismatch"
    app = DcpItem.APP in body.entries
    options = (body.save_full_state_dict, body.save_cpu_offload, body.load_full_state_dict, body.load_cpu_offload)
    names = ["StateDictOptions"] if any(options) else []
    names = [] if body.classic_fsdp1 else names
    names += ["get_state_dict", "set_state_dict"] if app else []
    if body.patched:
        names += ["_patch_model_state_dict"] + (["_patch_optimizer_state_dict"] if _patches_opt(body) else [])
    elif DcpItem.MODEL in body.entries and not (body.classic_fsdp1 or body.module_stateful):
        names += ["get_model_state_dict", "set_model_state_dict"]
    if DcpItem.OPTIMIZER in body.entries and not (body.classic_fsdp1 or body.patched):
        names += ["get_optimizer_state_dict", "set_optimizer_state_dict"]
    names.sort()
    half = (len(names) + 1) // 2
    imports = ["import tempfile", "import torch.distributed.checkpoint as dcp"]
    imports += ["import contextlib", "import shutil"] if body.overwrite is Overwrite.FALSE else []
    if body.classic_fsdp1:
        fsdp = ["StateDictType"]
        if body.save_cpu_offload or body.load_cpu_offload:
            fsdp = ["ShardedOptimStateDictConfig", "ShardedStateDictConfig", "StateDictType"]
        imports.append(f"from torch.distributed.fsdp import {', '.join(fsdp)}")
        if DcpItem.OPTIMIZER in body.entries:
            imports.append("from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict")
    imports += [
        f"from torch.distributed.checkpoint.state_dict import {', '.join(n)}" for n in (names[:half], names[half:]) if n
    ]
    given = [("DefaultLoadPlanner", body.load_planner), ("DefaultSavePlanner", body.save_planner)]
    planners = [n for n, o in given if o is not None and _changed(o)]
    if planners:
        imports.append(f"from torch.distributed.checkpoint import {', '.join(planners)}")
    if body.stager is not None:
        imports.append("from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions")
    extra = [
        text
        for e, text in ((DcpItem.APP, _APP), (DcpItem.SCALARS, _SCALARS), (DcpItem.COUNTER, _COUNTER))
        if e in body.entries
    ]
    extra += ["\n".join(_orders(body))] if _per_rank(body) else []
    return round_trip(case, entry, body, imports=imports, extra=extra, main=_main(case, body, judged))


def _patches_opt(body: DcpBody) -> bool:
    """Whether the optimizer's state_dict is patched too (where it is saved)."""
    return body.patched and DcpItem.OPTIMIZER in body.entries


def _patch(body: DcpBody, model: str, opt: str, options: str) -> list[str]:
    """``_patch_model_state_dict`` (and ``_patch_optimizer_state_dict``) on a side, with
    ``options``: its state_dict / load_state_dict, which DCP calls, go through
    get/set_*_state_dict (as torch's e2e test_e2e_save_and_load does)."""
    if not body.patched:
        return []
    kw = f", options={options}" if options else ""
    lines = [f"    _patch_model_state_dict({model}{kw})"]
    return lines + (
        [f"    _patch_optimizer_state_dict({model}, optimizers=({opt},){kw})"] if _patches_opt(body) else []
    )


def _saved(body: DcpBody) -> str:
    """``saved = ...``: what a mismatch script compares the target with right after the load."""
    extra = ', "extra": extra' if DcpItem.EXTRA in body.entries else ""
    return f"    saved = {{**snapshot(model, opt){extra}}}" if extra else "    saved = snapshot(model, opt)"


def _sharded(model: str, offload: bool) -> str:
    """FSDP1's SHARDED_STATE_DICT on ``model`` (offloaded to the CPU where ``offload``: ``offload``,
    :func:`_offload`)."""
    return f"    FSDP.set_state_dict_type({model}, StateDictType.SHARDED_STATE_DICT{', *offload' if offload else ''})"


def _offload(body: DcpBody) -> list[str]:
    """``offload = ...``: FSDP1's sharded state dict configs offloading to the CPU, where a side uses them."""
    if not (body.classic_fsdp1 and (body.save_cpu_offload or body.load_cpu_offload)):
        return []
    a = "offload_to_cpu=True"
    return [f"    offload = ShardedStateDictConfig({a}), ShardedOptimStateDictConfig({a})"]


def _classic_load(body: DcpBody) -> list[str]:
    """FSDP1's classic load: the model's own load_state_dict; the optimizer's state read through
    load_sharded_optimizer_state_dict (its keys follow the model's sharded state dict)."""
    lines = ['    target.load_state_dict(state["model"])'] if DcpItem.MODEL in body.entries else []
    if DcpItem.OPTIMIZER in body.entries:
        lines += [
            "    loaded = load_sharded_optimizer_state_dict(",
            '        target.state_dict(), "optimizer", storage_reader=dcp.FileSystemReader(path[0])',
            "    )",
            '    target_opt.load_state_dict(FSDP.optim_state_dict_to_load(target, target_opt, loaded["optimizer"]))',
        ]
    return lines


def _main(case: Case, body: DcpBody, judged: bool) -> list[str]:
    t = body.training
    avg_src = avg_tgt = ""
    if is_plain(body.source) != is_plain(body.target):
        avg_src, avg_tgt = f", {is_plain(body.source)}", f", {is_plain(body.target)}"
    counter = float(case.seed % 1009) + 0.5  # what the counter entry saves (fuzz._rank.dcp)
    lines = ["def main(rank, world_size):", *data_lines(case, body.tree, t, t.steps + body.steps_after)]
    lines += [
        '    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]',
        "    dist.broadcast_object_list(path)  # one fresh directory for every rank",
        *_scalars(case, body),
        *_extra(case, body),
        *_offload(body),
        f"    torch.manual_seed({case.seed})",
        side_line("model", body, False),
        *optimizer_lines("opt", "model", body.tree, t, body, fresh=False),
    ]
    first = t.steps - max(body.async_saves - 1, 0)  # the steps before the first save
    save = _options(body.save_full_state_dict, body.save_cpu_offload, load=False)
    if body.patched:
        lines += [f"    save = StateDictOptions({save})"] if save else []
        lines += _patch(body, "model", "opt", "save" if save else "")
    if body.overwrite is not Overwrite.NONE:
        lines += [f"    save = StateDictOptions({save})"] if save and not (body.classic_fsdp1 or body.patched) else []
        lines += _earlier(case, body, "save" if save and not body.classic_fsdp1 else "")
    lines += [*train_calls("model", "opt", 0, first, body.requires_grad, avg_src), mark("save")]
    template = _options(body.load_full_state_dict, body.load_cpu_offload, load=False)
    put = _options(body.load_full_state_dict, body.load_cpu_offload, load=True)
    classic = body.classic_fsdp1
    if classic:  # FSDP1's own sharded state dicts
        lines.append(_sharded("model", body.save_cpu_offload))
    elif save and body.overwrite is Overwrite.NONE and not body.patched:  # else written before
        lines.append(f"    save = StateDictOptions({save})")
    if body.async_saves:
        lines += _saves_in_flight(body, "save" if save else "", judged, counter, avg_src)
    elif body.overwrite is Overwrite.FALSE:
        lines += _state(body, "model", "opt", "save" if save else "", counter=counter)
        lines += _refused_save(body)
        lines += [_saved(body)] if judged else []
    else:
        lines += _state(body, "model", "opt", "save" if save else "", counter=counter)
        lines += _one_save(body, "True" if body.overwrite is Overwrite.TRUE else "")
        lines += [_saved(body)] if judged else []
    lines += [
        mark("load"),
        f"    torch.manual_seed({case.seed} + 0x{FRESH_SEED:X})  # other weights: a load that does nothing shows",
        side_line("target", body, False),
    ]
    loads_all = DcpItem.APP in body.entries or {DcpItem.MODEL, DcpItem.OPTIMIZER} <= set(body.entries)
    if judged or loads_all or DcpItem.OPTIMIZER in body.entries:
        lines += optimizer_lines("target_opt", "target", body.tree, t, body, fresh=judged)
    lines += catch_up("target", t.steps, body.requires_grad)
    if classic:
        template = put = ""
        lines.append(_sharded("target", body.load_cpu_offload))
    template = "" if body.patched else template
    lines += [f"    template = StateDictOptions({template})"] if template else []
    lines += [f"    load = StateDictOptions({put})"] if put else []
    lines += _patch(body, "target", "target_opt", "load" if put else "")
    lines += _state(body, "target", "target_opt", "template" if template else "", "load" if put else "", fresh=True)
    lines += _load(body)
    kw = ", options=load" if put else ""
    if classic:
        lines += _classic_load(body)
    elif DcpItem.MODEL in body.entries and not (body.module_stateful or body.patched):
        lines.append(f'    set_model_state_dict(target, state["model"]{kw})')
    if DcpItem.OPTIMIZER in body.entries and not (classic or body.patched):
        lines.append(f'    set_optimizer_state_dict(target, target_opt, state["optimizer"]{kw})')
    if judged:
        loaded = "snapshot(target, target_opt)"
        loaded = f'{{**{loaded}, "extra": state["extra"]}}' if DcpItem.EXTRA in body.entries else loaded
        lines += [f"    said = differs({loaded}, saved, exact=True)  # right after the load"]
    if body.steps_after and loads_all:
        lines.append(mark("resume"))
        after = t.steps + body.steps_after
        if not body.async_saves:  # else the source trained on while its last save was written
            lines += train_calls("model", "opt", t.steps, after, body.requires_grad, avg_src)
        lines += train_calls("target", "target_opt", t.steps, after, body.requires_grad, avg_tgt)
        if judged:
            lines.append("    said = said or differs(snapshot(target), snapshot(model))  # after training on")
    return [*lines, "    return said"] if judged else lines


def _stager(body: DcpBody) -> list[str]:
    """``stager = DefaultStager(StagingOptions(...))``: the case's explicit stager (all four
    options written: the case's are async_save's own stager's, not StagingOptions' defaults)."""
    o = body.stager
    if o is None:
        return []
    args = [f"{f.name}={getattr(o, f.name)!r}" for f in fields(o)]
    return [*call_lines("    ", "options = StagingOptions", args), "    stager = DefaultStager(options)"]


def _scalars(case: Case, body: DcpBody) -> list[str]:
    """``scalars = {...}``: the values the scalars entry saves (:func:`fuzz._rank.dcp.scalar_values`)."""
    if DcpItem.SCALARS not in body.entries:
        return []
    from fuzz._rank.dcp import scalar_values

    items = [f"{k!r}: {v!r}" for k, v in scalar_values(case, body).items()]
    one = "    scalars = {" + ", ".join(items) + "}  # what the scalars entry saves"
    return [one] if len(one) <= 116 else ["    scalars = {  # what the scalars entry saves", *_packed(items), "    }"]


def _extra(case: Case, body: DcpBody) -> list[str]:
    """``extra = ...``: the tensor the extra entry saves (:func:`fuzz._rank.dcp.extra_value`)."""
    if DcpItem.EXTRA not in body.entries:
        return []
    value = (case.seed % 97) + 0.25
    return [f"    extra = torch.arange(5, dtype=torch.float64) * {value!r}  # what the extra entry saves"]


def _one_save(body: DcpBody, overwrite: str = "") -> list[str]:
    """The save, an async one waited on at once (its stager closed after it, as async_save
    documents for a stager the caller provides); ``overwrite``: the writer's option, written."""
    if not body.async_save:
        return _save(body, "path[0]", overwrite=overwrite)
    closed = ["    stager.close()"] if body.stager is not None else []
    return [*_stager(body), *_save(body, "path[0]", tail=".result()  # written", overwrite=overwrite), *closed]


def _saves_in_flight(body: DcpBody, options: str, judged: bool, counter: float, average: str) -> list[str]:
    """``body.async_saves`` async saves a training step apart, each into its own directory (the
    last into the checkpoint's), the source training on before each future is waited on (after
    the last: its steps_after steps), over a gloo group of their own."""
    t, n = body.training, body.async_saves
    first = t.steps - (n - 1)
    lines = ["    group = dist.new_group(backend=\"gloo\")  # the saves' collectives run beside the training's"]
    if body.cache_staged:
        writer = ", ".join(["path[0]", "cache_staged_state_dict=True", *_changed(body.writer)])
        lines.append(f"    writer = dcp.FileSystemWriter({writer})  # one writer stages every save")
    lines += _stager(body)
    after = t.steps + body.steps_after
    if not judged and not any(first <= c.step < after for c in body.requires_grad):  # one loop
        early = f'[os.path.join(path[0], f"early-{{i}}") for i in range({n - 1})]'
        train = f"data[{first} + k : {first + 1} + k] if k < {n - 1} else data[{t.steps}:{after}]"
        return [
            *lines,
            f"    saves = {early} + [path[0]]  # the last into the checkpoint's",
            "    for k, where in enumerate(saves):",
            *(f"    {line}" for line in _state(body, "model", "opt", options, counter=counter)),
            *_save(body, "where", indent="        "),
            f"        train(model, opt, {train}{average})  # on while it is written",
            "        future.result()  # written",
            *(["    stager.close()"] if body.stager is not None else []),
        ]
    for k in range(n):
        last = k == n - 1
        lines += _state(body, "model", "opt", options, counter=counter)
        lines += _save(body, "path[0]" if last else f'os.path.join(path[0], "early-{k}")')
        lines += [_saved(body)] if judged and last else []
        lo, hi = (t.steps, t.steps + body.steps_after) if last else (first + k, first + k + 1)
        lines += train_calls("model", "opt", lo, hi, body.requires_grad, average)
        lines.append("    future.result()  # written")
    return lines + (["    stager.close()"] if body.stager is not None else [])


def _earlier(case: Case, body: DcpBody, options: str) -> list[str]:
    """A checkpoint of the same entries saved into the directory first, from a freshly built
    model with other weights, other hyperparameters and fresh values: what the case's save
    must refuse to overwrite."""
    lines = [
        f"    torch.manual_seed({case.seed} + 2 * 0x{FRESH_SEED:X})  # an earlier checkpoint in the directory",
        side_line("decoy", body, False),
    ]
    if DcpItem.APP in body.entries or (DcpItem.OPTIMIZER in body.entries and not body.classic_fsdp1):
        lines += optimizer_lines("decoy_opt", "decoy", body.tree, body.training, body, fresh=True)
    if body.classic_fsdp1:
        lines.append(_sharded("decoy", body.save_cpu_offload))
    lines += _patch(body, "decoy", "decoy_opt", options)
    lines += _state(body, "decoy", "decoy_opt", options, fresh=True)
    return [*lines, "    dcp.save(state, checkpoint_id=path[0])"]


def _refused_save(body: DcpBody) -> list[str]:
    """The save with overwrite=False into the directory that holds a checkpoint: refused, as
    FileSystemWriter documents ("Whether to allow overwriting existing checkpoints"); then the
    directory is cleared and the same save made again."""
    return [
        "    with contextlib.suppress(dcp.CheckpointException):  # refused: a checkpoint is there",
        *_save(body, "path[0]", indent="        ", overwrite="False"),
        "    dist.barrier()",
        "    if rank == 0:",
        "        shutil.rmtree(path[0])",
        "    dist.barrier()",
        *_save(body, "path[0]", overwrite="False"),
    ]
