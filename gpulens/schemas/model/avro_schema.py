"""Avro schemas of the event model: derived from the pydantic models, committed as ``.avsc``.

The committed files are the contract (the codec reads them); :func:`derive` is how they are
written (``gpulens schemas export``), and a test proves the two are identical, so a model
and its schema cannot drift apart.
"""

from __future__ import annotations

import json
import types
import typing
from datetime import datetime
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, BaseModel
from pydantic.fields import FieldInfo

from gpulens.schemas.model.models import AVRO_ENUM_DEFAULTS, Record

AVRO_DIR = Path(__file__).parent / "avro"

_PRIMITIVES: dict[type, str] = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes"}

AvroType = str | dict[str, Any] | list[Any]


def derive(model: type[Record]) -> dict[str, Any]:
    """The Avro record schema of ``model`` (nested records and enums defined inline once)."""
    schema = _record(model, defined=set())
    assert isinstance(schema, dict)  # nothing is defined yet, so the record is written out whole
    return schema


def schema_path(model: type[Record]) -> Path:
    """Where the committed schema of ``model`` lives."""
    return AVRO_DIR / f"{model.__name__}.avsc"


def render(schema: dict[str, Any]) -> str:
    """The canonical text of a schema file."""
    return json.dumps(schema, indent=2) + "\n"


@cache
def committed(model: type[Record]) -> str:
    """The committed schema text of ``model`` (what is registered and used on the wire)."""
    return schema_path(model).read_text()


def _record(model: type[BaseModel], defined: set[str]) -> AvroType:
    namespace = getattr(model, "avro_namespace", "io.gpulens.v1")
    full_name = f"{namespace}.{model.__name__}"
    if full_name in defined:
        return full_name
    defined.add(full_name)
    hints = typing.get_type_hints(model)
    fields = [_field(name, hints[name], info, defined) for name, info in model.model_fields.items()]
    schema: dict[str, Any] = {"type": "record", "name": model.__name__, "namespace": namespace}
    if model.__doc__:
        schema["doc"] = " ".join(model.__doc__.split())
    schema["fields"] = fields
    return schema


def _field(name: str, annotation: Any, info: FieldInfo, defined: set[str]) -> dict[str, Any]:
    field: dict[str, Any] = {"name": name, "type": _type(annotation, defined)}
    if info.description:
        field["doc"] = info.description
    if info.default_factory is not None:
        field["default"] = info.default_factory()  # type: ignore[call-arg]
    elif not info.is_required():
        default = info.default
        field["default"] = default.value if isinstance(default, Enum) else default
    return field


def _type(annotation: Any, defined: set[str]) -> AvroType:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        members = [a for a in args if a is not type(None)]
        if len(members) != 1 or len(args) != 2:
            raise TypeError(f"only 'X | None' unions map to Avro, got {annotation}")
        return ["null", _type(members[0], defined)]
    if origin is list:
        return {"type": "array", "items": _type(args[0], defined)}
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"Avro maps need str keys, got {annotation}")
        return {"type": "map", "values": _type(args[1], defined)}
    if annotation in _PRIMITIVES:
        return _PRIMITIVES[annotation]
    if annotation in (datetime, AwareDatetime):
        return {"type": "long", "logicalType": "timestamp-millis"}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _enum(annotation, defined)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _record(annotation, defined)
    raise TypeError(f"no Avro mapping for {annotation!r}")


def _enum(enum: type[Enum], defined: set[str]) -> AvroType:
    full_name = f"io.gpulens.v1.{enum.__name__}"
    if full_name in defined:
        return full_name
    defined.add(full_name)
    symbols = [member.value for member in enum]
    schema: dict[str, Any] = {"type": "enum", "name": enum.__name__, "namespace": "io.gpulens.v1"}
    if enum.__doc__:
        schema["doc"] = " ".join(enum.__doc__.split())
    schema["symbols"] = symbols
    # A default symbol lets old readers resolve symbols added later (Avro 1.9+ enum default).
    schema["default"] = AVRO_ENUM_DEFAULTS[enum].value
    return schema
