"""The known-bug registry: every torch bug the suite has found, in one place.

One :class:`KnownBug` record per bug: its id, the upstream issue or pull request (or
"none found" after a search), the corpus entries that stand for it, the odds at which
strategies keep drawing it, and whether it ends the ranks (an exception, crash or hang) or
leaves them alive (a wrong value). The conditions under which a case meets a bug are the
functions below, over the model's data; no other module writes a bug's condition. Strategies
ask them to keep known bugs rare, judges to name a mismatch by the degenerate setup it comes
from (``:shard1``, ``:unfrozen-unresharded``), health runs to skip cases that would end their
ranks, and corpus entries name their record by ``"bug"``. In the spirit of Hypothesis's
``internal/compat.py``: quirks live in one place, callers ask by name.

A bug fixed upstream leaves its record and its corpus entries here until the oldest torch the
suite supports has the fix; the entries' tests then fail (strict xfail), which is the signal
to retire them.

Imports only the standard library, the model and the verdict types.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fuzz.model import (
    DEFAULT_FQN_MODIFIERS,
    PARAM_LEAVES,
    AccumSync,
    Api,
    Block,
    Body,
    Case,
    Compile,
    Composition,
    ContextFn,
    DcpBody,
    DcpItem,
    Dtype,
    Layout,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Overwrite,
    StateDictBody,
    Training,
    Wrapper,
    contains,
    fsdp1_gathers,
    has_leaf,
    has_params,
    is_fsdp1,
    owns_params,
    tensor_kind,
    trained_then_frozen,
)
from fuzz.verdict import Stall

#: One draw in this many takes a branch that meets a known bug: known bugs stay reachable, so a
#: campaign notices when torch fixes one, but rare: each hit costs a respawn of the pool.
KNOWN_BUG_ODDS = 16
#: The same for a known deadlock, which costs a whole case deadline (60 s by default) per hit:
#: at 1 in 16 the set_state_dict deadlock took 360 of the state_dict property's 396 s in a
#: 10-minute campaign.
KNOWN_HANG_ODDS = 64
#: What ``KnownBug.upstream`` says after a search of PyTorch's issues and pull requests with
#: several phrasings (the error text, the API names, the symptom) found nothing.
NONE_FOUND = "none found"


@dataclass(frozen=True)
class Patch:
    """A change to the source of one torch module (``old``, which must occur in it once, becomes
    ``new``), applied as the module is imported, in every process started with the patch
    harness (tests/faults/harness, :func:`fuzz.bench.patch_env`); nothing installed changes."""

    module: str
    old: str
    new: str


#: One file per known bug whose fix is written: ``{"why": ..., "changes": [{"module", "old",
#: "new"}, ...]}``, each ``old`` text once in its module of the torch the bug is present in;
#: ``"written_for": "2.13"`` where the text is that release's only (another release's source
#: differs there, so the fix does not apply to it: :func:`fix_written_for`). A bug with the
#: same root cause as another's written fix says so instead of repeating it: ``{"why": ...,
#: "same_as": "<bug id>"}`` takes that file's changes.
FIXES = Path(__file__).resolve().parent / "fixes"


@cache
def _fix_file(bug_id: str) -> dict[str, Any]:
    """``FIXES/<bug_id>.json`` as read once (with the changes of the bug it is the ``same_as``);
    {} where there is no such file."""
    path = FIXES / f"{bug_id}.json"
    data = dict(json.loads(path.read_text())) if path.is_file() else {}
    if "same_as" in data:
        same = _fix_file(data["same_as"])
        data.update({k: v for k, v in same.items() if k in ("changes", "written_for")})
    return data


@cache
def fix_of(bug_id: str) -> tuple[Patch, ...]:
    """The changes of ``FIXES/<bug_id>.json``, () where there is no such file."""
    return tuple(Patch(c["module"], c["old"], c["new"]) for c in _fix_file(bug_id).get("changes", ()))


def fix_written_for(bug_id: str) -> str:
    """The torch release whose source the fix of ``bug_id`` is written against, where it is one
    release's only ("2.13"); "" for a fix written for every release the bug is in."""
    return str(_fix_file(bug_id).get("written_for", ""))


@dataclass(frozen=True)
class KnownBug:
    """One torch bug. ``upstream`` is ``owner/repo#N`` (an issue or a pull request) or
    :data:`NONE_FOUND`; ``relation`` says how it relates (``same bug``, ``same symptom``,
    ``related``) and ``state`` what is known of its fix. ``tag`` is the suffix the judges add
    to a mismatch's API family when a case meets the bug's conditions (empty for bugs that
    raise, crash or hang, which their exception and frame name)."""

    id: str
    title: str
    #: What the bug shows as: "mismatch" (wrong values, ranks alive), "exception", "crash",
    #: "hang". A mismatch met in a case that meets the bug's condition is this bug whatever
    #: property, layout or check it shows through (:func:`explains`).
    symptoms: frozenset[str] = frozenset({"exception"})
    upstream: str = NONE_FOUND
    relation: str = ""
    state: str = ""
    ends_ranks: bool = True
    odds: int = KNOWN_BUG_ODDS
    tag: str = ""
    #: Other upstream issues and pull requests worth reading beside ``upstream``.
    see_also: tuple[str, ...] = ()
    #: Where the torch-only reproducer is.
    docs: str = "docs/known_bugs.md"
    #: The first torch release (``major.minor``) without the bug; empty while the newest torch
    #: the suite runs has it. See :func:`present`.
    fixed_in: str = ""
    #: The first torch release (``major.minor``) the bug is in, where an older torch the suite
    #: runs lacks it (its case passes there); empty if every torch the suite runs has it.
    introduced_in: str = ""
    #: An exception matches this bug's entries only in cases that meet its condition
    #: (:func:`meets`): for bugs whose exception type and innermost frame other bugs share
    #: (selective checkpointing's replay raises the same error for any mismatch it sees).
    conditional: bool = False
    #: The bug changes only what a training step computes (a gradient, a forward value), the
    #: same way in every run of one composition. In the state-dict and DCP properties it then
    #: accounts for a mismatch only between trainings of two compositions (resuming into
    #: another layout, :data:`RESUME_CHECKS`), never for a round trip's values or a resume into
    #: the same composition, which meet it alike on both sides (:func:`explains`).
    training_only: bool = False
    #: The bug's failure races (a collective racing a hook, say): a case that meets it fails in
    #: some runs only, and a cut of its reproducer may make that rarer without ending it, so a
    #: reduction keeps a candidate only if it reproduces several times in a row
    #: (:data:`fuzz.repro.reduce.RACE_VOTES`).
    races: bool = False

    @property
    def fix(self) -> tuple[Patch, ...]:
        """The bug's fix as changes to torch's source (:class:`Patch`, one or more), where one
        is written (``fuzz/fixes/<id>.json``): a build without the bug, on which a reduced
        script must pass (docs/repro.md); () where none is."""
        return fix_of(self.id)

    @property
    def url(self) -> str | None:
        """A link to the upstream issue or pull request, or None."""
        owner_repo, sep, number = self.upstream.partition("#")
        if not sep or "/" not in owner_repo or not number.split()[0].isdigit():
            return None
        return f"https://github.com/{owner_repo}/issues/{number.split()[0]}"


#: The records, by the names callers use. Corpus entries name them by ``id``.
FSDP1_HSDP_SHARD1 = KnownBug(
    "fsdp1-hybrid-shard-dim-1",
    "FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#154888",
    relation="same bug",
    ends_ranks=False,
    tag=":shard1",
)
FOREACH_MIXED = KnownBug(
    "foreach-mixed-dtensor-tensor",
    "foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise",
    upstream="pytorch/pytorch#183207",
    relation="same symptom (reached there through ignored_params)",
)
INT_RESHARD_DIM1 = KnownBug(
    "fully_shard-int-reshard-shard-dim-1",
    "fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out",
    relation="none found after five phrasings (the error text and frame, the two options, the symptom); "
    "see_also: the pull requests that added shard_placement_fn and the int reshard_after_forward",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#137496", "pytorch/pytorch#118017"),
)
FROZEN_INT_RESHARD = KnownBug(
    "fully_shard-frozen-int-reshard",
    "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its "
    "post-forward state",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings (frozen unit, replicate root, int reshard, post-backward "
    "callback), eight more, and two of the mechanism (the post-forward DTensor's values under uneven "
    "sharding, to_sharded_post_forward's slice of the padded all-gather output); see_also: FSDP1's resharding "
    "of frozen parameters, the FSDP-based replicate, "
    "and parameters left post-forward after backward under set_unshard_in_backward(False)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#101982", "pytorch/pytorch#158207", "pytorch/pytorch#144800"),
    ends_ranks=False,
    tag=":frozen-int-reshard",
)
UNFROZEN_UNRESHARDED = KnownBug(
    "fully_shard-unfrozen-unresharded",
    "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf "
    "unfrozen later never trains (KeyError in get_optimizer_state_dict)",
    symptoms=frozenset({"mismatch", "exception"}),
    relation="none found after four phrasings (the KeyError, unfreezing, reshard_after_forward=False, the "
    "final callback), and seven more; see_also: frozen parameters' optimizer state dropped by DCP (another "
    "mechanism), and an optimizer holding other parameter objects than the module (another trigger)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#192202", "pytorch/pytorch#149029", "pytorch/pytorch#149205"),
    ends_ranks=False,
    tag=":unfrozen-unresharded",
)
UNUSED_NO_ALL_REDUCE = KnownBug(
    "fully_shard-unused-no-all-reduce",
    "HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient",
    symptoms=frozenset({"mismatch", "exception"}),
    relation="none found after five phrasings; related: the option's pull request and the gradient "
    "accumulation finalization work on the same deferred-reduction path (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#126166", "pytorch/pytorch#196640", "pytorch/pytorch#197620"),
    ends_ranks=False,
    tag=":unused-no-all-reduce",
    # its exception form (a changing set of used parameters: foreach_reduce adds reduce-scatter
    # outputs of two sizes) has foreach_reduce's RuntimeError, which other bugs raise too
    conditional=True,
)
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug(
    "fsdp1-no-shard-unfrozen-in-frozen-unit",
    "FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#85831",
    relation="related",
    see_also=("pytorch/pytorch#104148", "pytorch/pytorch#105371"),
    ends_ranks=False,
    tag=":unfrozen-frozen-unit",
)
MP_UNIFORM_GRAD_DTYPE = KnownBug(
    "fully_shard-reduce-dtype-no-sync-uniform-grad-dtype",
    "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused "
    "on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'",
    upstream="pytorch/pytorch#196996",
    relation="same bug",
    state="open; an earlier fix (pull request #160279) is not in torch 2.13",
    see_also=("pytorch/pytorch#160279", "pytorch/pytorch#190627"),
)
MP_NEVER_RUN_NO_SYNC = KnownBug(
    "fully_shard-reduce-dtype-no-sync-never-run",
    "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran "
    "forward has no '_unsharded_param' in the root's post-backward",
    upstream="pytorch/pytorch#194058",
    relation="same bug (pull request)",
    state="closed; the fix is not in torch 2.13",
)
MP_FROZEN_AT_LAZY_INIT = KnownBug(
    "fully_shard-mp-frozen-at-lazy-init",
    "MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its "
    "low-precision gradient is never cast back",
    upstream="pytorch/pytorch#186998",
    relation="same bug",
    state="closed, yet still present in torch 2.13.0 (fix pull request #187376 not in 2.13)",
    see_also=("pytorch/pytorch#187376",),
    # Not conditional: its condition (unfrozen_in_frozen_mp_unit) is narrower than the bug (the
    # main campaign met its exact message in a case outside it). foreach_reduce's RuntimeError of
    # fully_shard-unused-no-all-reduce, conditional, is charged there first where a case meets it.
)
BROADCAST_EMPTY = KnownBug(
    "set_state_dict-broadcast-empty",
    "set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict",
    symptoms=frozenset({"hang", "crash", "exception"}),
    upstream="pytorch/pytorch#157781",
    relation="same symptom",
    state="open",
    see_also=("pytorch/pytorch#158836",),
    odds=KNOWN_HANG_ODDS,
    docs="docs/state_dict.md",
)
STATELESS_FULL = KnownBug(
    "set_optimizer_state_dict-full-stateless",
    "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'",
    upstream="pytorch/pytorch#133415",
    relation="same symptom: a stateless optimizer through the distributed state dict, closed by the pull "
    "request in see_also, yet the full_state_dict path still raises in torch 2.13.0",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#135535", "pytorch/pytorch#192225"),
    docs="docs/state_dict.md",
)
FLAT_FULL_OPTIM = KnownBug(
    "set_optimizer_state_dict-flat-full-keyerror",
    "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises "
    "KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local "
    "state dict with the flatten option still on, so the loaded and the local dicts have different keys",
    relation="none found after four phrasings; two other flatten bugs are in see_also",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#192224", "pytorch/pytorch#192225"),
    docs="docs/state_dict.md",
)
FSDP1_FULL_OFFLOAD = KnownBug(
    "fsdp1-full-state-dict-offload-to-cpu",
    "FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), "
    "optim_state_dict aliases the gathered states",
    symptoms=frozenset({"crash", "mismatch"}),
    upstream="pytorch/pytorch#188989",
    relation="same root cause for the model state dict (to_cpu frees a CPU buffer); none found for the "
    "optimizer's aliasing",
    state="closed; its fix (pull request #188990) is not in torch 2.13",
    see_also=("pytorch/pytorch#188990", "Lightning-AI/pytorch-lightning#21804"),
    docs="docs/state_dict.md",
)
FSDP1_FROZEN_UNIT = KnownBug(
    "fsdp1-no-shard-frozen-unit-state-dict",
    "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises "
    "'FSDP assumes ... is in the state_dict'",
    upstream="pytorch/pytorch#85831",
    relation="related",
    docs="docs/state_dict.md",
)
FSDP1_DCP_STATELESS = KnownBug(
    "fsdp1-dcp-stateless-optimizer",
    "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the "
    "dict without 'state'",
    relation="none found after four phrasings (the KeyError, optim_state_dict_to_load, stateless SGD, the "
    "function); see_also: FSDP1 leaving empty state out of its flattened optimizer state dict",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#88353",),
    docs="docs/state_dict.md",
)
FSDP1_DCP_EMPTY_SHARD = KnownBug(
    "dcp-load-empty-sharded-tensor-pre-2.4-guess",
    "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner "
    "guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'",
    upstream="pytorch/pytorch#163480",
    relation="same bug (pull request: _flatten_sharded_tensors drops the empty ShardedTensor, the load "
    "planner takes its key for missing and falls back to the pre-2.4 key format); related: the same "
    "condition through another path, and the pre-2.4 fallback's pull request (see_also)",
    state="closed unmerged (a test was asked for); present in torch 2.13.0",
    see_also=("pytorch/pytorch#137327", "pytorch/pytorch#108869", "pytorch/pytorch#134158"),
    docs="docs/state_dict.md",
)
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug(
    "async_save-default-stager-sharded-tensor",
    "dcp.async_save's default stager calls data_ptr() on ShardedTensors",
    relation="none found after five phrasings; related: async_save of FSDP state with 0-d tensors, and the "
    "stager's pull request, and ShardedTensor staging added to the path FileSystemWriter takes only (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#131976", "pytorch/pytorch#155192", "pytorch/pytorch#156092"),
    docs="docs/state_dict.md",
)
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug(
    "filesystemwriter-cache-staged-pin-memory",
    "FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host "
    "without an accelerator",
    relation="none found after four phrasings (the option, pinning, CPU-only hosts, the error text)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#189991", "pytorch/pytorch#159994"),
    docs="docs/state_dict.md",
)
#: Met with an accelerator only (without one, the bug above comes first): no case condition.
CACHED_STAGING_PINNED_METADATA = KnownBug(
    "filesystemwriter-cache-staged-pinned-metadata",
    "a checkpoint staged by FileSystemWriter(cache_staged_state_dict=True) records pin_memory=True; the "
    "classic FSDP1 load_sharded_optimizer_state_dict then refuses its unpinned ShardedTensors",
    relation="none found after four phrasings (pin_memory in the metadata, the option, the load function, "
    "init_from_local_shards)",
    state="present in torch 2.13.0",
    docs="docs/state_dict.md",
)
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug(
    "fsdp1-hsdp-load_sharded_optimizer_state_dict",
    "load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in "
    "FSDP1 HYBRID_SHARD over a 2-D mesh",
    symptoms=frozenset({"mismatch"}),
    relation="none found after four phrasings; related: a review there notes that this function does not "
    "know the right rank and world size (see_also)",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#111096", "pytorch/pytorch#145978"),
    ends_ranks=False,
    tag=":fsdp1-hsdp-load_sharded_optimizer_state_dict",
)
FSDP1_HSDP_RANK0_BROADCAST = KnownBug(
    "fsdp1-hsdp-shard1-rank0-broadcast",
    "set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 "
    "broadcasts from global rank 0 in a one-rank group",
    upstream="pytorch/pytorch#155680",
    relation="same line",
    state="open; #128444 (same path) was fixed only in part by pull request #128446",
    see_also=("pytorch/pytorch#128444",),
    # get_group_rank's ValueError is what any rank taken for the wrong group's raises
    conditional=True,
)
FSDP1_COMPILE_SHARDED_GRAD = KnownBug(
    "fsdp1-compile-recompile-sharded-grad",
    "torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the wrapped module's forward "
    "while its parameters hold sharded gradients raises InternalTorchDynamoError 'attempting to assign a "
    "gradient of size ...'",
    upstream="pytorch/pytorch#111317",
    relation="same symptom (a comment there: SHARD_GRAD_OP, use_orig_params=True, float32)",
    state="open",
    see_also=("pytorch/pytorch#93288",),
)

DIVIDE_FACTOR_TWICE = KnownBug(
    "fully_shard-divide-factor-single-shard-twice",
    "set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with "
    "set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided "
    "by f twice (once where the single-rank branch copies the input, once more as the post-divide)",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings; the single-rank division came with the first pull request in "
    "see_also, and a later one reworks that branch without the post-divide; an older wrong scale with a "
    "divide factor under HSDP had another cause, fixed before this branch existed",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#167178", "pytorch/pytorch#196348", "pytorch/pytorch#195732", "pytorch/pytorch#155903"),
    ends_ranks=False,
    tag=":divide-factor-twice",
    training_only=True,
)

FROZEN_OPTIM_STATE_DROPPED = KnownBug(
    "set_optimizer_state_dict-frozen-state-dropped",
    "set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) "
    "when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts "
    "with fresh optimizer state (get_optimizer_state_dict saved it)",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#192202",
    relation="same bug",
    state="open; fix pull request #192307 open, not in torch 2.13.0",
    see_also=("pytorch/pytorch#192307",),
    ends_ranks=False,
    tag=":frozen-optimizer-state-dropped",
    docs="docs/state_dict.md",
    # a mismatch: no respawn, no deadline spent
    odds=4,
)
FUSED_OPTIM_KEYS = KnownBug(
    "dsd-fqn-modifiers-optimizer-keys",
    "a module whose state-dict hooks hide a child, declared through its fqn modifiers method "
    "(StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that child's parameters by "
    "named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks them up by the model state "
    "dict's ('0.weight'), so a get/set round trip of the optimizer fails: strict raises RuntimeError "
    "'Missing optimizer state for parameter', non-strict drops that state, flattened raises KeyError "
    "'param_groups.<fqn>.lr'. Any model, sharded or not",
    symptoms=frozenset({"exception", "mismatch"}),
    relation="none found after five phrasings (the RuntimeError's text, dsd_fqn_modifiers / _fqn_modifiers "
    "with the optimizer, a state-dict hook renaming keys, the round trip of get/set_optimizer_state_dict, "
    "FusionEmbedding); see_also: the pull request that added the modifiers to the model state dict only",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    ends_ranks=False,
    tag=":fused-optimizer-keys",
    docs="docs/state_dict.md",
    # what a load with the keys missing leads to shows up in the optimizer's own code too
    conditional=True,
)
FUSED_CUSTOM_NAME = KnownBug(
    "dsd-fqn-modifiers-name-ignored-on-get",
    "get_model_state_dict / get_state_dict ignore StateDictOptions(dsd_fqn_modifiers=...): they map the "
    "model's state-dict keys to FQNs through a method of the default name (_fqn_modifiers), so for a module "
    "whose state-dict hooks hide a child and whose method has the name the option gives, _get_fqns raises "
    "AttributeError ('<module> object has no attribute <key atom>'). Only set_model_state_dict reads the "
    "option. Any model, sharded or not",
    relation="none found after four phrasings (dsd_fqn_modifiers with get_model_state_dict, the "
    "AttributeError in _get_fqns, a custom fqn modifiers name, the option ignored); see_also: the pull "
    "request that added the option",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    docs="docs/state_dict.md",
    # nn.Module.__getattr__'s AttributeError is any missing attribute's
    conditional=True,
)
FUSED_IGNORE_FROZEN = KnownBug(
    "dsd-fqn-modifiers-ignore-frozen-keyerror",
    "get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen parameter of a module "
    "whose state-dict hooks hide a child (declared through its fqn modifiers method): it pops the "
    "parameter's named_parameters name ('0.fused.weight'), which the state dict, keyed '0.weight', lacks",
    relation="none found after four phrasings (the KeyError in _get_model_state_dict, ignore_frozen_params "
    "with a state-dict hook, with fqn modifiers, frozen parameters of a wrapped module); see_also: the pull "
    "request that added the modifiers",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#146557",),
    docs="docs/state_dict.md",
    conditional=True,
)
PLAN_CACHE_FAILED_SAVE = KnownBug(
    "dcp-plan-cache-after-failed-save",
    "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) "
    "refusing an existing checkpoint) leaves its plans cached; the next save with that planner class "
    "raises TypeError 'NoneType' object is not iterable in _create_global_plan",
    upstream="pytorch/pytorch#176289",
    relation="same bug (pull request: save plan caching during validation failures)",
    state="fixed in torch 2.13 (plans are cached only after a successful save); present in torch 2.11",
    fixed_in="2.13",
    docs="docs/state_dict.md",
)
CHECKPOINT_DEBUG = KnownBug(
    "checkpoint-debug-always-refused",
    "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with "
    "non-default context_fn' on the first forward whatever the caller passes: it always hands "
    "torch.utils.checkpoint a context_fn of its own",
    upstream="pytorch/pytorch#185285",
    relation="same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier "
    "attempt in see_also)",
    state="not in torch 2.13.0",
    see_also=("pytorch/pytorch#175338",),
    conditional=True,
)
SAC_OVER_FSDP_UNIT = KnownBug(
    "selective-checkpoint-over-fully_shard-unit",
    "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region "
    "holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded "
    "by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's "
    "record_function markers and raises 'profiler._record_function_enter_new.default invocation index "
    "N encountered during backward but not found in storage'",
    upstream="pytorch/pytorch#196862",
    relation="same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)",
    state="the fix pull request is not in torch 2.13.0; torch 2.11 passes its case (device run, CPU)",
    see_also=("pytorch/pytorch#185178", "pytorch/torchtitan#3427"),
    conditional=True,
    introduced_in="2.13",
)
DELAY_ALL_REDUCE_ROOT = KnownBug(
    "ddp-delay-all-reduce-root-params-reduced-twice",
    "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed "
    "parameter of the root module itself stays in the reducer too (the reducer leaves out "
    "f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced "
    "twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is "
    "one (an nn.ParameterList's)",
    symptoms=frozenset({"mismatch"}),
    relation="none found after five phrasings; the option came with the pull request in see_also",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#95669",),
    ends_ranks=False,
    tag=":delay-all-reduce",
    races=True,
    # most cases that meet it pass, so it costs little to draw
    odds=4,
)
DELAY_BUFFER_FLOAT32 = KnownBug(
    "ddp-delay-all-reduce-float32-buffer",
    "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters "
    "that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and "
    "_clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with "
    "grad_dtype 'Double''",
    relation="none found after three phrasings (the error text, the buffer, the option); the option came "
    "with the pull request in see_also",
    state="present in torch 2.13.0",
    see_also=("pytorch/pytorch#95669",),
)
STAGER_REUSED_AFTER_CLOSE = KnownBug(
    "default-stager-reused-after-close",
    "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes "
    "its StateDictStager after every stage, which empties its copy dispatch table, and the next stage "
    "raises KeyError: <class 'type'> in deepcopy_with_tensor_offload",
    upstream="pytorch/pytorch#183413",
    relation="same bug (a regression of the pull request in see_also, which added the close)",
    state="present in torch 2.11; torch 2.13.0 stages again after a close",
    see_also=("pytorch/pytorch#170431", "pytorch/torchtitan#3476"),
    fixed_in="2.13",
    docs="docs/state_dict.md",
)
COMPILED_UNFREEZE_PLAIN = KnownBug(
    "compile-unfrozen-plain-param-no-recompile",
    "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was "
    "compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the "
    "parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)",
    symptoms=frozenset({"mismatch"}),
    upstream="pytorch/pytorch#139476",
    relation="same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)",
    state="present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there); pull "
    "request #177158 checks requires_grad on the guards' dict-tag fast path",
    fixed_in="2.13",
    ends_ranks=False,
    tag=":compiled-unfreeze",
)
DTENSOR_CONV_PARTIAL = KnownBug(
    "dtensor-conv-partial-input-backward",
    "DTensor convolution runs the local op on its inputs as they are, not redistributed to the placements its "
    "sharding propagation chose (convolution_handler ignores needs_redistribute): a Partial input (a "
    "rowwise-parallel output) gives a local partial result labelled Replicate (wrong values, no error) and "
    "backward raises 'Can not redistribute from R to P(sum)'; a [Shard(0), Partial] input raises ValueError "
    "'Tensor dim 0 is already sharded on mesh dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a "
    "channel-sharded input (Shard(1)) raises the local conv's RuntimeError 'expected input[...] to have 2 "
    "channels, but got 1'",
    symptoms=frozenset({"exception", "mismatch"}),
    tag=":conv-partial",
    relation="none found after seven phrasings (the error texts with convolution_backward and with convolution, "
    "DTensor conv1d with a partial input, the handler's redistribute, the convolution's single-dimension "
    "strategy, convolution_handler's dim_map, a channel-sharded conv1d input); related (see_also): the same "
    "handler's wrong grad_input placement for a spatially sharded input and its fix, whose strategies filter "
    "out layouts the handler's dim_map cannot represent; an open pull request whose description names the "
    "handler running on still-sharded local tensors, for depthwise convolutions; a grad_input of None",
    state="present in torch 2.13.0",
    see_also=(
        "pytorch/pytorch#191926",
        "pytorch/pytorch#192147",
        "pytorch/pytorch#186129",
        "pytorch/pytorch#142278",
    ),
    # the frames are DTensor.redistribute's, DTensorSpec.dim_map's and OpOverload.__call__'s, which
    # any misuse of redistribute, any op given a dimension sharded twice and any op's own error
    # raise in
    conditional=True,
)
DTENSOR_MSE_LOSS = KnownBug(
    "dtensor-mse-loss-backward-local-count",
    "F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the global mean, but "
    "aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its decomposition at the "
    "global shape and runs the op on each rank's shard, which divides by the shard's element count: "
    "every gradient is the true one times the number of shards of the batch",
    symptoms=frozenset({"mismatch"}),
    relation="none found after ten phrasings (DTensor mse_loss backward gradient, mse_loss_backward sharding "
    "strategy, a DTensor loss's gradient multiplied by the world size over a sharded batch, decomposition "
    "sharding propagation and numel of a local shard, among them); related, not the same: nll_loss with "
    "weights over a sharded batch (a wrong forward value), DTensor.mean with uneven shards, loss parallel "
    "refusing 'mean' on N-D meshes; the decomposition-based propagation came with the last pull request",
    state="present in torch 2.13.0 and 2.11.0 (its torch-only reproducer in docs/known_bugs.md, on CPU)",
    see_also=("pytorch/pytorch#185167", "pytorch/pytorch#162692", "pytorch/pytorch#180936", "pytorch/pytorch#171652"),
    ends_ranks=False,
    tag=":mse-loss",
    training_only=True,
)
BUGS: dict[str, KnownBug] = {
    b.id: b
    for b in (
        FSDP1_HSDP_SHARD1,
        FOREACH_MIXED,
        INT_RESHARD_DIM1,
        FROZEN_INT_RESHARD,
        UNFROZEN_UNRESHARDED,
        UNUSED_NO_ALL_REDUCE,
        FSDP1_UNFROZEN_FROZEN_UNIT,
        MP_UNIFORM_GRAD_DTYPE,
        MP_NEVER_RUN_NO_SYNC,
        MP_FROZEN_AT_LAZY_INIT,
        BROADCAST_EMPTY,
        STATELESS_FULL,
        FSDP1_FULL_OFFLOAD,
        FSDP1_FROZEN_UNIT,
        FSDP1_DCP_STATELESS,
        FSDP1_DCP_EMPTY_SHARD,
        FSDP1_ASYNC_DEFAULT_STAGER,
        CACHED_STAGING_NEEDS_ACCELERATOR,
        CACHED_STAGING_PINNED_METADATA,
        FSDP1_HSDP_OPTIMIZER_LOAD,
        FSDP1_HSDP_RANK0_BROADCAST,
        FSDP1_COMPILE_SHARDED_GRAD,
        DIVIDE_FACTOR_TWICE,
        FLAT_FULL_OPTIM,
        FROZEN_OPTIM_STATE_DROPPED,
        FUSED_OPTIM_KEYS,
        FUSED_CUSTOM_NAME,
        FUSED_IGNORE_FROZEN,
        PLAN_CACHE_FAILED_SAVE,
        CHECKPOINT_DEBUG,
        SAC_OVER_FSDP_UNIT,
        DELAY_ALL_REDUCE_ROOT,
        COMPILED_UNFREEZE_PLAIN,
        DELAY_BUFFER_FLOAT32,
        STAGER_REUSED_AFTER_CLOSE,
        DTENSOR_CONV_PARTIAL,
        DTENSOR_MSE_LOSS,
    )
}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.11.0+cu130", "2.13.0a0+git...")."""
    major, minor = [*version.split("+")[0].split("."), "0"][:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def present(bug: KnownBug, torch_version: str) -> bool:
    """Whether ``bug`` is in the torch of version ``torch_version`` (per ``introduced_in`` and
    ``fixed_in``): where it is not, its corpus entry cannot fail and the strategies need not
    keep it rare."""
    here = release(torch_version)
    if bug.introduced_in and here < release(bug.introduced_in):
        return False
    return not bug.fixed_in or here < release(bug.fixed_in)


#: The environment variable that names the known bugs whose fixes the ranks run under
#: (comma-separated ids; ``python -m fuzz explore --fix BUG`` sets it for the campaign and its
#: ranks, beside the patch harness that applies the fixes, :func:`fuzz.patching.fix_env`).
FIXED_ENV = "SHARDFUZZ_FIXED"


def fixed() -> frozenset[str]:
    """The ids of the known bugs whose fixes this campaign's ranks run under (:data:`FIXED_ENV`).
    Such a bug is absent: no case meets its condition, no mismatch carries its tag, its corpus
    entries take no failure (:func:`fuzz.corpus.CorpusIndex`), and the strategies draw its path
    as often as any other (``strategies/_odds.py``), so that the path is soaked, not kept rare."""
    return frozenset(filter(None, os.environ.get(FIXED_ENV, "").split(",")))


def get(bug_id: str) -> KnownBug:
    """The record of ``bug_id``; KeyError names the ids there are."""
    try:
        return BUGS[bug_id]
    except KeyError:
        raise KeyError(f"no known bug {bug_id!r}; known: {sorted(BUGS)}") from None


# --------------------------------------------------------------------------- conditions: training


def int_reshard_dim1(comp: Composition) -> bool:
    """:data:`INT_RESHARD_DIM1`: a fully_shard unit with an int reshard_after_forward whose
    parameters are placed Shard(1)."""
    return any(not isinstance(s.reshard_after_forward, bool) and s.shard_dim for s in comp.shards)


def foreach_over_mixed(training: Training, comps: tuple[Composition, ...]) -> bool:
    """:data:`FOREACH_MIXED` where the foreach kernels may run: ``foreach`` True, or None (foreach
    on CUDA, a loop on CPU) over fully_shard (DTensor) and replicate (plain) parameters together."""
    return training.foreach is not False and any(c.shards and c.replicates for c in comps)


def shard1(comp: Composition) -> bool:
    """A (replicate, shard) mesh whose shard dimension has size 1: a degenerate setup that takes
    its own code paths (FSDP1 falls back to NO_SHARD there: :data:`FSDP1_HSDP_SHARD1`)."""
    return bool(comp.mesh) and comp.mesh[1] == 1


def fsdp1_shard1(comp: Composition) -> bool:
    """:data:`FSDP1_HSDP_SHARD1`: FSDP1 HYBRID_SHARD whose shard dimension has size 1 (and more
    than one replica): it falls back to NO_SHARD and never averages gradients across the
    replicas."""
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[1] == 1 and comp.mesh[0] > 1


def frozen_int_reshard_unit(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`FROZEN_INT_RESHARD`: a fully_shard unit with an int reshard_after_forward manages
    only frozen parameters (modules inside a nested unit or a replicate are not its own)."""
    layout = Layout(tree, comp)
    return any(
        u.api == "fully_shard"
        and not isinstance(comp.shards[u.index].reshard_after_forward, bool)
        and layout.frozen_only(u)
        for u in layout.units
    )


def unfrozen_unresharded_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`UNFROZEN_UNRESHARDED`: a leaf unfrozen later lies in a fully_shard unit whose
    reshard_after_forward is not True, inside an outermost fully_shard unit (one no other
    encloses) that holds only frozen parameters at the start. Such an outermost unit (under a
    replicate'd root) is an FSDP2 root whose output needs no gradient, so FSDP2 never queues its
    post-backward callback: its units keep their unsharded parameters registered after
    backward, and requires_grad_(True) on a sharded parameter (the one the optimizer holds)
    never reaches them."""
    unfrozen = {u.path for u in training.unfreeze}
    return any(p in unfrozen for p in unresharded_frozen(tree, comp))


def unresharded_frozen(tree: ModuleTree, comp: Composition) -> list[str]:
    """The modules whose parameters :data:`UNFROZEN_UNRESHARDED` leaves unsharded after backward:
    those of a fully_shard unit with reshard_after_forward not True inside an outermost unit
    that holds only frozen parameters. The optimizer holding one of them (frozen or unfrozen
    later) meets the bug: training never reaches it, and get_optimizer_state_dict finds no name
    for it (KeyError)."""
    layout = Layout(tree, comp)
    shards = [u for u in layout.units if u.api == "fully_shard"]
    out: list[str] = []
    for top in shards:
        if not layout.outermost(top):
            continue
        subtree = [p for p, n in layout.paths.items() if top.covers(p) and owns_params(n)]
        if not subtree or not all(_frozen_leaf(layout.paths[p]) for p in subtree):
            continue
        for unit in shards:
            if comp.reshard_after_forward(comp.shards[unit.index]) is True:
                continue
            for member in unit.members:
                if top.covers(member):
                    out += layout.owned_by(unit, member)
    return out


def unused_no_all_reduce(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`UNUSED_NO_ALL_REDUCE`: under fully_shard with set_requires_all_reduce(False), a
    module holding parameters is left out of some but not all microbatches of a step."""
    return (
        bool(comp.shards)
        and training.accum_sync is AccumSync.NO_ALL_REDUCE
        and training.unused_on_some_microbatches(tree)
    )


def fsdp1_unfrozen_in_frozen_unit(tree: ModuleTree, comp: Composition, training: Training, world_size: int = 2) -> bool:
    """:data:`FSDP1_UNFROZEN_FROZEN_UNIT`: a leaf unfrozen later belongs to an FSDP1 unit that
    does not shard (NO_SHARD, or a strategy FSDP1 turns into NO_SHARD: HYBRID_SHARD with a
    shard group of one, FULL_SHARD / SHARD_GRAD_OP on one rank) whose parameters are all
    frozen at wrapping (auto-wrapping makes every block a unit of its own). After the first
    backward such a unit leaves its parameters registered as plain tensor views, so
    requires_grad_(True) on the Parameter the optimizer holds never reaches what forward uses:
    the leaf is never trained. (Unfreezing the module's attribute instead fails FSDP1's
    post-backward assertion on ``_post_backward_hook_state``.)"""
    unsharded = is_fsdp1(comp) and not fsdp1_gathers(comp, world_size)
    if not unsharded or not comp.auto_wrap or not training.unfreeze:
        return False
    paths = tree.paths()
    return any(_frozen_fsdp1_unit(paths[later.path.rpartition(".")[0]]) for later in training.unfreeze)


def fsdp1_compiled_with_sharded_grads(comp: Composition, training: Training, world_size: int) -> bool:
    """:data:`FSDP1_COMPILE_SHARDED_GRAD`: a compiled model under FSDP1 whose parameters are
    sharded runs a forward while they hold gradients (a later microbatch of an accumulated
    step, or a later step after zero_grad(set_to_none=False)). A recompilation of the wrapped
    module's forward then (the training programs remove a hook after the first forward, which
    recompiles it; a smaller batch does the same) fakeifies the unsharded parameter views with
    the sharded gradient of their flat parameter and fails inside Dynamo."""
    if training.compile is Compile.NONE or not fsdp1_gathers(comp, world_size):
        return False
    return training.grad_accum > 1 or (not training.set_to_none and training.steps > 1)


#: Reduce dtypes FSDP2 treats as overflow risks (pre- and post-divides instead of one division).
_OVERFLOW_RISK_DTYPES = (Dtype.FLOAT16, Dtype.FLOAT64)


def spmd_tp_conv(tree: ModuleTree, comp: Composition) -> bool:
    """:data:`DTENSOR_CONV_PARTIAL`: an SPMD program with tensor parallelism over a tree with a
    conv1d leaf, which may take a rowwise pair's Partial output (or an activation of it) as input."""
    return comp.spmd and bool(comp.tp) and has_leaf(tree.root, LeafKind.CONV1D)


def spmd_mse_loss(comp: Composition) -> bool:
    """:data:`DTENSOR_MSE_LOSS`: an SPMD program whose loss is F.mse_loss of the DTensors."""
    return comp.spmd and comp.spmd_mse_loss


def divide_factor_twice(comp: Composition, training: Training, world_size: int) -> bool:
    """:data:`DIVIDE_FACTOR_TWICE`: a gradient divide factor other than 1 on units whose shard
    group has a single rank (an HSDP mesh of shard size 1, or one data-parallel rank), where
    FSDP2's divide factors are not None: force-sum reductions, or a reduce dtype (the
    policy's reduce_dtype, else its param_dtype, else the parameters') of float16 / float64."""
    factor = comp.knobs.gradient_divide_factor
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    if factor is None or factor == 1.0 or shard_size != 1 or not comp.shards:
        return False
    if comp.knobs.force_sum_reduction:
        return True
    for spec in comp.shards:
        mp = spec.mixed_precision
        reduce = (mp.reduce_dtype or mp.param_dtype) if mp is not None else None
        if (reduce or training.dtype) in _OVERFLOW_RISK_DTYPES:
            return True
    return False


def never_run_under_no_sync(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`MP_NEVER_RUN_NO_SYNC` and :data:`MP_UNIFORM_GRAD_DTYPE`: a module holding
    parameters is left out of the first forward while gradients accumulate without sync under a
    MixedPrecisionPolicy with a reduce_dtype: FSDP2's post-backward then reads the unsharded
    parameter of a unit that never ran (``AttributeError ... to_accumulated_grad_if_needed``),
    or, where the unit ran without that parameter, gets gradients of two dtypes on the syncing
    microbatch (``AssertionError ... expects uniform gradient dtype``)."""
    paths = tree.paths()
    return (
        training.accum_sync is AccumSync.NO_GRAD_SYNC
        and any(s.mixed_precision is not None and s.mixed_precision.reduce_dtype is not None for s in comp.shards)
        and any(has_params(paths[p]) for p in training.skipped_at(0, 0))
    )


def unfrozen_in_frozen_mp_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """:data:`MP_FROZEN_AT_LAZY_INIT`: a leaf unfrozen later belongs to a fully_shard unit with a
    param_dtype whose own parameters are all frozen at the start: FSDP2 takes a unit's original
    and reduce dtypes from its trainable parameters at lazy init (FSDPParamGroup._init_mp_dtypes),
    so it never casts such a unit's low-precision gradient back ("attempting to assign a
    gradient with dtype BFloat16 to a tensor with grad_dtype Float")."""
    layout = Layout(tree, comp)
    unfrozen = {u.path for u in training.unfreeze}
    for unit in layout.units:
        if unit.api != "fully_shard":
            continue
        mp = comp.shards[unit.index].mixed_precision
        if mp is None or mp.param_dtype is None:
            continue
        if layout.frozen_only(unit) and any(p in unfrozen for p in layout.owned_by(unit)):
            return True
    return False


def checkpoint_debug(comp: Composition) -> bool:
    """checkpoint(debug=True) on some checkpointed module (:data:`CHECKPOINT_DEBUG`)."""
    return bool(comp.checkpoints) and comp.checkpoint_options.debug


def selective_over_unit(comp: Composition) -> bool:
    """A selective checkpoint over a region that may hold an FSDP unit (:data:`SAC_OVER_FSDP_UNIT`:
    it fails where the unit's state differs between forward and recomputation): a fully_shard
    unit inside it, or FSDP1 with auto_wrap, whose units (every block) emit the same
    record_function markers (``FullyShardedDataParallel._post_forward`` in the recomputation;
    the README's main job met it so, FSDP1 SHARD_GRAD_OP under no_sync)."""
    if comp.checkpoint_options.context_fn is ContextFn.NONE or not comp.checkpoints:
        return False
    if comp.wrapper.value.startswith("fsdp1") and comp.auto_wrap:
        return True
    return any(contains(c, p) for c in comp.checkpoints for p in comp.sharded_paths)


def delayed_all_reduce(comp: Composition) -> bool:
    """replicate with delay_all_reduce_named_params (:data:`DELAY_ALL_REDUCE_ROOT`)."""
    return bool(comp.replicates) and comp.replicate_options.delay_all_reduce


def stager_reused(body: Body) -> bool:
    """An explicit DefaultStager given to more than one async_save (:data:`STAGER_REUSED_AFTER_CLOSE`)."""
    return isinstance(body, DcpBody) and body.stager is not None and body.async_saves >= 2


def delayed_not_float32(comp: Composition, training: Training) -> bool:
    """Delayed all-reduce over parameters that are not float32 (:data:`DELAY_BUFFER_FLOAT32`)."""
    return delayed_all_reduce(comp) and training.dtype is not Dtype.FLOAT32


def compiled_unfreeze_ignored(comp: Composition, training: Training) -> bool:
    """torch.compile with aot_eager over a composition whose fully_shard ignored_params include a
    module unfrozen later (:data:`COMPILED_UNFREEZE_PLAIN`)."""
    return training.compile is Compile.AOT_EAGER and any(u.path in comp.shard_ignored for u in training.unfreeze)


def mismatch_tags(
    comp: Composition, tree: ModuleTree | None = None, training: Training | None = None, world_size: int = 2
) -> str:
    """The tags a training mismatch's API family carries (``:shard1:frozen-int-reshard``): the
    degenerate setups the case meets, since known bugs live there. A corpus entry that marks a
    tagged family known then matches only cases that meet its setup, and hides no other
    mismatch (:func:`fuzz.signature.same_bug`)."""
    # ``:shard1`` names the setup (a shard dimension of size 1, any wrapper), which other bugs'
    # entries carry too (``...:shard1:divide-factor-twice``): written whatever is fixed
    tags = FSDP1_HSDP_SHARD1.tag if shard1(comp) else ""
    met: list[KnownBug] = []
    if tree is not None and frozen_int_reshard_unit(tree, comp):
        met.append(FROZEN_INT_RESHARD)
    if tree is not None and training is not None:
        if unfrozen_unresharded_unit(tree, comp, training):
            met.append(UNFROZEN_UNRESHARDED)
        if unused_no_all_reduce(tree, comp, training):
            met.append(UNUSED_NO_ALL_REDUCE)
        if fsdp1_unfrozen_in_frozen_unit(tree, comp, training, world_size):
            met.append(FSDP1_UNFROZEN_FROZEN_UNIT)
    if training is not None and divide_factor_twice(comp, training, world_size):
        met.append(DIVIDE_FACTOR_TWICE)
    if delayed_all_reduce(comp):
        met.append(DELAY_ALL_REDUCE_ROOT)
    if training is not None and compiled_unfreeze_ignored(comp, training):
        met.append(COMPILED_UNFREEZE_PLAIN)
    if tree is not None and spmd_tp_conv(tree, comp):
        met.append(DTENSOR_CONV_PARTIAL)
    if spmd_mse_loss(comp):
        met.append(DTENSOR_MSE_LOSS)
    absent = fixed()  # a bug whose fix the ranks run under is not there to tag
    return tags + "".join(bug.tag for bug in met if bug.id not in absent)


def _frozen_leaf(node: object) -> bool:
    return isinstance(node, Leaf) and node.frozen


def _frozen_fsdp1_unit(node: object) -> bool:
    """A block FSDP1's auto-wrapping makes a unit of, whose parameters are all frozen (a block
    without its own scale whose parameter leaves are all frozen)."""
    if not isinstance(node, Block) or node.scale:
        return False
    leaves = [c for c in node.children if isinstance(c, Leaf) and c.kind in PARAM_LEAVES]
    return bool(leaves) and all(c.frozen for c in leaves)


# --------------------------------------------------------------------------- conditions: state


def fsdp1_hsdp_2d(comp: Composition) -> bool:
    """:data:`FSDP1_HSDP_OPTIMIZER_LOAD`:
    FSDP1 HYBRID_SHARD over more than one replica and more than one shard. Its sharded state
    dict holds DTensors over the 2-D mesh; DCP's ``load_sharded_optimizer_state_dict`` lays the
    optimizer state out as chunks over the whole world instead, so the classic FSDP1 recipe
    loads wrong optimizer state into it (docs/known_bugs.md)."""
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[0] > 1 and comp.mesh[1] > 1


def fsdp1_shard1_full_offload_load(body: Body) -> bool:
    """:data:`FSDP1_HSDP_RANK0_BROADCAST`: a full state dict with cpu_offload or
    broadcast_from_rank0 is loaded into an FSDP1 HYBRID_SHARD model whose shard dimension has
    size 1 (for either option torch passes FSDP1's optimizer config rank0_only=True, which
    broadcasts from global rank 0 in a group of the rank alone)."""
    if isinstance(body, DcpBody):
        return body.load_full_state_dict and body.load_cpu_offload and fsdp1_shard1(body.target)
    if isinstance(body, StateDictBody):
        rank0_only = body.load.cpu_offload or body.load.broadcast_from_rank0
        return body.load.full_state_dict and rank0_only and fsdp1_shard1(body.target)
    return False


def fsdp1_full_offload(body: Body, world_size: int) -> bool:
    """:data:`FSDP1_FULL_OFFLOAD`: whether a case meets two torch bugs of FSDP1's FULL_STATE_DICT with offload_to_cpu on
    CPU, where the "offload" copies nothing: ``model.state_dict()`` clones the parameters
    from an unsharded buffer that has been freed already (SIGSEGV in the post-state-dict
    hook's param_hook, or garbage), and ``FSDP.optim_state_dict`` (offload_to_cpu is
    FullOptimStateDictConfig's default) returns every tensor state of a parameter as a view
    of one all-gather buffer, which the next state's all-gather overwrites (exp_avg comes
    back equal to exp_avg_sq). Both need parameters sharded over more than one rank (FSDP1
    gathers nothing under NO_SHARD or a shard group of one). get_*_state_dict with
    full_state_dict and cpu_offload take an FSDP1 model's state the same way (offload_to_cpu,
    with rank0_only), so split and combined meet them too, and so do DCP cases that take an
    FSDP1 side's state through the app entry or patched state dicts: the source's when saved,
    the fresh target's when dcp.load asks it for the state dict to load into."""
    if isinstance(body, DcpBody):
        if body.classic_fsdp1:
            return False
        saves = full_offload_gathers(body.save_full_state_dict, body.save_cpu_offload, body.source, world_size)
        loads = full_offload_gathers(body.load_full_state_dict, body.load_cpu_offload, body.target, world_size)
        return saves or loads
    if not isinstance(body, StateDictBody):
        return False
    return full_offload_gathers(body.save.full_state_dict, body.save.cpu_offload, body.source, world_size)


def full_offload_gathers(full: bool, cpu_offload: bool, comp: Composition, world_size: int) -> bool:
    """:func:`fsdp1_full_offload` for one side, over the parts a strategy draws one by one: a
    full state dict with cpu_offload of an FSDP1 model that shards over more than one rank."""
    return full and cpu_offload and fsdp1_gathers(comp, world_size)


def fsdp1_dcp_stateless(body: Body) -> bool:
    """:data:`FSDP1_DCP_STATELESS`:
    whether a case meets a torch bug of the classic FSDP1 recipe: an optimizer without state
    (SGD without momentum) leaves no entry for its empty "state" in the checkpoint, so
    load_sharded_optimizer_state_dict returns a dict without "state", which
    FSDP.optim_state_dict_to_load refuses (ValueError)."""
    if not isinstance(body, DcpBody) or not is_fsdp1(body.target) or not body.classic_fsdp1:
        return False
    loaded = DcpItem.OPTIMIZER in body.entries and DcpItem.OPTIMIZER not in body.skip
    return loaded and stateless_optimizer(body.training)


def fsdp1_dcp_empty_shard(body: Body, world_size: int) -> bool:
    """:data:`FSDP1_DCP_EMPTY_SHARD`:
    whether a case meets a torch bug of dcp.load with FSDP1's sharded state dict: a rank
    that holds no chunk of a parameter (FSDP1 chunks dim 0, the tree's width, into
    world_size pieces with torch.chunk, which makes fewer pieces when the width is small)
    flattens the ShardedTensor away, the planner takes the key missing on that rank for a
    sign of a checkpoint older than 2.4 and flattens the whole dict the old way, and then a
    value that the old way keys differently, a list (the scalars entry's history, an optimizer
    state dict's param_groups), is "Missing key in checkpoint state_dict". The sharded state
    dicts get_*_state_dict take of such a model (app, patched) hold the same ShardedTensors,
    its optimizer's too, and the optimizer state dict loaded with them (app, patched) holds
    param_groups."""
    if not isinstance(body, DcpBody) or tensor_kind(body.target) != "sharded_tensor" or body.load_full_state_dict:
        return False
    loaded = [e for e in body.entries if e not in body.skip]
    optimizer = DcpItem.APP in loaded or (body.patched and DcpItem.OPTIMIZER in loaded)
    if not (DcpItem.MODEL in loaded or optimizer) or not (DcpItem.SCALARS in loaded or optimizer):
        return False
    width = body.tree.width
    chunk = -(-width // world_size)
    return -(-width // chunk) < world_size


def fsdp1_async_default_stager(body: Body) -> bool:
    """:data:`FSDP1_ASYNC_DEFAULT_STAGER`: dcp.async_save without a storage writer stages with
    its DefaultStager, which deep-copies the state dict calling ``data_ptr()`` on every tensor,
    which ShardedTensor (FSDP1 FULL_SHARD / SHARD_GRAD_OP sharded state dicts) does not
    support."""
    if not isinstance(body, DcpBody):
        return False
    return default_stager_copies_sharded(body.async_save, body.storage_objects, body.source, body.save_full_state_dict)


def default_stager_copies_sharded(async_save: bool, storage_objects: bool, source: Composition, full: bool) -> bool:
    """:func:`fsdp1_async_default_stager` over the parts a strategy draws one by one."""
    return async_save and not storage_objects and not full and tensor_kind(source) == "sharded_tensor"


def stateless_optimizer(training: Training) -> bool:
    """An optimizer that keeps no tensor state (SGD without momentum): the optimizer of
    :data:`STATELESS_FULL` and :data:`FSDP1_DCP_STATELESS`."""
    return training.optimizer is Optimizer.SGD and not training.momentum


def fsdp1_frozen_unit(comp: Composition, tree: ModuleTree) -> bool:
    """:data:`FSDP1_FROZEN_UNIT`: FSDP1 NO_SHARD with auto-wrapping makes a unit whose parameters
    are all frozen (a block without its own scale whose parameter leaves are all frozen;
    auto-wrapping puts every block in a unit of its own). After a training step such a unit
    leaves its parameters registered as plain tensor views, and FSDP1's state_dict hooks then
    raise AssertionError "FSDP assumes ... is in the state_dict"."""
    if comp.wrapper is not Wrapper.FSDP1_NO_SHARD or not comp.auto_wrap:
        return False
    return any(_frozen_fsdp1_unit(n) for n in tree.paths().values())


def hsdp_optimizer_load(body: Body) -> bool:
    """:data:`FSDP1_HSDP_OPTIMIZER_LOAD`: the classic FSDP1 recipe loads the optimizer into FSDP1
    HYBRID_SHARD over a 2-D mesh."""
    return (
        isinstance(body, DcpBody)
        and fsdp1_hsdp_2d(body.target)
        and body.classic_fsdp1
        and DcpItem.OPTIMIZER in body.entries
        and DcpItem.OPTIMIZER not in body.skip
    )


def broadcast_empty(body: Body) -> bool:
    """:data:`BROADCAST_EMPTY`: set_state_dict with broadcast_from_rank0 where ranks other than 0
    pass an empty model state dict (get_state_dict with full_state_dict and cpu_offload returns
    one there): the combined API with broadcast_from_rank0, or the app Stateful loading a full,
    offloaded state dict."""
    if isinstance(body, StateDictBody):
        return broadcast_empty_combined(body.api, body.load.broadcast_from_rank0)
    if isinstance(body, DcpBody):
        loaded = tuple(e for e in body.entries if e not in body.skip)
        return broadcast_empty_app(loaded, body.load_full_state_dict, body.load_cpu_offload)
    return False


def broadcast_empty_combined(api: Api, broadcast_from_rank0: bool) -> bool:
    """:func:`broadcast_empty` of a state_dict case, over its drawn parts."""
    return api is Api.COMBINED and broadcast_from_rank0


def broadcast_empty_app(loaded: tuple[DcpItem, ...], full: bool, cpu_offload: bool) -> bool:
    """:func:`broadcast_empty` of a dcp case, over its drawn parts: the app Stateful among the
    loaded entries takes a full, offloaded state dict."""
    return DcpItem.APP in loaded and full and cpu_offload


def frozen_state_dropped(body: Body) -> bool:
    """:data:`FROZEN_OPTIM_STATE_DROPPED`: a stateful optimizer loaded through
    set_optimizer_state_dict (every path but FSDP1's own) while a parameter that trained
    before the save is frozen."""
    if not isinstance(body, (StateDictBody, DcpBody)) or stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        loaded = body.api is not Api.FSDP1
    else:
        loaded = (
            any(e in body.entries and e not in body.skip for e in (DcpItem.OPTIMIZER, DcpItem.APP))
            and not body.classic_fsdp1
        )
    return loaded and bool(trained_then_frozen(body))


def fused_in_optimizer(body: Body) -> bool:
    """:data:`FUSED_OPTIM_KEYS`: a state-dict case whose fused leaves have parameters the
    optimizer holds (trainable in the tree, or frozen ones handed to it too)."""
    if not isinstance(body, StateDictBody) or not body.fused:
        return False
    paths = body.tree.paths()
    return body.frozen_in_optimizer or any(not getattr(paths[p], "frozen", False) for p in body.fused)


def fused_custom_name(body: Body) -> bool:
    """:data:`FUSED_CUSTOM_NAME`: fused leaves whose method has another name than the default,
    with the model state taken by get_model_state_dict or get_state_dict."""
    return (
        isinstance(body, StateDictBody)
        and bool(body.fused)
        and body.fqn_modifiers != DEFAULT_FQN_MODIFIERS
        and body.api in (Api.SPLIT, Api.COMBINED)
    )


def fused_ignore_frozen(body: Body) -> bool:
    """:data:`FUSED_IGNORE_FROZEN`: get_model_state_dict(ignore_frozen_params=True) over a fused
    leaf frozen in the tree (a requires_grad schedule is not drawn with ignore_frozen_params)."""
    if not isinstance(body, StateDictBody) or not body.save.ignore_frozen_params:
        return False
    paths = body.tree.paths()
    return any(getattr(paths[p], "frozen", False) for p in body.fused)


def plan_cache_failed_save(body: Body) -> bool:
    """:data:`PLAN_CACHE_FAILED_SAVE`: a save with plan caching refused by overwrite=False (the
    case then saves again with the same planner class)."""
    return (
        isinstance(body, DcpBody)
        and body.save_planner is not None
        and body.save_planner.enable_plan_caching
        and body.overwrite is Overwrite.FALSE
    )


def stateless_full(body: Body) -> bool:
    """:data:`STATELESS_FULL`: an optimizer without tensor state (SGD without momentum) loaded
    from a full state dict through set_optimizer_state_dict (an FSDP1 target loads through
    FSDP.optim_state_dict_to_load instead, which is not this bug's path)."""
    if not isinstance(body, (StateDictBody, DcpBody)):
        return False
    if not stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        return stateless_full_path(body.load.full_state_dict, body.target) and body.api is not Api.FSDP1
    loaded = [e for e in body.entries if e not in body.skip]
    return stateless_full_path(body.load_full_state_dict, body.target) and (
        DcpItem.APP in loaded or DcpItem.OPTIMIZER in loaded
    )


def flat_full_optimizer(body: object) -> bool:
    """:data:`FLAT_FULL_OPTIM`: an in-memory optimizer load with full state dicts and
    flatten_optimizer_state_dict (through set_optimizer_state_dict or set_state_dict)."""
    return (
        isinstance(body, StateDictBody)
        and body.api is not Api.FSDP1
        and body.load.full_state_dict
        and body.load.flatten_optimizer_state_dict
    )


def stateless_full_path(full: bool, target: Composition) -> bool:
    """Whether a full optimizer state reaches the target through set_optimizer_state_dict's
    path of :data:`STATELESS_FULL` (an FSDP1 target takes FSDP.optim_state_dict_to_load)."""
    return full and not is_fsdp1(target)


def compositions(case: Case) -> list[Composition]:
    """Every composition of the case: the base and the variant of a metamorphic case, the source
    and the target of a state-dict case."""
    return [v for v in vars(case.body).values() if isinstance(v, Composition)]


def _per_comp(condition: Callable[[ModuleTree, Composition, Training], bool]) -> Callable[[Case], bool]:
    """A training condition met through any composition of a case with a tree and a training."""

    def met(case: Case) -> bool:
        tree, training = getattr(case.body, "tree", None), getattr(case.body, "training", None)
        if not isinstance(tree, ModuleTree) or not isinstance(training, Training):
            return False
        return any(condition(tree, c, training) for c in compositions(case))

    return met


def _with_training(condition: Callable[[Composition, Training, int], bool]) -> Callable[[Case], bool]:
    def met(case: Case) -> bool:
        training = getattr(case.body, "training", None)
        if not isinstance(training, Training):
            return False
        return any(condition(c, training, case.world_size) for c in compositions(case))

    return met


def _saving(condition: Callable[[Case], bool]) -> Callable[[Case], bool]:
    """A condition of state_dict and dcp bodies only."""
    return lambda case: isinstance(case.body, (StateDictBody, DcpBody)) and condition(case)


def _frozen_int_reshard(case: Case) -> bool:
    tree = getattr(case.body, "tree", None)
    return isinstance(tree, ModuleTree) and any(frozen_int_reshard_unit(tree, c) for c in compositions(case))


def _foreach_mixed(case: Case) -> bool:
    training = getattr(case.body, "training", None)
    return isinstance(training, Training) and foreach_over_mixed(training, tuple(compositions(case)))


def _unfrozen_unresharded(case: Case) -> bool:
    body = case.body
    if (
        isinstance(body, (StateDictBody, DcpBody))
        and body.frozen_in_optimizer
        and unresharded_frozen(body.tree, body.source)
    ):
        return True
    return _per_comp(unfrozen_unresharded_unit)(case)


def _fsdp1_frozen_source(case: Case) -> bool:
    body = case.body
    return isinstance(body, (StateDictBody, DcpBody)) and fsdp1_frozen_unit(body.source, body.tree)


def _fsdp1_unfrozen_frozen_unit(case: Case) -> bool:
    return _per_comp(lambda t, c, tr: fsdp1_unfrozen_in_frozen_unit(t, c, tr, case.world_size))(case)


#: Every bug whose condition a case can meet, with that condition over the whole case: the one
#: place that says which bugs a case meets (:func:`bugs_met`, :func:`known_bug`,
#: :func:`ends_ranks` and :func:`explains` all read it). The order is the order in which
#: :func:`known_bug` names the first bug a state-dict case meets: the training bugs its sides
#: meet first, then the state-dict and DCP bugs.
CONDITIONS: tuple[tuple[KnownBug, Callable[[Case], bool]], ...] = (
    (INT_RESHARD_DIM1, lambda case: any(int_reshard_dim1(c) for c in compositions(case))),
    (FSDP1_HSDP_SHARD1, lambda case: any(fsdp1_shard1(c) for c in compositions(case))),
    (FSDP1_FROZEN_UNIT, _fsdp1_frozen_source),
    (FSDP1_HSDP_RANK0_BROADCAST, _saving(lambda case: fsdp1_shard1_full_offload_load(case.body))),
    (FSDP1_FULL_OFFLOAD, _saving(lambda case: fsdp1_full_offload(case.body, case.world_size))),
    (FSDP1_DCP_STATELESS, _saving(lambda case: fsdp1_dcp_stateless(case.body))),
    (FSDP1_DCP_EMPTY_SHARD, _saving(lambda case: fsdp1_dcp_empty_shard(case.body, case.world_size))),
    (FSDP1_ASYNC_DEFAULT_STAGER, _saving(lambda case: fsdp1_async_default_stager(case.body))),
    (CACHED_STAGING_NEEDS_ACCELERATOR, lambda case: isinstance(case.body, DcpBody) and case.body.cache_staged),
    (BROADCAST_EMPTY, _saving(lambda case: broadcast_empty(case.body))),
    (STATELESS_FULL, _saving(lambda case: stateless_full(case.body))),
    (FLAT_FULL_OPTIM, _saving(lambda case: flat_full_optimizer(case.body))),
    (FUSED_CUSTOM_NAME, _saving(lambda case: fused_custom_name(case.body))),
    (FUSED_IGNORE_FROZEN, _saving(lambda case: fused_ignore_frozen(case.body))),
    (FUSED_OPTIM_KEYS, _saving(lambda case: fused_in_optimizer(case.body))),
    (PLAN_CACHE_FAILED_SAVE, _saving(lambda case: plan_cache_failed_save(case.body))),
    (FSDP1_HSDP_OPTIMIZER_LOAD, _saving(lambda case: hsdp_optimizer_load(case.body))),
    (FROZEN_OPTIM_STATE_DROPPED, _saving(lambda case: frozen_state_dropped(case.body))),
    (FROZEN_INT_RESHARD, _frozen_int_reshard),
    (UNFROZEN_UNRESHARDED, _unfrozen_unresharded),
    (UNUSED_NO_ALL_REDUCE, _per_comp(unused_no_all_reduce)),
    (MP_NEVER_RUN_NO_SYNC, _per_comp(never_run_under_no_sync)),
    (MP_UNIFORM_GRAD_DTYPE, _per_comp(never_run_under_no_sync)),
    (MP_FROZEN_AT_LAZY_INIT, _per_comp(unfrozen_in_frozen_mp_unit)),
    (FSDP1_UNFROZEN_FROZEN_UNIT, _fsdp1_unfrozen_frozen_unit),
    (FOREACH_MIXED, _foreach_mixed),
    (FSDP1_COMPILE_SHARDED_GRAD, _with_training(fsdp1_compiled_with_sharded_grads)),
    (DIVIDE_FACTOR_TWICE, _with_training(divide_factor_twice)),
    (CHECKPOINT_DEBUG, lambda case: any(checkpoint_debug(c) for c in compositions(case))),
    (SAC_OVER_FSDP_UNIT, lambda case: any(selective_over_unit(c) for c in compositions(case))),
    (DELAY_ALL_REDUCE_ROOT, lambda case: any(delayed_all_reduce(c) for c in compositions(case))),
    (COMPILED_UNFREEZE_PLAIN, _with_training(lambda c, training, _: compiled_unfreeze_ignored(c, training))),
    (DELAY_BUFFER_FLOAT32, _with_training(lambda c, training, _: delayed_not_float32(c, training))),
    (STAGER_REUSED_AFTER_CLOSE, _saving(lambda case: stager_reused(case.body))),
    (DTENSOR_CONV_PARTIAL, _per_comp(lambda tree, comp, _: spmd_tp_conv(tree, comp))),
    (DTENSOR_MSE_LOSS, _per_comp(lambda tree, comp, _: spmd_mse_loss(comp))),
)


def meets(case: Case, bug: KnownBug) -> bool:
    """Whether ``case`` meets ``bug``'s condition (False for a bug without one here)."""
    return bug.id not in fixed() and any(b is bug and condition(case) for b, condition in CONDITIONS)


def _met_in_order(case: Case) -> list[KnownBug]:
    absent = fixed()
    return [bug for bug, condition in CONDITIONS if bug.id not in absent and condition(case)]


def known_bug(case: Case) -> str | None:
    """The id of the first known bug (in :data:`CONDITIONS` order) a state_dict or dcp case
    meets, whatever its symptom; None for other properties' cases."""
    if not isinstance(case.body, (StateDictBody, DcpBody)):
        return None
    return next((bug.id for bug in _met_in_order(case)), None)


def ends_ranks(case: Case) -> str | None:
    """The id of a known bug the case would run into in a way that ends its ranks (an exception
    or a hang), if the case tells; mismatches leave the ranks alive and are not named here."""
    return next((bug.id for bug in _met_in_order(case) if bug.ends_ranks), None)


def bugs_met(case: Case) -> list[KnownBug]:
    """Every known bug whose condition the case meets, through any of its compositions, in
    registry order."""
    met = {bug.id for bug in _met_in_order(case)}
    return [b for b in BUGS.values() if b.id in met]


#: The state-dict and DCP properties' checks that compare two trainings (the uninterrupted run
#: on the source composition and the resumed one on the target's) rather than values before and
#: after a state dict or checkpoint carried them.
RESUME_LOSS, RESUME_PARAMS = "resume_loss", "resume_params"
RESUME_CHECKS = (RESUME_LOSS, RESUME_PARAMS)


def explains(case: Case, kind: str, check: str = "") -> list[KnownBug]:
    """The known bugs that account for a *mismatch* in ``case``: those whose condition the case
    meets and which show as wrong values. A bug shows through whatever the case checks (a loss,
    a parameter, an optimizer state after a load) and through any layout on the other side of
    a comparison, so a mismatch there is that bug, not a new one. Exceptions, crashes and hangs
    are matched by their own detail instead (:func:`fuzz.signature.same_bug`): an error in a
    case that merely meets a bug's condition may well be another bug. A ``training_only`` bug
    accounts for a state-dict or DCP case's mismatch only where ``check`` (the failed check,
    as its signature names it) compares trainings of two different compositions."""
    if kind != "mismatch":
        return []
    bugs = [b for b in bugs_met(case) if kind in b.symptoms]
    body = case.body
    if isinstance(body, (StateDictBody, DcpBody)) and not (check in RESUME_CHECKS and body.source != body.target):
        # a round trip, or a resume into the same composition: both sides meet it alike
        bugs = [b for b in bugs if not b.training_only]
    return bugs


# --------------------------------------------------------------------------- deadlocks in stacks

#: The signature detail of :data:`BROADCAST_EMPTY` (rank 0 broadcasts state other ranks skipped).
ALONE_IN_BROADCAST = "torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone"


def rank0_alone_in_broadcast(stacks: list[str]) -> bool:
    """Rank 0 is inside _broadcast_state_dict and some other rank is not: the ranks disagreed
    about whether to broadcast (:data:`BROADCAST_EMPTY`), a deadlock whatever it shows as."""
    inside = ["_broadcast_state_dict" in s for s in stacks]
    return bool(inside) and inside[0] and not all(inside)


#: :data:`BROADCAST_EMPTY` seen in the ranks' stack samples: rank 0 has waited alone in the
#: broadcast for 3 s, 10 s into the case. Collectives keep ranks within a second or so of each
#: other, so a healthy case does not hold that pattern; the known bug ends in about 14 s, not at
#: the deadline.
ALONE_IN_BROADCAST_STALL = Stall(
    name="rank 0 alone in _broadcast_state_dict", deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0
)
