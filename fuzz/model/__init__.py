"""The model layer: what a case is, as pure data, and the rules that keep it valid.

Everything above it (strategies, the rank side, the known-bug registry, the judges, the
driver) imports its names from here. It imports only the standard library and
:mod:`fuzz.errors`; an import-linter contract in pyproject.toml keeps it that way.

- :mod:`~fuzz.model.tree`: module trees and paths into them;
- :mod:`~fuzz.model.composition`: how a model is distributed;
- :mod:`~fuzz.model.training`: what a case trains;
- :mod:`~fuzz.model.layout`: which unit manages which module's parameters;
- :mod:`~fuzz.model.rules`: the validity rules against a tree;
- :mod:`~fuzz.model.case`: cases and the training / invalid / fault bodies;
- :mod:`~fuzz.model.state`: the state-dict and DCP bodies;
- :mod:`~fuzz.model.codec`: the JSON codec with its schema version.
"""

from fuzz.model.case import (
    MAX_WORLD_SIZE,
    Body,
    Case,
    FaultAction,
    FaultBody,
    InvalidBody,
    MetamorphicBody,
    Misuse,
    ParityBody,
)
from fuzz.model.codec import SCHEMA_VERSION, case_from_json, case_to_json, case_to_text, to_jsonable
from fuzz.model.composition import Composition, Knobs, MixedPrecision, ShardSpec, TpPair, Wrapper
from fuzz.model.layout import Layout, Unit
from fuzz.model.rules import TP_BETWEEN, check_composition, check_mesh, check_training
from fuzz.model.state import (
    Api,
    DcpBody,
    DcpItem,
    DcpMode,
    LoadPlannerOptions,
    Options,
    Overwrite,
    RequiresGrad,
    SavePlannerOptions,
    StateDictBody,
    WriterOptions,
    dcp_root,
    fsdp1_gathers,
    fsdp1_in_memory_problem,
    is_fsdp1,
    is_plain,
    schedule_problem,
    sharded_in_memory_problem,
    takes_schedule,
    tensor_kind,
    trainable_at,
    trained_then_frozen,
)
from fuzz.model.training import (
    MAX_STEPS,
    AccumSync,
    Compile,
    Optimizer,
    Skip,
    Training,
    Unfreeze,
    mixed_precision_comparable,
)
from fuzz.model.tree import (
    MAX_DEPTH,
    MAX_WIDTH,
    PARAM_LEAVES,
    Block,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    contains,
    has_params,
    is_ancestor,
    iter_paths,
    owns_params,
    tree_depth,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_STEPS",
    "MAX_WIDTH",
    "MAX_WORLD_SIZE",
    "PARAM_LEAVES",
    "SCHEMA_VERSION",
    "TP_BETWEEN",
    "AccumSync",
    "Api",
    "Block",
    "Body",
    "Case",
    "Compile",
    "Composition",
    "DcpBody",
    "DcpItem",
    "DcpMode",
    "Dtype",
    "FaultAction",
    "FaultBody",
    "InvalidBody",
    "Knobs",
    "Layout",
    "Leaf",
    "LeafKind",
    "LoadPlannerOptions",
    "MetamorphicBody",
    "Misuse",
    "MixedPrecision",
    "ModuleTree",
    "Node",
    "Optimizer",
    "Options",
    "Overwrite",
    "ParityBody",
    "RequiresGrad",
    "SavePlannerOptions",
    "ShardSpec",
    "Skip",
    "StateDictBody",
    "TpPair",
    "Training",
    "Unfreeze",
    "Unit",
    "Wrapper",
    "WriterOptions",
    "case_from_json",
    "case_to_json",
    "case_to_text",
    "check_composition",
    "check_mesh",
    "check_training",
    "contains",
    "dcp_root",
    "fsdp1_gathers",
    "fsdp1_in_memory_problem",
    "has_params",
    "is_ancestor",
    "is_fsdp1",
    "is_plain",
    "iter_paths",
    "mixed_precision_comparable",
    "owns_params",
    "schedule_problem",
    "sharded_in_memory_problem",
    "takes_schedule",
    "tensor_kind",
    "to_jsonable",
    "trainable_at",
    "trained_then_frozen",
    "tree_depth",
]
