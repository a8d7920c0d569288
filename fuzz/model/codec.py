"""The JSON codec of cases, with a schema version. Generic over the model's dataclasses and
driven by their type hints, so a new field is serialised and validated without touching this
code; every field read is validated and a bad one named by its path
(``case.body.tree.root.children[1].kind``). Imports only the standard library and the model.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import types
import typing
from typing import Any, Union

from fuzz.errors import CaseError
from fuzz.model.case import BODY_MODULES, Body, Case
from fuzz.model.tree import Block, Leaf

#: 2: trees with a sequence and a vocabulary (``ModuleTree.seq``, ``vocab``) and leaves with
#: ``kernel``, ``causal``, ``padding``, ``tied`` (and the new leaf kinds). Schema 1 JSON has none
#: of them and decodes with their defaults: the case it always was.
SCHEMA_VERSION = 2
#: Every schema this shardfuzz reads.
READABLE_SCHEMAS = (1, 2)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def to_jsonable(value: Any, *, sparse: bool = False) -> Any:
    """``value`` as JSON; with ``sparse``, dataclass fields equal to their defaults are left out
    (so a field the model adds later, with a default, leaves the encoding of older values as it
    was: :func:`fuzz.repro.store.entry_hash`)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        kind = getattr(type(value), "KIND", None)
        if kind is not None:
            out["kind"] = kind
        for f in dataclasses.fields(value):
            field_value = getattr(value, f.name)
            if sparse and field_value == _default(f):
                continue
            out[f.name] = to_jsonable(field_value, sparse=sparse)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [to_jsonable(v, sparse=sparse) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot serialise {type(value).__name__}")


def case_to_json(case: Case) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, **to_jsonable(case)}


def case_to_text(case: Case) -> str:
    return json.dumps(case_to_json(case), sort_keys=True)


def case_from_json(data: Any, path: str = "case") -> Case:
    """Rebuild a :class:`Case` from :func:`case_to_json` output, validating every field."""
    if not isinstance(data, dict):
        raise CaseError(path, f"expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema not in READABLE_SCHEMAS:
        if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
            raise CaseError(
                f"{path}.schema", f"schema {schema} is newer than this shardfuzz ({SCHEMA_VERSION}); upgrade shardfuzz"
            )
        raise CaseError(f"{path}.schema", f"unsupported schema {schema!r}; expected one of {list(READABLE_SCHEMAS)}")
    body = {k: v for k, v in data.items() if k != "schema"}
    result = _decode(Case, body, path)
    assert isinstance(result, Case)
    return result


def _decode(tp: Any, value: Any, path: str) -> Any:
    if tp is Body:
        for module in BODY_MODULES:
            importlib.import_module(module)
        kinds = Body.registry
        if not isinstance(value, dict) or value.get("kind") not in kinds:
            got = value.get("kind") if isinstance(value, dict) else value
            raise CaseError(f"{path}.kind", f"{got!r:.80} is not one of {sorted(kinds)}")
        return _decode(kinds[value["kind"]], value, path)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if all(dataclasses.is_dataclass(o) for o in options):
            # The one untagged union of dataclasses (Node): Leaf has "kind", Block has "children".
            if isinstance(value, dict) and "children" in value:
                return _decode(Block, value, path)
            return _decode(Leaf, value, path)
        if bool in options and int in options:
            if isinstance(value, int):  # bools included
                return value
            raise CaseError(path, f"expected a bool or an int, got {value!r:.80}")
        for option in options:
            if option is type(None) and value is None:
                return None
        non_none = [o for o in options if o is not type(None)]
        return _decode(non_none[0], value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise CaseError(path, f"expected a list, got {value!r:.80}")
        (item_tp, _ellipsis) = typing.get_args(tp)
        return tuple(_decode(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise CaseError(path, f"{value!r:.80} is not one of {[m.value for m in tp]}") from None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise CaseError(path, f"expected a JSON object, got {value!r:.80}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        tag = {"kind"} if getattr(tp, "KIND", None) else set()
        unknown = set(value) - set(fields) - tag
        if unknown:
            raise CaseError(path, f"unknown field(s) {sorted(unknown)}")
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = _decode(hints[name], value[name], f"{path}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise CaseError(f"{path}.{name}", "missing")
        try:
            return typing.cast(Any, tp)(**kwargs)
        except CaseError as e:
            raise CaseError(f"{path}.{e.path}", str(e).split(": ", 1)[1]) from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CaseError(path, f"expected a number, got {value!r:.80}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaseError(path, f"expected an integer, got {value!r:.80}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise CaseError(path, f"expected true or false, got {value!r:.80}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise CaseError(path, f"expected a string, got {value!r:.80}")
        return value
    raise TypeError(f"no decoder for {tp!r}")
