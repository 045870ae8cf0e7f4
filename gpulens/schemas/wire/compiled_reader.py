"""Avro bodies straight to models: one generated reader per model, for the hot consumers.

``fastavro.schemaless_reader`` + ``model_validate`` cost 49 + 24 µs for a GpuSampleBatch of 8
GPUs (measured with garbage collection off: fastavro reads a file object field by field, then
pydantic re-checks types Avro already guarantees). For a body written with the model's own
committed schema, the reader generated here (38 µs for that batch) reads the bytes with
slices and ``struct`` and builds the model instances directly, checking only what Avro cannot
guarantee: the models' constraints (``min_length``, ``ge``, ...) and, where the model's config
forbids them (every :class:`~gpulens.schemas.model.models.Record`), no NaN or infinity, the way
pydantic would.

It is sound, not complete: it either returns what the exact path (fastavro, then
``model_validate``) would return, or gives up (:class:`NotCompiled`, or any exception while
reading), and then the exact path decides, error message included. Models with a type or
constraint it does not know get no reader at all. A test compares both paths on random
records of every catalog model and on damaged bodies.
"""

from __future__ import annotations

import struct
import types
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import AwareDatetime

from gpulens.schemas.model.models import Record
from gpulens.schemas.wire.generated_source import GeneratedSource
from gpulens.schemas.wire.model_rules import has_validators, refuses_nan, split

Reader = Callable[[bytes, int], Record]
"""Reads the body that starts at the offset; raises on anything it cannot read exactly."""

_COMPARISONS = {Ge: ("ge", ">="), Gt: ("gt", ">"), Le: ("le", "<="), Lt: ("lt", "<")}


class NotCompiled(Exception):
    """The model uses something the generated reader does not cover: decode it exactly."""


def compile_reader(model: type[Record]) -> Reader:
    """The reader of bodies written with ``model``'s schema (:class:`NotCompiled` if none)."""
    source = _Source()
    helpers = {
        "_double": struct.Struct("<d").unpack_from,
        "_float": struct.Struct("<f").unpack_from,
        "_epoch": datetime(1970, 1, 1, tzinfo=UTC),
        "_ms": timedelta(milliseconds=1),
        "_new": object.__new__,
        "_set": object.__setattr__,
    }
    read: Callable[[bytes, int], tuple[Record, int]] = source.load(
        source.record(model), helpers, f"<reader of {model.__name__}>"
    )

    def reader(data: bytes, pos: int) -> Record:
        record, end = read(data, pos)
        if end != len(data):
            raise ValueError(f"{len(data) - end} bytes left over")
        return record

    return reader


_MIN_RUN = 3
"""Fewest optional doubles in a row worth a speculative ``struct`` read."""


def _runs(model: type[Record], hints: dict[str, Any]) -> list[list[str]]:
    """The fields in order, grouped: runs of optional doubles (with bounds at most), others alone."""
    groups: list[list[str]] = []
    in_run = False
    for field, info in model.model_fields.items():
        if info.alias not in (None, field):
            raise NotCompiled(f"{model.__name__}.{field} has an alias")
        optional_double = hints[field] == float | None and all(type(m) in _COMPARISONS for m in info.metadata)
        if optional_double and in_run:
            groups[-1].append(field)
        else:
            groups.append([field])
        in_run = optional_double
    return groups


def _nothing(_data: bytes, _pos: int) -> None:
    """The guess before any record was read: none."""


class _RunPatterns:
    """Readers of a run of optional doubles, one per null/non-null pattern, made when first seen.

    Each reads the union tags and values of its pattern with one ``struct`` call and answers
    None unless every tag is exactly that pattern's (0: null, 2: a double follows) and every
    value present passes its field's checks (finite, within its bounds).
    """

    def __init__(self, checks: list[list[str]]) -> None:
        self._checks = checks
        """Per field of the run, conditions on ``{v}`` (its value) that must all hold."""
        self._made: dict[tuple[bool, ...], Callable[[bytes, int], tuple[Any, ...] | None]] = {}

    def __call__(self, pattern: tuple[bool, ...]) -> Callable[[bytes, int], tuple[Any, ...] | None]:
        reader = self._made.get(pattern)
        if reader is None:
            reader = self._made[pattern] = self._make(pattern)
        return reader

    def _make(self, pattern: tuple[bool, ...]) -> Callable[[bytes, int], tuple[Any, ...] | None]:
        layout = struct.Struct("<" + "".join("Bd" if present else "B" for present in pattern))
        unpacked = [f"t{i}, v{i}" if present else f"t{i}" for i, present in enumerate(pattern)]
        tags = " or ".join(f"t{i} != {2 if present else 0}" for i, present in enumerate(pattern))
        for i, present in enumerate(pattern):
            if present:
                tags += "".join(f" or not ({check.format(v=f'v{i}')})" for check in self._checks[i])
        values = ", ".join(f"v{i}" if present else "None" for i, present in enumerate(pattern))
        source = [
            "def read(data, pos):",
            f"    if len(data) - pos < {layout.size}:",
            "        return None",
            f"    {', '.join(unpacked)} = _unpack(data, pos)",
            f"    if {tags}:",
            "        return None",
            f"    return {values}, pos + {layout.size}",
        ]
        namespace: dict[str, Any] = {"_unpack": layout.unpack_from}
        exec("\n".join(source), namespace)
        return namespace["read"]  # type: ignore[no-any-return]


class _Source(GeneratedSource):
    """The generated module: one function reading each record model."""

    prefix = "_read_"

    def __init__(self) -> None:
        super().__init__()
        self._finite = False
        """Whether the record being generated refuses NaN and infinities (its config)."""

    def _check(self, model: type[Record]) -> None:
        if model.__private_attributes__ or model.__pydantic_post_init__ or has_validators(model):
            raise NotCompiled(f"{model.__name__} has validators, private attributes or a post-init")

    def _define(self, model: type[Record], name: str) -> None:
        hints = typing.get_type_hints(model, include_extras=True)
        outer, self._finite = self._finite, refuses_nan(model)
        body: list[str] = []
        names = list(model.model_fields)
        for run in _runs(model, hints):
            if len(run) >= _MIN_RUN:
                self._speculative_run(body, run, model)
                continue
            for field in run:
                self._value(body, f"f_{field}", hints[field], model.model_fields[field].metadata, "    ")
        cls = self._constant(model)
        # Every field is set, so every record of a model shares one set of them: pydantic only
        # ever adds names to it (assignment; a copy takes its own), and all are in it already.
        # A set per record was 472-1,240 bytes, on each nested model too (a pod holds several).
        fields = self._constant(set(names))
        body += [
            f"    o = _new({cls})",
            "    _set(o, '__dict__', {" + ", ".join(f"{n!r}: f_{n}" for n in names) + "})",
            f"    _set(o, '__pydantic_fields_set__', {fields})",
            "    _set(o, '__pydantic_extra__', None)",
            "    _set(o, '__pydantic_private__', None)",
            "    return o, pos",
        ]
        self.lines += [f"def {name}(data, pos):", *body, ""]
        self._finite = outer

    def _speculative_run(self, out: list[str], run: list[str], model: type[Record]) -> None:
        """Optional doubles in a row: one ``struct`` call for the null/non-null pattern the last
        record had, field by field when this one differs or a value fails its checks (then its
        pattern is the guess, or the checks raise)."""
        guess = self._constant([_nothing])
        metadata = [model.model_fields[field].metadata for field in run]
        finite = ["{v} - {v} == 0.0"] if self._finite else []  # x - x is NaN for NaN and infinities
        checks = [
            finite
            + [f"{{v}} {_COMPARISONS[type(m)][1]} {getattr(m, _COMPARISONS[type(m)][0])!r}" for m in field]
            for field in metadata
        ]
        patterns = self._constant(_RunPatterns(checks))
        names = [f"f_{field}" for field in run]
        out += [f"    r = {guess}[0](data, pos)", "    if r is None:"]
        for var, field_checks in zip(names, metadata, strict=True):
            self._value(out, var, float | None, field_checks, "        ")
        present = ", ".join(f"{var} is not None" for var in names)
        out += [f"        {guess}[0] = {patterns}(({present},))", "    else:"]
        out.append(f"        {', '.join(names)}, pos = r")

    def _value(self, out: list[str], var: str, annotation: Any, checks: list[Any], pad: str) -> None:
        """Lines that read a value of ``annotation`` into ``var`` and check it."""
        annotation, checks = split(annotation, checks)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (types.UnionType, typing.Union):
            members = [a for a in args if a is not type(None)]
            if len(members) != 1 or len(args) != 2:
                raise NotCompiled(f"union {annotation}")
            out += [f"{pad}b = data[pos]", f"{pad}pos += 1", f"{pad}if b == 0:", f"{pad}    {var} = None"]
            out += [f"{pad}elif b == 2:"]
            self._value(out, var, members[0], checks, pad + "    ")
            out += [f"{pad}else:", f"{pad}    raise ValueError('union index')"]
            return
        if origin is list:
            self._blocks(out, var, args[0], pad, keyed=False)
        elif origin is dict:
            if args[0] is not str:
                raise NotCompiled(f"map keys {args[0]}")
            self._blocks(out, var, args[1], pad, keyed=True)
        elif annotation in (str, bytes):
            self._varint(out, "n", pad)
            out += [
                f"{pad}end = pos + n",
                f"{pad}if n < 0 or end > len(data):",
                f"{pad}    raise ValueError('length')",
                f"{pad}{var} = data[pos:end]" + (".decode()" if annotation is str else ""),
                f"{pad}pos = end",
            ]
        elif annotation is int:
            self._varint(out, var, pad)
        elif annotation is float:
            out += [f"{pad}{var} = _double(data, pos)[0]", f"{pad}pos += 8"]
            if self._finite:  # x - x is NaN for NaN and infinities
                out += [f"{pad}if {var} - {var} != 0.0:", f"{pad}    raise ValueError('not finite')"]
        elif annotation is bool:
            out += [
                f"{pad}b = data[pos]",
                f"{pad}pos += 1",
                f"{pad}if b > 1:",
                f"{pad}    raise ValueError('boolean')",
                f"{pad}{var} = b == 1",
            ]
        elif annotation in (datetime, AwareDatetime):
            self._varint(out, "n", pad)
            out.append(f"{pad}{var} = _epoch + n * _ms")
        elif isinstance(annotation, type) and issubclass(annotation, Enum):
            symbols = self._constant(tuple(annotation))
            self._varint(out, "n", pad)
            out += [
                f"{pad}if n < 0:",
                f"{pad}    raise ValueError('enum index')",
                f"{pad}{var} = {symbols}[n]",
            ]
        elif isinstance(annotation, type) and issubclass(annotation, Record):
            out.append(f"{pad}{var}, pos = {self.record(annotation)}(data, pos)")
        else:
            raise NotCompiled(f"type {annotation!r}")
        self._checks(out, var, checks, pad)

    def _checks(self, out: list[str], var: str, checks: list[Any], pad: str) -> None:
        """Lines that raise unless ``var`` keeps ``checks`` (:func:`split` gave them, each once)."""
        for check in checks:
            if isinstance(check, MinLen):
                out += [f"{pad}if len({var}) < {check.min_length!r}:", f"{pad}    raise ValueError('length')"]
            elif isinstance(check, MaxLen):
                out += [f"{pad}if len({var}) > {check.max_length!r}:", f"{pad}    raise ValueError('length')"]
            elif type(check) in _COMPARISONS:
                attr, op = _COMPARISONS[type(check)]
                bound = self._constant(getattr(check, attr))
                out += [f"{pad}if not {var} {op} {bound}:", f"{pad}    raise ValueError('bound')"]
            else:
                raise NotCompiled(f"constraint {check!r}")

    def _varint(self, out: list[str], var: str, pad: str) -> None:
        """A zigzag long, unrolled: a call and a loop per varint cost twice as much (measured)."""
        out += [f"{pad}b = data[pos]", f"{pad}if b < 128:", f"{pad}    {var} = (b >> 1) ^ -(b & 1)"]
        out += [f"{pad}    pos += 1", f"{pad}else:", f"{pad}    n = b & 127"]
        inner = pad + "    "
        for index in range(1, 10):
            last = index == 9  # the tenth byte holds bit 63 alone: more is beyond Avro's long
            out += [f"{inner}b = data[pos + {index}]", f"{inner}if b < {2 if last else 128}:"]
            out += [f"{inner}    n |= b << {7 * index}", f"{inner}    pos += {index + 1}", f"{inner}else:"]
            if last:
                out.append(f"{inner}    raise ValueError('varint beyond 64 bits')")
            else:
                out.append(f"{inner}    n |= (b & 127) << {7 * index}")
                inner += "    "
        out.append(f"{pad}    {var} = (n >> 1) ^ -(n & 1)")

    def _blocks(self, out: list[str], var: str, item: Any, pad: str, *, keyed: bool) -> None:
        """Array or map blocks: a count, negative when a byte size follows, up to a zero count."""
        count, value = self._var(), self._var()
        out.append(f"{pad}{var} = {{}}" if keyed else f"{pad}{var} = []")
        out.append(f"{pad}while True:")
        inner = pad + "    "
        self._varint(out, count, inner)
        out += [f"{inner}if {count} == 0:", f"{inner}    break", f"{inner}if {count} < 0:"]
        out.append(f"{inner}    {count} = -{count}")
        self._varint(out, "skipped", inner + "    ")
        out.append(f"{inner}for _ in range({count}):")
        body = inner + "    "
        if keyed:
            key = self._var()
            self._value(out, key, str, [], body)
            self._value(out, value, item, [], body)
            out.append(f"{body}{var}[{key}] = {value}")
        else:
            self._value(out, value, item, [], body)
            out.append(f"{body}{var}.append({value})")
