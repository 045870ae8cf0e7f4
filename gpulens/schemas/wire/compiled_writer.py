"""Models straight to Avro bodies: one generated writer per model, for the worker's rows.

``codec.encode`` was ``model_dump`` and then ``fastavro.schemaless_writer`` over the dict: the
worker spent 17 % of its time publishing rows at 10,000 GPUs, most of it there. The writer
generated here reads the model's attributes and appends their Avro encoding to a
``bytearray`` (varints, ``struct`` for doubles), in the committed schema's field order: the
same bytes fastavro writes (a test compares both on random records of every catalog model).

It is the mirror of :mod:`gpulens.schemas.wire.compiled_reader` and covers the same types:
optional values (``null`` first in the union), lists, maps with string keys, strings, bytes,
longs, doubles, booleans, timezone-aware timestamps in milliseconds, enums and nested
records. A model with anything else, or with serializers of its own (``model_dump`` would
change values), gets no writer (:class:`NotCompiled`), and a value the writer cannot write
(a naive datetime, a value of the wrong type in a record built without validation) raises:
the codec then writes that record the exact way.
"""

from __future__ import annotations

import json
import struct
import types
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import AwareDatetime

from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import Record
from gpulens.schemas.wire.compiled_reader import NotCompiled
from gpulens.schemas.wire.generated_source import GeneratedSource
from gpulens.schemas.wire.model_rules import split

Writer = Callable[[Record], bytes]
"""The Avro body of a record (no Confluent header); raises on a value it cannot write."""


def _long(out: bytearray, n: int) -> None:
    """A zigzag varint (Avro int and long)."""
    n = (n << 1) ^ (n >> 63)
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)


def _varint(n: int) -> bytes:
    """``n`` as :func:`_long` writes it."""
    out = bytearray()
    _long(out, n)
    return bytes(out)


def compile_writer(model: type[Record]) -> Writer:
    """The writer of ``model``'s bodies in its committed schema (:class:`NotCompiled` if none)."""
    source = _Source(_record_fields(json.loads(committed(model))))
    helpers = {
        "_double": struct.Struct("<d").pack,
        "_epoch": datetime(1970, 1, 1, tzinfo=UTC),
        "_long": _long,
    }
    write: Callable[[Record, bytearray], None] = source.load(
        source.record(model), helpers, f"<writer of {model.__name__}>"
    )

    def writer(record: Record) -> bytes:
        if type(record) is not model:
            raise TypeError(f"a {type(record).__name__}, not a {model.__name__}")
        out = bytearray()
        write(record, out)
        return bytes(out)

    return writer


def _record_fields(schema: Any, found: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Field names of every record the schema defines, by the record's short name."""
    found = {} if found is None else found
    if isinstance(schema, list):
        for member in schema:
            _record_fields(member, found)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            found[schema["name"].rsplit(".", 1)[-1]] = [field["name"] for field in schema["fields"]]
            for field in schema["fields"]:
                _record_fields(field["type"], found)
        else:
            _record_fields(schema.get("items"), found)
            _record_fields(schema.get("values"), found)
    return found


class _Source(GeneratedSource):
    """The generated module: one function writing each record model."""

    prefix = "_write_"

    def __init__(self, schema_fields: dict[str, list[str]]) -> None:
        super().__init__()
        self._schema_fields = schema_fields
        """Field names of the schema's records: the writer writes the model's in its order."""

    def _check(self, model: type[Record]) -> None:
        decorators = model.__pydantic_decorators__
        if decorators.field_serializers or decorators.model_serializers or decorators.computed_fields:
            raise NotCompiled(f"{model.__name__} has serializers or computed fields")
        if self._schema_fields.get(model.__name__) != list(model.model_fields):
            raise NotCompiled(f"{model.__name__}: not the fields of its record in the schema, in order")

    def _define(self, model: type[Record], name: str) -> None:
        hints = typing.get_type_hints(model, include_extras=True)
        body: list[str] = []
        for field in model.model_fields:
            var = self._var()
            body.append(f"    {var} = o.{field}")
            self._value(body, var, hints[field], "    ")
        self.lines += [f"def {name}(o, out):", *(body or ["    pass"]), ""]

    def _value(self, out: list[str], var: str, annotation: Any, pad: str) -> None:
        """Lines that append the encoding of ``var``, a value of ``annotation``."""
        annotation, _checks = split(annotation)  # constraints held when the record was made
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (types.UnionType, typing.Union):
            members = [a for a in args if a is not type(None)]
            if len(members) != 1 or len(args) != 2:
                raise NotCompiled(f"union {annotation}")
            out += [
                f"{pad}if {var} is None:",
                f"{pad}    out.append(0)",
                f"{pad}else:",
                f"{pad}    out.append(2)",
            ]
            self._value(out, var, members[0], pad + "    ")
        elif origin is list:
            item = self._var()
            out.append(f"{pad}if {var}:")
            self._size(out, f"len({var})", pad + "    ")
            out.append(f"{pad}    for {item} in {var}:")
            self._value(out, item, args[0], pad + "        ")
            out.append(f"{pad}out.append(0)")
        elif origin is dict:
            if args[0] is not str:
                raise NotCompiled(f"map keys {args[0]}")
            key, item = self._var(), self._var()
            out.append(f"{pad}if {var}:")
            self._size(out, f"len({var})", pad + "    ")
            out.append(f"{pad}    for {key}, {item} in {var}.items():")
            self._value(out, key, str, pad + "        ")
            self._value(out, item, args[1], pad + "        ")
            out.append(f"{pad}out.append(0)")
        elif annotation in (str, bytes):
            raw = self._var()
            out.append(f"{pad}{raw} = {var}.encode()" if annotation is str else f"{pad}{raw} = bytes({var})")
            self._size(out, f"len({raw})", pad)
            out.append(f"{pad}out += {raw}")
        elif annotation is int:
            out += [f"{pad}if type({var}) is not int:", f"{pad}    raise TypeError('long')"]
            out.append(f"{pad}_long(out, {var})")
        elif annotation is float:
            out.append(f"{pad}out += _double({var})")
        elif annotation is bool:
            out += [f"{pad}if type({var}) is not bool:", f"{pad}    raise TypeError('boolean')"]
            out.append(f"{pad}out.append(1 if {var} else 0)")
        elif annotation in (datetime, AwareDatetime):
            delta = self._var()
            out.append(f"{pad}{delta} = {var} - _epoch")  # a naive datetime raises TypeError here
            millis = f"({delta}.days * 86400 + {delta}.seconds) * 1000 + {delta}.microseconds // 1000"
            out.append(f"{pad}_long(out, {millis})")
        elif isinstance(annotation, type) and issubclass(annotation, Enum):
            encoded = self._constant({member: _varint(i) for i, member in enumerate(annotation)})
            out.append(f"{pad}out += {encoded}[{var}]")
        elif isinstance(annotation, type) and issubclass(annotation, Record):
            out += [
                f"{pad}if type({var}) is not {self._constant(annotation)}:",
                f"{pad}    raise TypeError('record')",
            ]
            out.append(f"{pad}{self.record(annotation)}({var}, out)")
        else:
            raise NotCompiled(f"type {annotation!r}")

    @staticmethod
    def _size(out: list[str], size: str, pad: str) -> None:
        """Lines that append ``size`` (a length or count, never negative) as a varint: one byte
        inline below 64, the common case (the varint call was the writer's hottest line, 5 % of
        the worker over the start of 100,000 GPUs)."""
        out += [
            f"{pad}_n = {size}",
            f"{pad}if _n < 64:",
            f"{pad}    out.append(_n << 1)",
            f"{pad}else:",
            f"{pad}    _long(out, _n)",
        ]
