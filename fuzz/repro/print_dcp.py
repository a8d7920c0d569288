"""The dcp property's scripts printed from the case (:mod:`fuzz.repro.print_parts` says what every
round trip script does and how it judges): a :class:`~fuzz.model.DcpBody`'s program, as
:mod:`fuzz._rank.dcp` runs it. The source trains, its model and optimizer go into ``dcp.save`` as
get_*_state_dict's state dicts or inside an app Stateful over get/set_state_dict, into a fresh
temporary directory (one for every rank); a fresh target builds the same dict, ``dcp.load`` fills it
in place and set_*_state_dict hands it to the target (the app entry loads itself); both train on.

Written so far: round trips of the model, optimizer and app entries, in one order on every rank,
with the state-dict options of the case, a requires_grad schedule, frozen parameters in the
optimizer and an empty param group. Anything else (the other entries, async saves, storage
objects, planners, FSDP1's classic recipe, partial loads, ...) is refused by name.
"""

from __future__ import annotations

from typing import Any

from fuzz.model import Case, DcpBody, DcpItem, DcpMode, is_plain
from fuzz.repro.print_model import check_default, refuse
from fuzz.repro.print_parts import (
    FRESH_SEED,
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
}
_ENTRIES = {DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.APP}


def check_printable(case: Case, kind: str = "mismatch") -> None:
    """Raise :class:`~fuzz.repro.print_model.NotPrintable` naming what of ``case`` (of an entry of
    ``kind``) is not written."""
    body: Any = case.body
    check_sides(body.tree, body.source, body.target, kind)
    check_training(body.training, loop=False)
    check_default(body, _BODY_FIELDS, "body")
    for entry in body.entries:
        if entry not in _ENTRIES:
            raise refuse(f"the {entry.value} entry")
    if any(list(order) != sorted(order) for order in body.orders):
        raise refuse("per-rank orders of the entries")
    if body.mode is not DcpMode.ROUND_TRIP:
        raise refuse(f"mode={body.mode.value}")


def _options(full: bool, offload: bool, load: bool) -> str:
    """StateDictOptions arguments as :func:`fuzz._rank.dcp._options` makes them."""
    args = [n for n, on in (("full_state_dict", full), ("cpu_offload", offload)) if on]
    args += ["broadcast_from_rank0"] if load and full and offload else []
    return ", ".join(f"{a}=True" for a in args)


_APP = '''\
class App:
    """A Stateful over the model and its optimizer, as DCP's recipe writes it."""

    def __init__(self, model, opt, get, put):
        self.model, self.opt, self.get, self.put = model, opt, get, put

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=self.get)
        return {"model": model_sd, "optimizer": optim_sd}

    def load_state_dict(self, state_dict):
        model_sd, optim_sd = state_dict["model"], state_dict["optimizer"]
        set_state_dict(self.model, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd, options=self.put)'''


def _state(body: DcpBody, model: str, opt: str, options: str, put: str = "", fresh: bool = False) -> list[str]:
    """``state = {...}``: the top-level dict of ``model`` and ``opt``, its entries in the case's
    order (FSDP1's classic recipe: its own sharded state dicts; a ``fresh`` optimizer's state is
    read after dcp.load)."""
    kw = f", options={options}" if options else ""
    value = {
        DcpItem.MODEL: f"get_model_state_dict({model}{kw})",
        DcpItem.OPTIMIZER: f"get_optimizer_state_dict({model}, {opt}{kw})",
        DcpItem.APP: f"App({model}, {opt}, {options or 'None'}, {put or 'None'})",
    }
    if body.classic_fsdp1:
        value = {DcpItem.MODEL: f"{model}.state_dict()", DcpItem.OPTIMIZER: f"FSDP.optim_state_dict({model}, {opt})"}
    entries = [e for e in body.entries if not (fresh and body.classic_fsdp1 and e is DcpItem.OPTIMIZER)]
    items = [f'"{e.value}": {value[e]}' for e in entries]
    one = "    state = {" + ", ".join(items) + "}"
    return [one] if len(one) <= 110 else ["    state = {", *(f"        {i}," for i in items), "    }"]


def print_case(case: Case, entry: Any = None) -> str:
    check_printable(case, "mismatch" if entry is None else entry.kind)
    body: DcpBody = case.body  # type: ignore[assignment]
    judged = entry is None or entry.kind == "mismatch"
    app = DcpItem.APP in body.entries
    options = (body.save_full_state_dict, body.save_cpu_offload, body.load_full_state_dict, body.load_cpu_offload)
    names = ["StateDictOptions"] if any(options) else []
    names = [] if body.classic_fsdp1 else names
    names += ["get_state_dict", "set_state_dict"] if app else []
    if DcpItem.MODEL in body.entries and not body.classic_fsdp1:
        names += ["get_model_state_dict", "set_model_state_dict"]
    if DcpItem.OPTIMIZER in body.entries and not body.classic_fsdp1:
        names += ["get_optimizer_state_dict", "set_optimizer_state_dict"]
    names.sort()
    half = (len(names) + 1) // 2
    imports = ["import tempfile", "import torch.distributed.checkpoint as dcp"]
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
    extra = [_APP] if app else []
    return round_trip(case, entry, body, imports=imports, extra=extra, main=_main(case, body, judged))


def _sharded(model: str, offload: bool) -> str:
    """FSDP1's SHARDED_STATE_DICT on ``model`` (offloaded to the CPU where ``offload``)."""
    if not offload:
        return f"    FSDP.set_state_dict_type({model}, StateDictType.SHARDED_STATE_DICT)"
    a = "offload_to_cpu=True"
    return (
        f"    FSDP.set_state_dict_type({model}, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig({a}), "
        f"ShardedOptimStateDictConfig({a}))"
    )


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
    lines = ["def main(rank, world_size):", *data_lines(case, body.tree, t, t.steps + body.steps_after)]
    lines += [
        '    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]',
        "    dist.broadcast_object_list(path)  # one fresh directory for every rank",
        f"    torch.manual_seed({case.seed})",
        side_line("model", body.source, False),
        *optimizer_lines("opt", "model", body.tree, t, body, fresh=False),
    ]
    lines += train_calls("model", "opt", 0, t.steps, body.requires_grad, avg_src)
    save = _options(body.save_full_state_dict, body.save_cpu_offload, load=False)
    template = _options(body.load_full_state_dict, body.load_cpu_offload, load=False)
    put = _options(body.load_full_state_dict, body.load_cpu_offload, load=True)
    classic = body.classic_fsdp1
    if classic:  # FSDP1's own sharded state dicts
        lines.append(_sharded("model", body.save_cpu_offload))
    elif save:
        lines.append(f"    save = StateDictOptions({save})")
    lines += _state(body, "model", "opt", "save" if save else "")
    lines.append("    dcp.save(state, checkpoint_id=path[0])")
    if judged:
        lines.append("    saved = snapshot(model, opt)")
    lines += [
        f"    torch.manual_seed({case.seed} + 0x{FRESH_SEED:X})  # other weights: a load that does nothing shows",
        side_line("target", body.target, False),
    ]
    loads_all = DcpItem.APP in body.entries or {DcpItem.MODEL, DcpItem.OPTIMIZER} <= set(body.entries)
    if judged or loads_all or DcpItem.OPTIMIZER in body.entries:
        lines += optimizer_lines("target_opt", "target", body.tree, t, body, fresh=judged)
    lines += catch_up("target", t.steps, body.requires_grad)
    if classic:
        template = put = ""
        lines.append(_sharded("target", body.load_cpu_offload))
    lines += [f"    template = StateDictOptions({template})"] if template else []
    lines += [f"    load = StateDictOptions({put})"] if put else []
    lines += _state(body, "target", "target_opt", "template" if template else "", "load" if put else "", fresh=True)
    lines.append("    dcp.load(state, checkpoint_id=path[0])  # in place")
    kw = ", options=load" if put else ""
    if classic:
        lines += _classic_load(body)
    elif DcpItem.MODEL in body.entries:
        lines.append(f'    set_model_state_dict(target, state["model"]{kw})')
    if DcpItem.OPTIMIZER in body.entries and not classic:
        lines.append(f'    set_optimizer_state_dict(target, target_opt, state["optimizer"]{kw})')
    if judged:
        lines += ["    said = differs(snapshot(target, target_opt), saved, exact=True)  # right after the load"]
    if body.steps_after and loads_all:
        after = t.steps + body.steps_after
        lines += train_calls("model", "opt", t.steps, after, body.requires_grad, avg_src)
        lines += train_calls("target", "target_opt", t.steps, after, body.requires_grad, avg_tgt)
        if judged:
            lines.append("    said = said or differs(snapshot(target), snapshot(model))  # after training on")
    return [*lines, "    return said"] if judged else lines
