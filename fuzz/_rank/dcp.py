"""Distributed-checkpoint round trips on a rank: save through DCP, load into a fresh model.

The top-level dict is built in the case's per-rank order (``DcpBody.orders``); its values are
computed first, in one fixed order, so that the only collectives whose order differs across
ranks are the ones DCP itself issues (through Stateful objects). Beside the model and the
optimizer the dict holds Stateful objects: Python scalars, and a counter whose state_dict and
load_state_dict all-reduce. Loading is in place: the dicts and tensors passed to ``dcp.load``
are the ones the program keeps, and it checks they still are afterwards.

The checkpoint directory of a round trip is derived from the case, so all ranks agree without
a collective: ``<tmp>/shardfuzz-dcp-<driver pid>/<case digest>-<case count>`` (ranks run cases
in lockstep, so their case counts agree). Rank 0 removes it before saving (a killed run of the
same case may have left it) and at the end, after a barrier; the driver removes what is left of
``shardfuzz-dcp-<its pid>`` when it exits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any

import torch
import torch.distributed as dist

from fuzz._rank.context import RankContext
from fuzz._rank.state_dict import (
    FRESH_SEED,
    Side,
    add_optimizer,
    all_batches,
    build_side,
    dropped_keys,
    fresh_training,
    observe,
    resume_both,
    seed_segment,
    state_dict_options,
    train_steps,
)
from fuzz.case import Case, case_to_text
from fuzz.case_state import DcpBody, DcpMode, Entry, Options, dcp_root


def case_dir(case: Case, ctx: RankContext) -> str:
    digest = hashlib.sha1(case_to_text(case).encode()).hexdigest()[:12]
    count = getattr(ctx, "_cases", 0)
    return os.path.join(dcp_root(os.environ.get("SHARDFUZZ_PARENT_PID", os.getppid())), f"{digest}-{count}")


def scalar_values(case: Case, body: DcpBody) -> dict[str, Any]:
    """What the scalars entry holds when saved: the same on every rank (DCP saves non-tensor
    values once, as replicated)."""
    s = case.seed % 100003
    return {
        "step": body.training.steps,
        "loss": s / 7.0,
        "tag": f"case-{s}",
        "done": bool(s % 2),
        "history": [s / 3.0, -1.5, 1e-300],
    }


class Scalars:
    """A Stateful holding Python scalars."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = dict(values)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.values = dict(state_dict)


class Counter:
    """A Stateful whose state_dict and load_state_dict all-reduce on every rank (with
    ``deadlock``, state_dict does so on rank 0 only: a hang on purpose)."""

    def __init__(self, value: float, ctx: RankContext, deadlock: bool = False) -> None:
        self.value = torch.tensor([value], dtype=torch.float64)
        self.total = torch.zeros(1, dtype=torch.float64)
        self.agreed = float("nan")
        self.ctx = ctx
        self.deadlock = deadlock

    def state_dict(self) -> dict[str, Any]:
        total = self.value.clone()
        if not self.deadlock or self.ctx.rank == 0:
            dist.all_reduce(total)
        self.total = total
        return {"value": self.value, "total": total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.value = state_dict["value"]
        self.total = state_dict["total"]
        check = self.value.clone()
        dist.all_reduce(check)
        self.agreed = float(check.item()) / self.ctx.world_size

    def observe(self) -> dict[str, float]:
        return {"value": float(self.value.item()), "total": float(self.total.item()), "agreed": self.agreed}


class App:
    """A Stateful wrapping a model and its optimizer (the DCP recipe's AppState)."""

    def __init__(self, side: Side, get: Options, put: Options) -> None:
        self.side, self.get, self.put = side, get, put

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self.side.opt is not None
        msd, osd = get_state_dict(self.side.model, self.side.opt, options=state_dict_options(self.get))
        return {"model": msd, "optimizer": osd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        assert self.side.opt is not None
        set_state_dict(
            self.side.model,
            self.side.opt,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optimizer"],
            options=state_dict_options(self.put),
        )


def _options(full: bool, offload: bool, *, load: bool, strict: bool = True) -> Options:
    # A full state dict offloaded to CPU lives on rank 0 only: loading it must broadcast.
    return Options(
        full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict
    )


def extra_value(case: Case) -> torch.Tensor:
    return torch.arange(5, dtype=torch.float64) * ((case.seed % 97) + 0.25)


def _values(
    body: DcpBody,
    case: Case,
    side: Side,
    ctx: RankContext,
    get: Options,
    put: Options,
    fresh: bool,
    skip: tuple[Entry, ...],
) -> dict[Entry, Any]:
    """Every entry's value, computed in ``entries`` order (collectives in one order)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    out: dict[Entry, Any] = {}
    for entry in body.entries:
        if entry in skip:
            continue
        if entry is Entry.MODEL:
            if body.module_stateful:
                out[entry] = side.model
            else:
                out[entry] = get_model_state_dict(side.model, options=state_dict_options(get))
        elif entry is Entry.OPTIMIZER:
            assert side.opt is not None
            out[entry] = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options(get))
        elif entry is Entry.APP:
            out[entry] = App(side, get, put)
        elif entry is Entry.SCALARS:
            values = scalar_values(case, body)
            out[entry] = Scalars({k: type(v)() if fresh else v for k, v in values.items()})
        elif entry is Entry.COUNTER:
            out[entry] = Counter(0.0 if fresh else float(case.seed % 1009) + 0.5, ctx, deadlock=body.deadlock)
        elif entry is Entry.EXTRA:
            out[entry] = torch.zeros(5, dtype=torch.float64) if fresh else extra_value(case)
    return out


def _arrange(body: DcpBody, values: dict[Entry, Any], ctx: RankContext) -> dict[str, Any]:
    """The top-level dict, built in this rank's order."""
    order = body.orders[ctx.rank] if body.orders else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}


def _tensors(value: Any, path: str = "") -> list[tuple[str, int]]:
    """(path, id) of every tensor inside nested dicts / lists."""
    if isinstance(value, torch.Tensor):
        return [(path, id(value))]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _tensors(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f"{path}[{i}]")]
    return []


def _in_place_problem(state: dict[str, Any], before: dict[str, Any], tensors: dict[str, list[Any]]) -> str:
    """'' if every non-Stateful value passed to dcp.load is still the same object, with the
    same tensor objects inside; else what changed."""
    for key, value in before.items():
        if state.get(key) is not value:
            return f"state[{key!r}] was replaced by another object"
        now = dict(_tensors(value))
        for path, ident in tensors[key]:
            if now.get(path) != ident:
                return f"the tensor at {key}{path} was replaced instead of loaded in place"
    return ""


def _save(body: DcpBody, state: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp

    kwargs: dict[str, Any] = {}
    if body.storage_objects:
        kwargs["storage_writer"] = dcp.FileSystemWriter(path)
    else:
        kwargs["checkpoint_id"] = path
    if body.async_save:
        result = dcp.async_save(state, **kwargs)
        # A Future in torch 2.11; with some stagers newer versions return AsyncSaveResponse.
        future: Any = getattr(result, "upload_completion", result)
        future.result()
    else:
        dcp.save(state, **kwargs)


def _load(body: DcpBody, state: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp

    if body.storage_objects:
        dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    else:
        dcp.load(state, checkpoint_id=path)


def _observe_entries(values: dict[Entry, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry, value in values.items():
        if entry is Entry.SCALARS:
            out["scalars"] = value.values
        elif entry is Entry.COUNTER:
            out["counter"] = value.observe()
        elif entry is Entry.EXTRA:
            out["extra"] = [float(v) for v in value.tolist()]
    return out


def run_dcp(case: Case, body: DcpBody, ctx: RankContext) -> dict[str, Any]:
    t = body.training
    get_save = _options(body.save_full_state_dict, body.save_cpu_offload, load=False)
    get_load = _options(body.load_full_state_dict, body.load_cpu_offload, load=False)
    put = _options(body.load_full_state_dict, body.load_cpu_offload, load=True, strict=not body.drop)
    path = body.checkpoint_dir or case_dir(case, ctx)
    if body.mode is DcpMode.ROUND_TRIP and ctx.rank == 0:
        # Left over by a run of this case that was killed (the ranks never write before every
        # rank has entered dcp.save, so removing it here races with nothing).
        shutil.rmtree(path, ignore_errors=True)
    obs: dict[str, Any] = {}
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)

    src: Side | None = None
    if body.mode is not DcpMode.LOAD_ONLY:
        src = build_side(body.tree, body.source, t, ctx, seed=case.seed)
        add_optimizer(src, t)
        seed_segment(case, ctx, 0)
        obs["losses_before"] = train_steps(src, data[: t.steps], ctx)
        values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
        _save(body, _arrange(body, values, ctx), path)
        obs["saved"] = {**observe(src, case, body.tree, ctx), **_observe_entries(values)}
        if body.mode is DcpMode.SAVE_ONLY:
            return obs

    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init)
    if body.target_meta_init:
        tgt.model.to_empty(device=ctx.device)  # DCP loads in place: the parameters need storage
    add_optimizer(tgt, fresh_training(t))
    dropped = dropped_keys(tgt, body.drop)
    obs["dropped"] = dropped
    # A meta-device model has no values before the load (to_empty leaves garbage).
    obs["fresh"] = observe(tgt, case, body.tree, ctx, model=not body.target_meta_init)
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=body.skip)
    if dropped and Entry.MODEL in values:
        values[Entry.MODEL] = {k: v for k, v in values[Entry.MODEL].items() if k not in dropped}
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    _load(body, state, path)
    obs["in_place"] = _in_place_problem(state, plain, tensors)
    _finish_load(body, tgt, values, put)
    obs["loaded"] = {**observe(tgt, case, body.tree, ctx), **_observe_entries(values)}

    if src is not None and body.steps_after and not dropped and _loads_everything(body):
        obs.update(resume_both(case, src, tgt, data[t.steps :], ctx))
    if body.mode is DcpMode.ROUND_TRIP:
        dist.barrier()
        if ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return obs


def _loads_everything(body: DcpBody) -> bool:
    """Whether the load restores the model and the optimizer (so training can resume)."""
    loaded = [e for e in body.entries if e not in body.skip]
    return Entry.APP in loaded or (Entry.MODEL in loaded and Entry.OPTIMIZER in loaded)


def _finish_load(body: DcpBody, side: Side, values: dict[Entry, Any], put: Options) -> None:
    """After dcp.load filled the state dicts in place: hand them to set_*."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = state_dict_options(put)
    if Entry.MODEL in values and not body.module_stateful:
        msd = values[Entry.MODEL]
        set_model_state_dict(side.model, msd, options=options)
    if Entry.OPTIMIZER in values:
        assert side.opt is not None
        set_optimizer_state_dict(side.model, side.opt, values[Entry.OPTIMIZER], options=options)
