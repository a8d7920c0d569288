"""The observing half of a contract failure's printed script (:mod:`fuzz.repro.print_contract`):
the code that records, through FSDP2's and autograd's own observation points, what the rank
recorders record (``fuzz/_rank/order.py``, ``memory.py``, ``activations.py``), and judges it
against the rule the composition and the API's docstring give.

Each piece is script text. Every script gets :data:`COMMON` (``SEEN``, the per-microbatch
boundary, FSDP2's parameter groups read only); a contract adds its own pieces
(:func:`pieces`), each a set of top-level definitions plus the lines ``observed(model)`` runs
to install them and the lines the microbatch boundary runs to judge and forget. Nothing in the
script is a value observed by the ranks: the documented side is computed at run time from the
composition's literals (units, their ``reshard_after_forward``, prefetch targets, regions).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

#: Every contract script's helpers: what it saw, where a backward runs, a unit's FSDP2 state.
COMMON = textwrap.dedent(
    """\
    SEEN = []  # (broken, what was observed against what is documented), in the order observed


    def in_backward():  # whether the autograd engine runs a backward on this thread
        return torch._C._current_graph_task_id() != -1


    def tensors(value):  # the tensors of a module's arguments or output
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, dict):
            value = list(value.values())
        return [t for v in value for t in tensors(v)] if isinstance(value, (list, tuple)) else []


    def groups(unit):  # FSDP2's parameter groups of a fully_shard unit (read, never changed)
        state = unit._get_fsdp_state()
        found = getattr(state, "_fsdp_param_groups", None)
        if found is None:
            found = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
        return list(found)


    def unsharded_bytes(unit):  # the storage its all-gathers wrote the unsharded parameters into (freed: size 0)
        params = [p for g in groups(unit) for p in g.fsdp_params]
        return sum(t.untyped_storage().size() for p in params for t in [*p.all_gather_outputs, *p._unsharded_inner_tensors])


    def full_bytes(unit):  # what its parameters take unsharded, in the dtype it all-gathers them in
        params = [p for g in groups(unit) for p in g.fsdp_params]
        return sum(p.sharded_param.numel() * (p.param_dtype or p.orig_dtype).itemsize for p in params)"""  # noqa: E501
)

#: FSDP2's custom comm interface with torch's default collectives, each call noted in ``LOG``.
RECORDING = textwrap.dedent(
    """\
    LOG = []  # this microbatch's collectives: (kind, unit, in backward), in the order FSDP2 called them


    class Recording:  # a comm of FSDP2's custom comm interface: torch's default one, each call noted
        def __init__(self, kind, unit, comm):
            self.kind, self.unit, self.comm = kind, unit, comm

        def allocate(self, size, *, dtype, device):
            return self.comm.allocate(size, dtype=dtype, device=device)

        def __call__(self, *args, **kwargs):
            LOG.append((self.kind, self.unit, in_backward()))
            @CALLED@
            return self.comm(*args, **kwargs)"""
)

#: Forward counts per unit this microbatch (a unit run twice reduce-scatters once per call).
RUNS = textwrap.dedent(
    """\
    RUNS = {}  # unit -> forwards started this microbatch


    def counted(path):
        def hook(module, args, kwargs):
            if not in_backward() and torch.is_grad_enabled():
                RUNS[path] = RUNS.get(path, 0) + 1

        return hook"""
)

#: Which unit's inputs were computed from which unit's outputs, read off the autograd graph.
FLOW = textwrap.dedent(
    """\
    FED, INPUTS, OUTPUTS, CLOSED, LIVE = {}, {}, {}, set(), set()  # this microbatch's data flow between units


    def nodes(value):
        return {t.grad_fn for t in tensors(value) if t.grad_fn is not None}


    def reaches(starts, goals):  # the nodes of goals reachable from starts (towards the leaves), not past them
        found, seen, todo = set(), set(), list(starts)
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node in goals:
                found.add(node)
            else:
                todo.extend(n for n, _ in node.next_functions)
        return found


    def fed(path):  # after FSDP2's pre-forward: the units whose outputs this unit's inputs came from
        def hook(module, args, kwargs):
            if not in_backward() and torch.is_grad_enabled():
                INPUTS[path] = nodes((args, kwargs))
                FED[path] = {u for node in reaches(INPUTS[path], set(OUTPUTS)) for u in OUTPUTS[node]}

        return hook


    def produced(path):
        def hook(module, args, output):
            if in_backward() or not torch.is_grad_enabled() or RUNS.get(path) != 1:
                return
            if not INPUTS[path] or all(reaches({n}, INPUTS[path]) for n in nodes(output)):
                CLOSED.add(path)  # every output depends on the inputs, where FSDP2's post-backward hook sits
            for node in nodes(output):
                OUTPUTS.setdefault(node, set()).add(path)
            for t in tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad: LIVE.add(path))

        return hook"""
)


@dataclass(frozen=True)
class Piece:
    """What one contract adds to a script: definitions, the lines of ``observed(model)`` that
    install it (``model`` composed; ``UNIT``: path -> unit), the lines of the microbatch boundary
    that judge the microbatch just done and forget it, the line the recording comm runs at each
    call (or "")."""

    definitions: list[str]
    install: list[str]
    judge: list[str] = field(default_factory=list)
    called: str = ""
    imports: list[str] = field(default_factory=list)


_COMMS = "from torch.distributed.fsdp._fully_shard._fsdp_collectives import "


def forward_prefetch() -> Piece:
    """``set_modules_to_forward_prefetch``: at each unit's forward start, its targets
    (``FORWARD_PREFETCH``, the composition's) were all-gathered in this forward, hold their
    unsharded parameters, or have an all-gather pending."""
    check = textwrap.dedent(
        """\
        def gathers(unit):  # whether an all-gather of it is a collective: parameters, over more than one rank
            return any(g.fsdp_params for g in groups(unit)) and groups(unit)[0].mesh_info.shard_mesh_size > 1


        def at_forward(path):  # after FSDP2's pre-forward (which all-gathers, then prefetches)
            def hook(module, args):
                if in_backward():
                    return
                gathered = [u for kind, u, backward in LOG if kind == "all-gather" and not backward]
                for target in FORWARD_PREFETCH.get(path, []):
                    unit = UNIT[target]
                    if not gathers(unit):
                        continue
                    pending = any(getattr(g, "_all_gather_result", None) is not None for g in groups(unit))
                    held = unsharded_bytes(unit)
                    broken = target not in gathered and not held and not pending
                    SEEN.append((broken, f"at {path!r}'s forward start: all-gathered in this forward {gathered}, "
                                         f"{target!r} holds {held} unsharded bytes, all-gather pending: {pending}; "
                                         f"documented: {target!r} all-gathered (prefetched after {path!r}'s copy-out)"))

            return hook"""
    )
    install = [
        "for path in UNIT:",
        '    UNIT[path].set_custom_all_gather(Recording("all-gather", path, DefaultAllGather()))',
        "    UNIT[path].register_forward_pre_hook(at_forward(path))",
    ]
    return Piece([RECORDING, check], install, ["LOG.clear()"], imports=[_COMMS + "DefaultAllGather"])


def backward_prefetch() -> Piece:
    """``set_modules_to_backward_prefetch``: right after a unit's pre-backward (which prefetches;
    a gradient hook on its output, behind FSDP2's), once per microbatch, each target
    (``BACKWARD_PREFETCH``, the composition's) that ran forward holds its unsharded parameters or
    has an all-gather pending."""
    check = textwrap.dedent(
        """\
        RAN, CHECKED = set(), set()  # units run forward this microbatch; units whose prefetch was looked at


        def gathers(unit):  # whether an all-gather of it is a collective: parameters, over more than one rank
            return any(g.fsdp_params for g in groups(unit)) and groups(unit)[0].mesh_info.shard_mesh_size > 1


        def ran(path):
            def hook(module, args):
                if not in_backward() and torch.is_grad_enabled():
                    RAN.add(path)

            return hook


        def at_backward(path):  # FSDP2's pre-backward of the unit ran (and prefetched its targets)
            if path in CHECKED or groups(UNIT[path])[0]._training_state.name != "PRE_BACKWARD":
                return
            CHECKED.add(path)
            for target in [t for t in BACKWARD_PREFETCH.get(path, []) if t in RAN and gathers(UNIT[t])]:
                pending = any(getattr(g, "_all_gather_result", None) is not None for g in groups(UNIT[target]))
                held = unsharded_bytes(UNIT[target])
                said = f"at {path!r}'s backward start: {target!r} holds {held} unsharded bytes, all-gather pending: "
                SEEN.append((not held and not pending, f"{said}{pending}; documented: {target!r} all-gathered "
                                                       f"(prefetched by {path!r}'s pre-backward)"))


        def watched(path):  # behind FSDP2's post-forward, which hooks its pre-backward on the output first
            def hook(module, args, output):
                if not in_backward() and torch.is_grad_enabled():
                    for t in [t for t in tensors(output) if t.requires_grad]:
                        t.register_hook(lambda grad: at_backward(path))

            return hook"""
    )
    install = [
        "for path in UNIT:",
        '    UNIT[path].set_custom_all_gather(Recording("all-gather", path, DefaultAllGather()))',
        "    UNIT[path].register_forward_pre_hook(ran(path))",
        "    if BACKWARD_PREFETCH.get(path):",
        "        UNIT[path].register_forward_hook(watched(path))",
    ]
    clear = ["LOG.clear()", "RAN.clear()", "CHECKED.clear()"]
    return Piece([RECORDING, check], install, clear, imports=[_COMMS + "DefaultAllGather"])


def between_microbatches(microbatches: int) -> Piece:
    """``set_reshard_after_backward(False)`` with ``set_is_last_backward(False)`` on every
    microbatch but a step's last: after such a backward, each unit all-gathered in it still holds
    its unsharded parameters (or has an all-gather pending), and is not all-gathered again
    before its next forward."""
    check = textwrap.dedent(
        """\
        CALLS, LEFT, FORWARDED = [0], set(), set()  # boundaries passed; left unsharded; forward started this microbatch


        def judge_left():  # the microbatch just done: did its backward reshard (the step's last) or not
            if CALLS[0] and (CALLS[0] - 1) % MICROBATCHES == MICROBATCHES - 1:
                LEFT.clear()
            elif CALLS[0]:
                for path in dict.fromkeys(u for kind, u, backward in LOG if kind == "all-gather" and backward):
                    if path in LEFT:
                        continue
                    LEFT.add(path)
                    pending = any(getattr(g, "_all_gather_result", None) is not None for g in groups(UNIT[path]))
                    held = unsharded_bytes(UNIT[path])
                    said = f"after a backward with set_reshard_after_backward(False), {path!r} (all-gathered in it)"
                    said += f" holds {held} unsharded bytes, all-gather pending: {pending}"
                    SEEN.append((not held and not pending, f"{said}; documented: still unsharded"))
            CALLS[0] += 1
            FORWARDED.clear()


        def at_forward(path):  # after FSDP2's pre-forward
            def hook(module, args):
                if in_backward() or path in FORWARDED:
                    return
                FORWARDED.add(path)
                if path in LEFT:
                    again = [u for kind, u, backward in LOG if kind == "all-gather" and not backward].count(path)
                    SEEN.append((again > 0, f"{path!r}'s first forward after a backward that left it unsharded: "
                                            f"all-gathered {again} times since the microbatch began; documented: 0"))

            return hook"""
    )
    documented = (
        f"MICROBATCHES = {microbatches}  # a step's; set_reshard_after_backward(False) on every one but its last"
    )
    install = [
        "for path in UNIT:",
        '    UNIT[path].set_custom_all_gather(Recording("all-gather", path, DefaultAllGather()))',
        "    UNIT[path].register_forward_pre_hook(at_forward(path))",
    ]
    return Piece(
        [documented, RECORDING, check], install, ["judge_left()", "LOG.clear()"], imports=[_COMMS + "DefaultAllGather"]
    )


def reduce_scatter_order() -> Piece:
    """A unit whose forward consumed another unit's output reduce-scatters before it (where
    autograd fixes that order: both ran once, neither nested, both outputs depend on their inputs
    and the consumer's got a gradient)."""
    judge = textwrap.dedent(
        """\
        def judge_order():  # reverse order of the forward, where one unit's forward consumed the other's output
            scatters = [u for kind, u, backward in LOG if kind == "reduce-scatter" and backward]
            for later, sources in FED.items():
                for earlier in sorted(sources):
                    pair = (earlier, later)
                    if later in LIVE and all(RUNS.get(u) == 1 and u in scatters and u in CLOSED for u in pair):
                        broken = scatters.index(earlier) < scatters.index(later)
                        SEEN.append((broken, f"reduce-scatters in backward: {scatters}; documented: {later!r} before "
                                             f"{earlier!r} ({later!r}'s forward consumed {earlier!r}'s output)"))"""
    )
    install = [
        "for path in UNIT:",
        '    UNIT[path].set_custom_reduce_scatter(Recording("reduce-scatter", path, DefaultReduceScatter()))',
        "    UNIT[path].register_forward_pre_hook(counted(path), with_kwargs=True)",
        "    UNIT[path].register_forward_pre_hook(fed(path), with_kwargs=True)",
        "    UNIT[path].register_forward_hook(produced(path), always_call=True)",
    ]
    clear = ["judge_order()", "LOG.clear()", "RUNS.clear()"]
    clear += ["for seen in (FED, INPUTS, OUTPUTS, CLOSED, LIVE):", "    seen.clear()"]
    return Piece([RECORDING, RUNS, FLOW, judge], install, clear, imports=[_COMMS + "DefaultReduceScatter"])


def freed_at_reduce_scatter() -> Piece:
    """With ``set_reshard_after_backward(True)``: at each reduce-scatter in backward, the unit
    and the units that reduce-scattered before it (each run once in forward) hold no unsharded
    storage; the bound there is the unsharded bytes of the units not reduce-scattered yet."""
    check = textwrap.dedent(
        """\
        def at_reduce_scatter(path):  # FSDP2 frees a unit's unsharded parameters, then reduce-scatters its gradients
            done = dict.fromkeys(u for kind, u, backward in LOG if kind == "reduce-scatter" and backward)
            held = {u: unsharded_bytes(UNIT[u]) for u in done if RUNS.get(u) == 1}
            bound = sum(full_bytes(UNIT[u]) for u in UNIT if u not in done)
            said = f"at {path!r}'s reduce-scatter: unsharded bytes held {held}; documented: 0 by each unit"
            SEEN.append((any(held.values()), f"{said} reduce-scattered (the rest may hold {bound} bytes)"))"""
    )
    install = [
        "for path in UNIT:",
        '    UNIT[path].set_custom_reduce_scatter(Recording("reduce-scatter", path, DefaultReduceScatter()))',
        "    UNIT[path].register_forward_pre_hook(counted(path), with_kwargs=True)",
    ]
    called = 'if self.kind == "reduce-scatter" and in_backward():\n    at_reduce_scatter(self.unit)'
    return Piece(
        [RECORDING, RUNS, check], install, ["LOG.clear()", "RUNS.clear()"], called, [_COMMS + "DefaultReduceScatter"]
    )


def after_forward(resharded: dict[str, bool | int]) -> Piece:
    """After each FSDP root's forward: a unit whose forward ended there holds no unsharded
    storage where its ``reshard_after_forward`` is True or an int, and holds it where False
    (``ROOTS``: the composition's units per root, the root first)."""
    check = textwrap.dedent(
        """\
        ENDED = set()  # units whose forward ended this microbatch


        def ended(path):
            def hook(module, args, output):
                if not in_backward():
                    ENDED.add(path)

            return hook


        def after_root_forward(units):  # after FSDP2's post-forward of the root, which ends the forward
            def hook(module, args, output):
                for path in [u for u in units if u in ENDED and not in_backward()]:
                    held, kept = unsharded_bytes(UNIT[path]), RESHARD_AFTER_FORWARD[path] is False
                    broken = (held == 0 and any(g.fsdp_params for g in groups(UNIT[path]))) if kept else held > 0
                    want = "its unsharded parameters kept" if kept else "0 (resharded)"
                    SEEN.append((broken, f"after the root's forward, {path!r} holds {held} unsharded bytes; documented "
                                         f"with reshard_after_forward={RESHARD_AFTER_FORWARD[path]}: {want}"))

            return hook"""
    )
    documented = f"RESHARD_AFTER_FORWARD = {resharded!r}  # each unit's fully_shard(reshard_after_forward=...)"
    install = [
        "for path in UNIT:",
        "    UNIT[path].register_forward_hook(ended(path), always_call=True)",
        "for units in ROOTS:",
        "    UNIT[units[0]].register_forward_hook(after_root_forward(units))",
    ]
    return Piece([documented, check], install, ["ENDED.clear()"])


def forward_bound(resharded: dict[str, bool | int], prefetch: bool) -> Piece:
    """At each unit's forward start (after FSDP2's pre-forward), only the documented units hold
    unsharded parameters: the unit, units whose forward has not ended, units ended with
    ``reshard_after_forward=False``, forward-prefetch targets, and what was held when the
    microbatch started; the bound is their unsharded bytes."""
    targets = "FORWARD_PREFETCH.get(path, [])" if prefetch else "[]"
    check = textwrap.dedent(
        """\
        RUNNING, ENDED, PREFETCHED, AT_START = set(), set(), set(), set()  # this microbatch's forwards


        def at_forward(path):  # after FSDP2's pre-forward, which all-gathers the unit
            def hook(module, args):
                if in_backward():
                    return
                RUNNING.add(path)
                ENDED.discard(path)
                PREFETCHED.update(@TARGETS@)
                kept = {u for u in ENDED if RESHARD_AFTER_FORWARD[u] is False}
                allowed = {path} | RUNNING | kept | PREFETCHED | AT_START
                held = {u: unsharded_bytes(UNIT[u]) for u in UNIT}
                bound = sum(full_bytes(UNIT[u]) for u in allowed)
                broken = any(b and u not in allowed for u, b in held.items())
                said = f"at {path!r}'s forward start: unsharded bytes held {held}, {sum(held.values())} in all"
                SEEN.append((broken, f"{said}; documented: only {sorted(allowed)} may hold any, {bound} bytes"))

            return hook


        def ended(path):
            def hook(module, args, output):
                if not in_backward():
                    RUNNING.discard(path)
                    ENDED.add(path)

            return hook"""
    ).replace("@TARGETS@", targets)
    documented = f"RESHARD_AFTER_FORWARD = {resharded!r}  # each unit's fully_shard(reshard_after_forward=...)"
    install = [
        "for path in UNIT:",
        "    UNIT[path].register_forward_pre_hook(at_forward(path))",
        "    UNIT[path].register_forward_hook(ended(path), always_call=True)",
    ]
    clear = ["for seen in (RUNNING, ENDED, PREFETCHED, AT_START):", "    seen.clear()"]
    clear += ["AT_START.update(u for u in UNIT if unsharded_bytes(UNIT[u]))  # held when the microbatch starts"]
    return Piece([documented, check], install, clear)


def after_backward(microbatches: int) -> Piece:
    """After each backward with ``set_reshard_after_backward(True)`` (every microbatch, or a
    step's last where the case turns it off before the others: ``microbatches``), no unit of a
    root whose backward ran holds unsharded storage; read before the next forward (nothing in
    between unshards) and after training."""
    check = textwrap.dedent(
        """\
        CALLS, REACHED = [0], set()  # boundaries passed; units of the roots whose backward ran this microbatch


        def reached(units):  # a root's forward hook: its output's gradient means its backward runs
            def hook(module, args, output):
                if not in_backward() and torch.is_grad_enabled():
                    for t in [t for t in tensors(output) if t.requires_grad]:
                        t.register_hook(lambda grad: REACHED.update(units))

            return hook


        def judge_freed():  # the microbatch just done, where its backward resharded
            if CALLS[0] and (CALLS[0] - 1) % MICROBATCHES == MICROBATCHES - 1:
                for path in [u for u in UNIT if u in REACHED]:
                    held = unsharded_bytes(UNIT[path])
                    SEEN.append((held > 0, f"after a backward with set_reshard_after_backward(True), {path!r} holds "
                                           f"{held} unsharded bytes; documented: 0 (freed)"))
            CALLS[0] += 1
            REACHED.clear()"""
    )
    documented = f"MICROBATCHES = {microbatches}  # a step's backwards: the last reshards (all where this is 1)"
    install = ["for units in ROOTS:", "    UNIT[units[0]].register_forward_hook(reached(units))"]
    return Piece([documented, check], install, ["judge_freed()"])


def saved_inside(regions: list[str]) -> Piece:
    """``checkpoint``: no tensor saved for backward inside a checkpointed region reaches
    ``saved_tensors_hooks`` entered outside it (checkpoint's own, entered in its pre-hook, are
    the innermost and take them all)."""
    check = textwrap.dedent(
        """\
        INSIDE, RAN, SAVED = [], set(), {}  # regions running forward now; run this microbatch; their saves seen here


        def pack(t):  # a tensor saved for backward, seen by hooks entered outside every region
            if INSIDE:
                SAVED.setdefault(INSIDE[-1], []).append(tuple(t.shape))
            return t


        OUTER = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


        def enter(path):  # after checkpoint()'s pre-hook, which enters its own hooks
            def hook(module, args):
                if not in_backward() and torch.is_grad_enabled():
                    INSIDE.append(path)
                    RAN.add(path)

            return hook


        def leave(path):
            def hook(module, args, output):
                if INSIDE and INSIDE[-1] == path and not in_backward():
                    INSIDE.pop()

            return hook


        def judge_saved():
            for path in [r for r in REGIONS if r in RAN]:
                SEEN.append((bool(SAVED.get(path)), f"tensors saved for backward inside {path!r} outside checkpoint's "
                                                    f"hooks: {SAVED.get(path, [])}; documented: none (recomputed)"))"""
    )
    documented = f"REGIONS = {regions!r}  # the modules checkpoint() was applied to"
    install = [
        "model.register_forward_pre_hook(lambda *_: None if in_backward() else OUTER.__enter__(), prepend=True)",
        "model.register_forward_hook(lambda *_: None if in_backward() else OUTER.__exit__(None, None, None),",
        "                            always_call=True)",
        "for path in REGIONS:",
        "    model.get_submodule(path).register_forward_pre_hook(enter(path))",
        "    model.get_submodule(path).register_forward_hook(leave(path), prepend=True, always_call=True)",
    ]
    clear = ["judge_saved()", "RAN.clear()", "SAVED.clear()"]
    return Piece([documented, check], install, clear)


def recomputed(regions: list[str], contract: str) -> Piece:
    """What a checkpointed region's recomputation does in backward: ``contract`` "early_stop"
    (the default True: "stops recomputation as soon as it has computed all needed Tensors", so
    the region's forward does not return in backward: a forward hook without ``always_call`` is
    not called) or "rng" (``preserve_rng_state=True``: the recomputation starts from the CPU RNG
    state its forward started from, read as bytes, through no tensor op)."""
    check = textwrap.dedent(
        """\
        STATES, RECOMPUTED, RETURNED = {}, set(), set()  # RNG states at forward starts; regions run again in backward


        def rng_state():
            return torch.get_rng_state().numpy().tobytes()


        def started(path):  # after checkpoint()'s pre-hook (in backward: after it restored the RNG state)
            def hook(module, args):
                if not in_backward():
                    STATES.setdefault(path, []).append(rng_state())
                elif path not in RECOMPUTED:
                    RECOMPUTED.add(path)
                    @AT_RECOMPUTE@

            return hook


        def returned(path):  # a forward hook: called only where the forward returns
            def hook(module, args, output):
                if in_backward():
                    RETURNED.add(path)

            return hook"""
    )
    if contract == "rng":
        at = textwrap.dedent(
            """\
            restored = rng_state() in STATES.get(path, [])
            said = f"{path!r}'s recomputation starts from its forward's CPU RNG state: {restored}"
            SEEN.append((not restored, f"{said}; documented with preserve_rng_state=True: it does (restored)"))"""
        )
        check = _fill(check, "@AT_RECOMPUTE@", at)
        judge = ["STATES.clear()", "RECOMPUTED.clear()"]
    else:
        check = _fill(check, "@AT_RECOMPUTE@", "")
        check += "\n\n\n" + textwrap.dedent(
            """\
            def judge_returned():
                for path in sorted(RECOMPUTED):
                    said = f"{path!r}'s forward, recomputed in backward, returned: {path in RETURNED}"
                    SEEN.append((path in RETURNED, f"{said}; documented with early_stop=True: it stops at the last "
                                                   "tensor saved, inside the forward"))"""
        )
        judge = ["judge_returned()", "STATES.clear()", "RECOMPUTED.clear()", "RETURNED.clear()"]
    documented = f"REGIONS = {regions!r}  # the modules checkpoint() was applied to"
    install = [
        "for path in REGIONS:",
        "    model.get_submodule(path).register_forward_pre_hook(started(path))",
        "    model.get_submodule(path).register_forward_hook(returned(path))",
    ]
    return Piece([documented, check], install, judge)


def selective(regions: list[str]) -> Piece:
    """Selective checkpointing under the script's policy (matmuls ``MUST_SAVE``, the rest
    ``PREFER_RECOMPUTE``): in the recomputation, a ``Linear``'s output (a matmul's) is the
    tensor saved in forward (the same storage), an elementwise activation's is computed anew
    (another storage, the forward's kept alive here)."""
    check = textwrap.dedent(
        """\
        KEPT = {}  # module -> its outputs in forward, kept alive (a recomputed one cannot take their storage)


        def output_storage(path, saved):  # a Linear's output is a matmul's (MUST_SAVE); the rest PREFER_RECOMPUTE
            def hook(module, args, output):
                if type(output) is not torch.Tensor or output.numel() == 0:
                    return
                if not in_backward():
                    if torch.is_grad_enabled():
                        KEPT.setdefault(path, []).append(output)
                    return
                if path in KEPT:
                    same = output.untyped_storage().data_ptr() in {t.untyped_storage().data_ptr() for t in KEPT[path]}
                    got, want = ("the forward's" if same else "new"), ("the forward's" if saved else "new")
                    SEEN.append((same != saved, f"{path!r}'s output recomputed in backward: {got} storage; documented: "
                                                f"{want} ({'MUST_SAVE' if saved else 'PREFER_RECOMPUTE'})"))

            return hook"""
    )
    documented = f"REGIONS = {regions!r}  # the selectively checkpointed modules holding no fully_shard unit"
    install = [
        "for region in REGIONS:",
        "    for name, sub in model.get_submodule(region).named_modules():",
        '        if isinstance(sub, (nn.Linear, nn.ReLU, nn.Tanh, nn.GELU)) and not getattr(sub, "inplace", False):',
        '            path = f"{region}.{name}".strip(".")',
        "            sub.register_forward_hook(output_storage(path, saved=isinstance(sub, nn.Linear)))",
    ]
    return Piece([documented, check], install, ["KEPT.clear()"])


def _fill(text: str, token: str, code: str) -> str:
    """``text`` with the line holding ``token`` replaced by ``code`` at that line's indentation
    (the line removed where ``code`` is empty)."""
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if token in line)
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i : i + 1] = [indent + line if line else line for line in code.split("\n")] if code else []
    return "\n".join(lines)


def observe_lines(piece: Piece, units: list[str], knob_lines: list[str]) -> list[str]:
    """``observed(model)``: the composition, its knobs, then the piece's observation points
    (hooks registered after ``fully_shard``'s run after FSDP2's own), and
    ``microbatch_done()``, the boundary a prepended forward pre-hook of the model calls (and
    ``main`` after training)."""
    judge = piece.judge or ["pass"]
    lines = [
        "def microbatch_done():  # judge the microbatch that ended, forget it",
        *(f"    {line}" for line in judge),
        "",
        "",
        "def observed(model):  # the composition, then the observation points",
        "    model = compose(model)",
        f"    UNIT.update({{path: model.get_submodule(path) for path in {units!r}}})  # the fully_shard units",
        *(f"    {line}" for line in knob_lines),
        *(f"    {line}" for line in piece.install),
        "    model.register_forward_pre_hook(lambda *_: None if in_backward() else microbatch_done(), prepend=True)",
        "    return model",
    ]
    return ["UNIT = {}  # path -> fully_shard unit, once composed", "\n".join(lines)]


def definitions(piece: Piece) -> list[str]:
    """The piece's definitions, the recording comm's call line filled in."""
    return [_fill(text, "@CALLED@", piece.called) if "@CALLED@" in text else text for text in piece.definitions]
