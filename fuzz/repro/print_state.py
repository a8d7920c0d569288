"""Scripts printed from the case for the state_dict and dcp properties: a round trip as the torch
program it is (:mod:`fuzz.repro.print_parts` says what every such script does and how it judges).

This module writes a :class:`~fuzz.model.StateDictBody`'s program: the tree as plain module code
and the compositions as their calls (:mod:`fuzz.repro.print_model`), the source's training, the
state taken in memory (get/set_model_state_dict and get/set_optimizer_state_dict, get/set_state_dict,
FSDP2's own state_dict, or FSDP1's state_dict_type with FSDP.optim_state_dict) with only the
options the case sets, a deep copy (as storage would give), the load into the fresh target (rank
0's state alone with broadcast_from_rank0), and both trained on; :mod:`fuzz.repro.print_dcp`
writes a :class:`~fuzz.model.DcpBody`'s. ``check_printable`` raises
:class:`~fuzz.repro.print_model.NotPrintable` naming the first thing of a case neither writes
yet; ``print_case`` prints the script of a case (of an entry, whose kind sets the verdict).
"""

from __future__ import annotations

from typing import Any

from fuzz.model import Api, Case, Options, StateDictBody, is_plain
from fuzz.model.state_dict_rules import DEFAULT_FQN_MODIFIERS
from fuzz.repro import print_dcp
from fuzz.repro.print_cut import mark
from fuzz.repro.print_model import NotPrintable, check_default, refuse
from fuzz.repro.print_parts import (
    FRESH_SEED,
    call_lines,
    catch_up,
    check_sides,
    data_lines,
    fused_lines,
    meta_side_lines,
    optimizer_lines,
    round_trip,
    side_line,
    train_calls,
)
from fuzz.repro.print_train import check_training

__all__ = ["NotPrintable", "check_printable", "print_case"]

#: StateDictBody fields a script writes; every other must hold its default.
_BODY_FIELDS = {
    "tree",
    "source",
    "target",
    "training",
    "steps_after",
    "api",
    "save",
    "load",
    "target_meta_init",
    "frozen_in_optimizer",
    "empty_group",
    "requires_grad",
    "fused",
    "fqn_modifiers",
}


def check_printable(case: Case, kind: str = "mismatch") -> None:
    """Raise :class:`NotPrintable` naming the first thing of ``case`` (of an entry of ``kind``) no
    printer here writes."""
    if case.property == "dcp":
        print_dcp.check_printable(case, kind)
        return
    if case.property != "state_dict":
        raise refuse(f"a {case.property} case")
    body: Any = case.body
    check_sides(body.tree, body.source, body.target, kind)
    check_training(body.training, loop=False)
    check_default(body, _BODY_FIELDS, "body")


def print_case(case: Case, entry: Any = None) -> str:
    """The script of ``case``; ``entry`` (a corpus entry, or None for a case drawn in a test) sets
    its verdict (:mod:`fuzz.repro.print_parts`)."""
    check_printable(case, "mismatch" if entry is None else entry.kind)
    if case.property == "dcp":
        return print_dcp.print_case(case, entry)
    body: StateDictBody = case.body  # type: ignore[assignment]
    judged = entry is None or entry.kind == "mismatch"
    if judged and body.save.ignore_frozen_params:
        raise refuse("a judged state_dict case with save.ignore_frozen_params (frozen parameters keep fresh values)")
    imports = ["import copy", _fsdp1_import(body.save) if body.api is Api.FSDP1 else _dsd_import(body)]
    extra = ["\n".join(fused_lines(body.fused, body.fqn_modifiers))] if body.fused else []
    return round_trip(case, entry, body, imports=imports, extra=extra, main=_main(case, body, judged))


def _dsd_import(body: StateDictBody) -> str:
    names = ["StateDictOptions"] if _options(body.save, body) or _options(body.load, body) else []
    if body.api is Api.COMBINED:
        names += ["get_state_dict", "set_state_dict"]
    else:
        names += ["get_optimizer_state_dict", "set_optimizer_state_dict"]
        if body.api is Api.SPLIT:
            names += ["get_model_state_dict", "set_model_state_dict"]
    names = sorted(set(names))
    half = (len(names) + 1) // 2
    return "\n".join(
        f"from torch.distributed.checkpoint.state_dict import {', '.join(n)}" for n in (names[:half], names[half:]) if n
    )


def _fsdp1_import(save: Options) -> str:
    if save.full_state_dict:
        names = ["FullOptimStateDictConfig", "FullStateDictConfig", "StateDictType"]
    else:
        names = ["ShardedOptimStateDictConfig", "ShardedStateDictConfig", "StateDictType"]
    return f"from torch.distributed.fsdp import {', '.join(names)}"


def _options(o: Options, body: StateDictBody) -> str:
    """The StateDictOptions arguments ``o`` sets (each only where it is not its default)."""
    args = [f"{n}=True" for n in ("full_state_dict", "cpu_offload", "broadcast_from_rank0") if getattr(o, n)]
    args += ["strict=False"] if not o.strict else []
    args += [f"{n}=True" for n in ("ignore_frozen_params", "flatten_optimizer_state_dict") if getattr(o, n)]
    if body.fqn_modifiers != DEFAULT_FQN_MODIFIERS:
        args.append(f"dsd_fqn_modifiers={body.fqn_modifiers!r}")
    return ", ".join(args)


def _fsdp1_type(model: str, o: Options, rank0_only: bool) -> list[str]:
    kind = "FULL" if o.full_state_dict else "SHARDED"
    cfg = "Full" if o.full_state_dict else "Sharded"
    args = ["offload_to_cpu=True"] if o.cpu_offload else []
    args += ["rank0_only=True"] if rank0_only and o.full_state_dict else []
    a = ", ".join(args)
    configs = [f"StateDictType.{kind}_STATE_DICT"]
    configs += [f"{cfg}StateDictConfig({a})", f"{cfg}OptimStateDictConfig({a})"] if a else []  # else the defaults
    return call_lines("    ", "FSDP.set_state_dict_type", [model, *configs])


def _take(body: StateDictBody) -> list[str]:
    if body.api is Api.FSDP1:
        return [
            *_fsdp1_type("model", body.save, body.load.broadcast_from_rank0),
            "    model_sd, optim_sd = model.state_dict(), FSDP.optim_state_dict(model, opt)",
        ]
    opts = _options(body.save, body)
    kw = ", options=save" if opts else ""
    lines = [f"    save = StateDictOptions({opts})"] if opts else []
    if body.api is Api.COMBINED:
        return [*lines, f"    model_sd, optim_sd = get_state_dict(model, opt{kw})"]
    take = "model.state_dict()" if body.api is Api.MODULE else f"get_model_state_dict(model{kw})"
    return [*lines, f"    model_sd = {take}", f"    optim_sd = get_optimizer_state_dict(model, opt{kw})"]


def _put(body: StateDictBody, judged: bool) -> list[str]:
    if body.api is Api.FSDP1:
        lines = _fsdp1_type("target", body.load, body.load.broadcast_from_rank0)
        if body.load.broadcast_from_rank0:
            lines += [
                "    shared = [model_sd]  # rank0_only: rank 0's state, as the others would read it from its file",
                "    dist.broadcast_object_list(shared, src=0)",
                "    target.load_state_dict(shared[0])",
            ]
        else:
            lines.append("    target.load_state_dict(model_sd)")
        return [*lines, "    target_opt.load_state_dict(FSDP.optim_state_dict_to_load(target, target_opt, optim_sd))"]
    opts = _options(body.load, body)
    kw = ", options=load" if opts else ""
    lines = [f"    load = StateDictOptions({opts})"] if opts else []
    if body.api is Api.COMBINED:
        return [
            *lines,
            f"    set_state_dict(target, target_opt, model_state_dict=model_sd, optim_state_dict=optim_sd{kw})",
        ]
    if body.target_meta_init and not body.load.full_state_dict:
        lines.append('    target.to_empty(device="cpu")  # a sharded state is copied in: the parameters need storage')
    if body.api is Api.MODULE:
        lines.append(f"    target.load_state_dict(model_sd{'' if body.load.strict else ', strict=False'})")
    else:
        lines.append(f"    set_model_state_dict(target, model_sd{kw})")
    if body.target_meta_init:
        lines += optimizer_lines("target_opt", "target", body.tree, body.training, body, fresh=judged)
        lines += catch_up("target", body.training.steps, body.requires_grad)
    return [*lines, f"    set_optimizer_state_dict(target, target_opt, optim_sd{kw})"]


def _main(case: Case, body: StateDictBody, judged: bool) -> list[str]:
    t = body.training
    avg_src = avg_tgt = ""
    if is_plain(body.source) != is_plain(body.target):
        avg_src, avg_tgt = f", {is_plain(body.source)}", f", {is_plain(body.target)}"
    lines = ["def main(rank, world_size):", *data_lines(case, body.tree, t, t.steps + body.steps_after)]
    lines += [f"    torch.manual_seed({case.seed})", side_line("model", body, bool(body.fused))]
    lines += optimizer_lines("opt", "model", body.tree, t, body, fresh=False)
    lines += train_calls("model", "opt", 0, t.steps, body.requires_grad, avg_src)
    lines += [mark("save"), *_take(body)]
    lines.append("    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be")
    lines += ["    saved = snapshot(model, opt)"] if judged else []
    lines.append(mark("load"))
    lines.append(
        f"    torch.manual_seed({case.seed} + 0x{FRESH_SEED:X})  # other weights: a load that does nothing shows"
    )
    if body.target_meta_init:
        lines += meta_side_lines(body, bool(body.fused))
    else:
        lines.append(side_line("target", body, bool(body.fused)))
        lines += optimizer_lines("target_opt", "target", body.tree, t, body, fresh=judged)
        lines += catch_up("target", t.steps, body.requires_grad)
    if body.load.broadcast_from_rank0 and body.api is not Api.FSDP1:
        lines += [
            "    if rank != 0:",
            "        model_sd, optim_sd = {}, {}  # broadcast_from_rank0: rank 0 alone holds the state",
        ]
    lines += _put(body, judged)
    after = t.steps + body.steps_after
    if judged:
        lines += ["    said = differs(snapshot(target, target_opt), saved, exact=True)  # right after the load"]
    lines.append(mark("resume"))
    lines += train_calls("model", "opt", t.steps, after, body.requires_grad, avg_src)
    lines += train_calls("target", "target_opt", t.steps, after, body.requires_grad, avg_tgt)
    if judged:
        lines.append("    return said or differs(snapshot(target), snapshot(model))  # after training on")
    return lines
