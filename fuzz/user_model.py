"""The driver's checks of a user's model (``--model``, ``strategies.user_cases``), before any rank
starts, and what it learns of the model for drawing compositions (:class:`fuzz.model.user.ModelInfo`).

Bad input is an :class:`~fuzz.errors.InvalidArgument` (exit 2 on the command line) naming the
spec and what is wrong: a file that does not exist, a NAME that is missing or not callable, a
factory that raises or returns something else than ``(model, batch_fn, loss_fn)``, a model
with no (trainable) parameters, one that cannot be deep-copied for the reference, a
``batch_fn`` whose outputs the model or the loss cannot take, a loss that is no scalar, a
factory that builds other weights under the same seed (the ranks must all build the same).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from fuzz.errors import InvalidArgument
from fuzz.model.user import ModelInfo, UserModule, digest, load_factory

#: Seed of the driver's probe build (any: the checks compare two builds under one seed).
PROBE_SEED = 1234
PROBE_BATCH = 2


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def build(factory: Callable[[], Any], spec: str, argument: str = "--model") -> tuple[Any, Any, Any]:
    """``factory()`` checked to be ``(nn.Module, batch_fn, loss_fn)``."""
    from torch import nn

    try:
        built = factory()
    except Exception as e:
        raise InvalidArgument(f"{argument} {spec!r}: the factory raised {_one_line(e)}") from None
    if not isinstance(built, tuple) or len(built) != 3:
        raise InvalidArgument(
            f"{argument} {spec!r}: the factory returned {type(built).__name__}; "
            "return a tuple (model, batch_fn, loss_fn)"
        )
    model, batch_fn, loss_fn = built
    if not isinstance(model, nn.Module):
        raise InvalidArgument(f"{argument} {spec!r}: the model is a {type(model).__name__}, not a torch.nn.Module")
    for name, fn in (("batch_fn", batch_fn), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise InvalidArgument(f"{argument} {spec!r}: {name} is a {type(fn).__name__}, not a callable")
    return model, batch_fn, loss_fn


@functools.lru_cache(maxsize=16)
def describe(spec: str, argument: str = "--model") -> ModelInfo:
    """Load the model ``spec`` names, check it (InvalidArgument naming ``argument`` on bad
    input) and describe it: its modules, which hold (trainable, unused) parameters, which share
    one, and its :func:`~fuzz.model.user.digest`. Cached per spec."""
    import torch

    factory = load_factory(spec, argument)
    torch.manual_seed(PROBE_SEED)
    model, batch_fn, loss_fn = build(factory, spec, argument)
    where = f"{argument} {spec!r}"
    params = list(model.named_parameters())
    if not params:
        raise InvalidArgument(f"{where}: the model has no parameters; there is nothing to shard or train")
    if not any(p.requires_grad for _, p in params):
        raise InvalidArgument(f"{where}: every parameter of the model is frozen (requires_grad=False)")
    if any(p.device.type != "cpu" for _, p in params):
        raise InvalidArgument(f"{where}: build the model on the CPU (the ranks move it to their device)")
    try:
        reference = copy.deepcopy(model)
    except Exception as e:
        raise InvalidArgument(
            f"{where}: the model cannot be deep-copied for the reference ({_one_line(e)}); "
            "keep unpicklable objects (locks, open files, generators) out of its attributes"
        ) from None
    _check_same_build(factory, reference, where)
    calls = _check_loss(model, batch_fn, loss_fn, where)
    unused = {id(p) for _, p in params if p.requires_grad and p.grad is None}
    return ModelInfo(
        spec=spec,
        modules=_modules(model, unused, calls),
        shared=_shared(model),
        digest=digest([(n, tuple(p.shape)) for n, p in params]),
        float64=_takes_float64(reference, batch_fn, loss_fn),
    )


def _takes_float64(model: Any, batch_fn: Any, loss_fn: Any) -> bool:
    """Whether the model trains in float64 (cast whole, floating inputs cast): where it does not
    (a dtype fixed inside its forward), the strategies keep it in float32."""
    import torch

    from fuzz._rank.user import call_model, cast_floats

    try:
        inputs, targets = cast_floats(batch_fn(PROBE_BATCH, torch.Generator().manual_seed(PROBE_SEED)), torch.float64)
        loss_fn(call_model(model.to(torch.float64), inputs), targets).backward()
    except Exception:
        return False
    return True


def _check_loss(model: Any, batch_fn: Any, loss_fn: Any, where: str) -> dict[int, int]:
    """A batch, a forward, the loss and a backward, as the ranks run them; how often forward
    called each module (by id)."""
    import torch

    calls: dict[int, int] = {}

    def count(module: Any, args: Any) -> None:
        calls[id(module)] = calls.get(id(module), 0) + 1

    gen = torch.Generator().manual_seed(PROBE_SEED)
    try:
        batch = batch_fn(PROBE_BATCH, gen)
    except Exception as e:
        raise InvalidArgument(f"{where}: batch_fn({PROBE_BATCH}, generator) raised {_one_line(e)}") from None
    if not isinstance(batch, tuple) or len(batch) != 2:
        raise InvalidArgument(
            f"{where}: batch_fn returned {type(batch).__name__}; return a tuple (inputs, targets)"
        ) from None
    inputs, targets = batch
    from fuzz._rank.user import call_model

    handles = [m.register_forward_pre_hook(count) for m in model.modules()]
    try:
        out = call_model(model, inputs)
    except Exception as e:
        raise InvalidArgument(f"{where}: the model cannot take batch_fn's inputs: {_one_line(e)}") from None
    finally:
        for h in handles:
            h.remove()
    try:
        loss = loss_fn(out, targets)
    except Exception as e:
        raise InvalidArgument(
            f"{where}: loss_fn cannot take the model's outputs and batch_fn's targets: {_one_line(e)}"
        ) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise InvalidArgument(f"{where}: loss_fn returned {what}; return a floating-point scalar tensor")
    if not loss.requires_grad:
        raise InvalidArgument(f"{where}: the loss does not depend on any trainable parameter (no grad_fn)")
    try:
        loss.backward()
    except Exception as e:
        raise InvalidArgument(f"{where}: backward from the loss raised {_one_line(e)}") from None
    return calls


def _check_same_build(factory: Any, first: Any, where: str) -> None:
    """Every rank builds the model from the same seed: two builds under one seed must agree."""
    import torch

    torch.manual_seed(PROBE_SEED)
    again = factory()[0]
    want = first.state_dict()
    for name, t in again.state_dict().items():
        if name not in want or want[name].shape != t.shape or not torch.equal(want[name], t):
            raise InvalidArgument(
                f"{where}: two builds under torch.manual_seed({PROBE_SEED}) differ in {name!r}; "
                "draw the initial weights from torch's global generator only, so every rank builds the same model"
            )


def _modules(model: Any, unused: set[int], calls: dict[int, int]) -> tuple[UserModule, ...]:
    out = []
    for path, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        out.append(
            UserModule(
                path=path,
                kind=type(module).__name__,
                owns=bool(own),
                trainable=any(p.requires_grad for p in own),
                unused=any(id(p) in unused for p in own),
                holds=any(True for _ in module.parameters()),
                calls=calls.get(id(module), 0),
            )
        )
    return tuple(out)


def _shared(model: Any) -> tuple[tuple[str, ...], ...]:
    """Groups of modules that hold one parameter between them (first path of each module)."""
    paths = {id(m): p for p, m in model.named_modules()}
    holders: dict[int, list[str]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            path = paths[id(module)]
            if path not in holders.setdefault(id(p), []):
                holders[id(p)].append(path)
    return tuple(tuple(g) for g in holders.values() if len(g) > 1)


def spec_of(model: str | Callable[[], Any], argument: str = "model") -> str:
    """The spec of a factory (``FILE.py:NAME``, the file relative to the working directory where
    it lies under it) or a spec given as such. A factory must be a module-level callable of a
    file the ranks can load: not a lambda, a nested function or one of ``__main__``."""
    if isinstance(model, str):
        return model
    import inspect
    import os
    from pathlib import Path

    name = getattr(model, "__qualname__", "")
    try:
        source = inspect.getsourcefile(model)
    except TypeError:
        source = None
    if not callable(model) or not name.isidentifier() or source is None:
        raise InvalidArgument(
            f"{argument}={model!r}: name a module-level function (not a lambda, a method or a nested "
            "function) so that every rank can load it by FILE.py:NAME"
        )
    path = Path(source).resolve()
    try:
        shown = str(path.relative_to(Path(os.getcwd()).resolve()))
    except ValueError:
        shown = str(path)
    return f"{shown}:{name}"
