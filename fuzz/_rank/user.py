"""The rank programs of the user's own model (:class:`fuzz.model.user.UserParityBody`,
:class:`~fuzz.model.user.UserStateBody`).

Every rank loads the factory the case's spec names, seeds torch's generator from the case and
builds ``(model, batch_fn, loss_fn)``; compositions are applied by :func:`fuzz._rank.compose.compose`
over the model's named submodules, trained with the parity helpers of :mod:`fuzz._rank.parity`.
Batches: per step and microbatch, ``batch_fn(batch_per_rank, generator)`` once per rank in rank
order, from one generator seeded by the case, each rank keeping its own (so the ranks together
train on the global batch ``world_size * batch_per_rank``).
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fuzz._rank.compose import TORCH_DTYPES, Composed, compose
from fuzz._rank.context import RankContext
from fuzz._rank.parity import (
    RankContracts,
    average_gradients,
    grad_norm,
    local_replicated,
    make_optimizer,
    seed_for_run,
)
from fuzz.model import AccumSync, Case, Composition, Dtype, Training
from fuzz.model.user import RoundTrip, UserParityBody, UserStateBody, digest, load_factory


class ModelChanged(RuntimeError):
    """The model the spec names is not the one the case was drawn for (its file was edited)."""


def call_model(model: Any, inputs: Any) -> Any:
    """The model's forward on what ``batch_fn`` returned as inputs: a tuple or list is passed as
    positional arguments, a dict as keyword arguments, anything else as the one argument."""
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


def cast_floats(obj: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """``obj`` (tensors in tuples, lists and dicts) with floating tensors cast to ``dtype`` and
    every tensor moved to ``device``; integer inputs (token ids) keep their dtype."""
    if isinstance(obj, torch.Tensor):
        if dtype is not None and obj.is_floating_point():
            obj = obj.to(dtype)
        return obj if device is None else obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_floats(o, dtype, device) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype, device) for k, v in obj.items()}
    return obj


def flat_values(obj: Any) -> list[float]:
    """Every number of a forward's output (tensors in tuples, lists, dicts by sorted key and
    dataclasses), as one flat list of floats."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, torch.Tensor):
        t = obj.full_tensor() if isinstance(obj, DTensor) else obj
        return [float(v) for v in t.detach().double().cpu().flatten().tolist()]
    if isinstance(obj, (tuple, list)):
        return [v for o in obj for v in flat_values(o)]
    if isinstance(obj, dict):
        return [v for k in sorted(obj, key=str) for v in flat_values(obj[k])]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [v for f in dataclasses.fields(obj) for v in flat_values(getattr(obj, f.name))]
    if isinstance(obj, (int, float, bool)):
        return [float(obj)]
    return []


def build_user(body: UserParityBody | UserStateBody, ctx: RankContext, seed: int) -> tuple[nn.Module, Any, Any]:
    """The user's ``(model, batch_fn, loss_fn)`` built under ``torch.manual_seed(seed)``, in the
    case's dtype, on the rank's device; :class:`ModelChanged` if its parameters are not those
    the case was drawn for."""
    factory = load_factory(body.model, "model")
    torch.manual_seed(seed)
    model, batch_fn, loss_fn = factory()
    if body.digest:
        now = digest([(n, tuple(p.shape)) for n, p in model.named_parameters()])
        if now != body.digest:
            raise ModelChanged(
                f"{body.model} builds a model with other parameters (digest {now}) than the case was drawn for "
                f"({body.digest}): its file changed since; draw new cases"
            )
    if body.training.dtype is not Dtype.FLOAT32:
        model = model.to(TORCH_DTYPES[body.training.dtype])
    return model.to(ctx.device), batch_fn, loss_fn


def user_batches(case: Case, training: Training, batch_fn: Any, ctx: RankContext, extra: int = 0) -> list[Any]:
    """Per step (``training.steps`` and ``extra`` more), per microbatch: this rank's
    ``(inputs, targets)`` (rank 0's on every rank with ``same_input``)."""
    gen = torch.Generator().manual_seed(case.seed)
    dtype = TORCH_DTYPES[training.dtype]
    own = 0 if training.same_input else ctx.rank
    out = []
    for _ in range(training.steps + extra):
        step = []
        for _ in range(training.grad_accum):
            drawn = [batch_fn(training.batch_per_rank, gen) for _ in range(ctx.world_size)]
            step.append(cast_floats(drawn[own], dtype, ctx.device))
        out.append(step)
    return out


def train_user(
    case: Case,
    composed: Composed,
    batches: list[Any],
    loss_fn: Any,
    training: Training,
    ctx: RankContext,
    comp: Composition | None,
) -> dict[str, Any]:
    """Train ``composed`` (``comp`` None: the plain reference, whose gradients are averaged over
    the ranks with one all-reduce per step) on ``batches``; observations as JSON, in the form
    :func:`fuzz.properties.parity.compare_runs` reads."""
    model = composed.model
    opt = make_optimizer(model.parameters(), training)
    contracts = RankContracts(model, comp) if comp is not None else None
    obs: dict[str, Any] = {}
    losses: list[list[float]] = []
    grad_norms: list[float] = []
    params: list[dict[str, list[float]]] = []
    seed_for_run(case, ctx)
    for step in batches:
        step_losses = []
        for i, (inputs, targets) in enumerate(step):
            sync = AccumSync.ALWAYS if i == len(step) - 1 else training.accum_sync
            composed.set_sync(
                requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC,
                requires_all_reduce=sync is AccumSync.ALWAYS,
            )
            out = call_model(model, inputs)
            if contracts is not None:
                obs["contracts"] = contracts.after_forward([])
                contracts = None
            loss = loss_fn(out, targets)
            loss.backward()
            step_losses.append(loss.item())
        if comp is None:
            average_gradients(model, ctx, {})
        grad_norms.append(grad_norm(composed))
        opt.step()
        opt.zero_grad(set_to_none=training.set_to_none)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs["losses"] = losses
    obs["grad_norms"] = grad_norms
    obs["local_params"] = local_replicated(model)
    obs["knob_problems"] = []
    if ctx.rank == 0:
        obs["params"] = params
    return obs


def run_user_parity(case: Case, body: UserParityBody, ctx: RankContext) -> dict[str, Any]:
    """The composed model against a deep copy of it made before composing, trained as the plain
    all-reduce reference on the same batches."""
    model, batch_fn, loss_fn = build_user(body, ctx, case.seed)
    reference = copy.deepcopy(model)
    batches = user_batches(case, body.training, batch_fn, ctx)
    composed = compose(model, body.composition, ctx)
    observed = train_user(case, composed, batches, loss_fn, body.training, ctx, body.composition)
    ref = train_user(case, Composed(reference), batches, loss_fn, body.training, ctx, None)
    return {**observed, "ref": {k: ref[k] for k in ("losses", "params", "grad_norms") if k in ref}}


def plain(obj: Any) -> Any:
    """A state dict as JSON: each tensor (a DTensor gathered whole: a collective on every rank)
    as its dtype, shape and values; dicts, lists and numbers as they are."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, torch.Tensor):
        t = obj.full_tensor() if isinstance(obj, DTensor) else obj
        values = t.detach().double().cpu().flatten().tolist()
        return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "values": values}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def _cloned(obj: Any) -> Any:
    """A state dict with every tensor cloned (dicts and lists rebuilt)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _cloned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cloned(v) for v in obj]
    return obj


def _probe(model: nn.Module, inputs: Any, case: Case, ctx: RankContext) -> list[float]:
    """Forward outputs on ``inputs`` without autograd, the RNG seeded as for the run (dropout
    draws the same masks before the save and after the load)."""
    seed_for_run(case, ctx)
    with torch.no_grad():
        return flat_values(call_model(model, inputs))


def _shared_directory(ctx: RankContext) -> str:
    """A fresh directory rank 0 makes, its name sent to every rank."""
    name = [tempfile.mkdtemp(prefix="shardfuzz-user-dcp-") if ctx.rank == 0 else ""]
    dist.broadcast_object_list(name, src=0)
    return str(name[0])


def run_user_state(case: Case, body: UserStateBody, ctx: RankContext) -> dict[str, Any]:
    """Train, take the state, move it into a fresh model (built from another seed, composed as
    ``body.target`` or as the source), load it; report the state saved and read back, and
    forward outputs on a held-out batch before the save and after the load."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    model, batch_fn, loss_fn = build_user(body, ctx, case.seed)
    batches = user_batches(case, body.training, batch_fn, ctx, extra=1)
    composed = compose(model, body.composition, ctx)
    opt = make_optimizer(composed.model.parameters(), body.training)
    seed_for_run(case, ctx)
    for step in batches[:-1]:
        for inputs, targets in step:
            loss_fn(call_model(composed.model, inputs), targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=body.training.set_to_none)
    probe = batches[-1][0][0]
    before = _probe(composed.model, probe, case, ctx)
    options = StateDictOptions(full_state_dict=body.full_state_dict, cpu_offload=body.cpu_offload)
    msd, osd = get_state_dict(composed.model, opt, options=options)
    saved = plain({"model": msd, "optim": osd})
    directory = None
    if body.mode is RoundTrip.DCP:
        import torch.distributed.checkpoint as dcp

        directory = _shared_directory(ctx)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    target, _, _ = build_user(body, ctx, case.seed + 1)
    composed2 = compose(target, body.target or body.composition, ctx)
    opt2 = make_optimizer(composed2.model.parameters(), body.training)
    try:
        if directory is not None:
            import torch.distributed.checkpoint as dcp

            msd, osd = get_state_dict(composed2.model, opt2, options=options)
            dcp.load({"model": msd, "optim": osd}, checkpoint_id=directory)
        else:
            # A copy, as a save would make: torch's optimizer load keeps the tensors it is given
            # (Optimizer.load_state_dict: "shallow copy"), and the source, which trains on
            # uninterrupted below, would then share its state with the target.
            msd, osd = _cloned(msd), _cloned(osd)
        set_state_dict(composed2.model, opt2, model_state_dict=msd, optim_state_dict=osd, options=options)
    finally:
        if directory is not None:
            dist.barrier()
            if ctx.rank == 0:
                shutil.rmtree(directory, ignore_errors=True)
    msd2, osd2 = get_state_dict(composed2.model, opt2, options=options)
    loaded = plain({"model": msd2, "optim": osd2})
    obs: dict[str, Any] = {"before": before, "after": _probe(composed2.model, probe, case, ctx)}
    # Training resumed from the loaded state continues as the uninterrupted one: one more step
    # of each on the held-out batch.
    obs["resumed"] = _one_step(composed2, opt2, batches[-1], loss_fn, body.training, case, ctx)
    obs["uninterrupted"] = _one_step(composed, opt, batches[-1], loss_fn, body.training, case, ctx)
    if ctx.rank == 0:
        obs["saved"], obs["loaded"] = saved, loaded
    return obs


def _one_step(
    composed: Composed, opt: Any, step: list[Any], loss_fn: Any, training: Training, case: Case, ctx: RankContext
) -> dict[str, Any]:
    """One optimizer step on ``step``'s microbatches: the losses, and (rank 0) the parameters after."""
    seed_for_run(case, ctx)
    losses = []
    for inputs, targets in step:
        loss = loss_fn(call_model(composed.model, inputs), targets)
        loss.backward()
        losses.append(loss.item())
    opt.step()
    opt.zero_grad(set_to_none=training.set_to_none)
    out: dict[str, Any] = {"losses": losses}
    with composed.full_parameters() as full:
        if ctx.rank == 0:
            out["params"] = {n: t.double().cpu().flatten().tolist() for n, t in full.items()}
    return out
