"""Whether an encoded record is publishable on its topic: what a consumer of it decodes whole.

A value is publishable when a consumer can decode it: the Confluent wire format, a schema id
the registry knows, an Avro body that resolves to the topic's record schema with nothing left
over, values that keep the event model's rules (finite numbers, ranges, time bounds: what a
consumer would otherwise dead-letter as ``invalid-record``); and its key must be the one
:func:`gpulens.schemas.model.topics.record_key` gives that record. :func:`check_record` decides
it exactly; the ingest gateway, which must decide it for every event it takes, asks a topic's
:class:`Shape` first.

Decoding every event with fastavro costs ~15 µs each (it reads a file object byte by byte),
three times the gateway's whole budget per event. So each topic's own schema (the id under
which its committed schema is registered) is compiled once into a regular expression of its
encoding: header, varints, enum and union indexes, and strings of up to 127 ASCII bytes with
their length prefixes spelled out, numbers and times within the model's bounds
(:mod:`gpulens.schemas.wire.bounds`); arrays and maps are walked block by block, their items
matched by the item's expression. The expression only matches bodies that decode (it is
sound, not complete: timestamps it cannot prove in range, longer or non-ASCII strings, other
schema ids, any other shape), and whatever it does not match is decided exactly, so a verdict
never depends on which path gave it.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import fastavro
from pydantic import BaseModel

from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import DecodeError, DecodeFailure, IncompatibleSchemaError
from gpulens.schemas.model.models import Record
from gpulens.schemas.model.topics import TopicSpec, record_key
from gpulens.schemas.wire import bounds
from gpulens.schemas.wire.codec import AvroCodec, confluent_header
from gpulens.schemas.wire.model_rules import has_validators, refuses_nan, split


def check_record(codec: AvroCodec, spec: TopicSpec, key: bytes, value: bytes) -> None:
    """Nothing when ``value`` decodes whole to a valid record of ``spec`` and ``key`` is that
    record's key; else :class:`DecodeError` says why (``key-mismatch`` for the key)."""
    record: Record = codec.decode(spec, value)
    expected = record_key(spec, record)
    if key != expected:
        raise DecodeError(DecodeFailure.KEY_MISMATCH, f"key {key!r}, the record's key is {expected!r}")


def own_shape(codec: AvroCodec, spec: TopicSpec) -> Shape | None:
    """The shape of the schema every producer of ``spec`` registers and encodes with (compiled
    anew on each call: keep it); None when records must be checked exactly, also when the
    subject moved on from the committed schema."""
    try:
        schema_id = codec.schema_id(spec)
    except IncompatibleSchemaError:
        return None
    return compile_shape(spec, schema_id)


# --- compiling a schema into a shape -------------------------------------------------------------

_MAX_STRING = 127
"""Longest string (or bytes) the expressions spell out; a longer one is decoded exactly."""
_MAX_KEY_STRING = 63
"""Longest key string: one byte of length prefix, so the captured group less its first byte is
the string itself."""
_MAX_SYMBOLS = 64
"""Enums with more symbols (two-byte indexes) are decoded exactly."""
_MAX_INLINE = 32
"""Most items of an array or map spelled out in its record's expression (more: decoded exactly)."""
_MIN_INLINE = 8
"""Fewer would fit the budget: the array or map is walked block by block instead."""
_MAX_INLINE_BYTES = 64 * 1024
"""Budget of the expression of one array or map, all its counts spelled out."""

_ASCII = rb"[\x00-\x7f]"  # a string of ASCII bytes is valid UTF-8, whatever they are
_LONG = rb"[\x80-\xff]{0,9}[\x00-\x7f]"
_INT = rb"[\x80-\xff]{0,4}[\x00-\x7f]"
# A timestamp-millis becomes a datetime, which overflows outside years 1-9999: up to six bytes
# (|t| < 2**41 ms: 1900-2039) or seven with a last byte below 28 (|t| < 6.2e13 ms: years 19-3921).
_TIMESTAMP_MILLIS = rb"(?:[\x80-\xff]{0,5}[\x00-\x7f]|[\x80-\xff]{6}[\x00-\x1b])"
_FIXED_WIDTH = {"null": b"", "boolean": rb"[\x00\x01]", "float": rb".{4}", "double": rb".{8}"}


class _Unsupported(Exception):
    """A schema (or part) the expressions do not cover: its events are decoded exactly."""


class _TooLarge(_Unsupported):
    """An array or map too large to spell out inline: a record walks it instead (_Walk)."""


@dataclass(frozen=True, slots=True)
class _Walk:
    """A record split at its arrays and maps: ``pattern`` up to the first, then each in turn,
    each followed by the fields after it (``afters``; None where none follow)."""

    pattern: re.Pattern[bytes]
    items: tuple[_Walk, ...] = ()
    """One item of each array (one entry, key and value, of each map)."""
    afters: tuple[re.Pattern[bytes] | None, ...] = ()
    runs: dict[int, re.Pattern[bytes]] = field(default_factory=dict)
    """``pattern`` repeated, by count: a block of this many items in one match (compiled once)."""

    def skip(self, data: bytes, pos: int) -> int:
        """Where the value that starts at ``pos`` ends; -1 when the expressions cannot tell."""
        match = self.pattern.match(data, pos)
        return -1 if match is None else self.skip_rest(data, match.end())

    def skip_rest(self, data: bytes, pos: int) -> int:
        """Past the arrays and maps (and the fields after each) from ``pos``, the end of ``pattern``."""
        for item, after in zip(self.items, self.afters, strict=True):
            pos = item.skip_blocks(data, pos)
            if after is not None and pos >= 0:
                match = after.match(data, pos)
                pos = -1 if match is None else match.end()
            if pos < 0:
                return -1
        return pos

    def skip_blocks(self, data: bytes, pos: int) -> int:
        """Past the blocks of items (self) of an array or map at ``pos``: counts of one byte and
        no block sizes, as fastavro writes them; -1 for anything else."""
        while pos < len(data):
            count = data[pos]
            pos += 1
            if not count:
                return pos
            if count & 0x81:  # a negative count (then a block size) or a count of two bytes
                return -1
            if self.items:  # items with arrays or maps of their own: one at a time
                for _ in range(count >> 1):
                    pos = self.skip(data, pos)
                    if pos < 0:
                        return -1
                continue
            run = self.runs.get(count)
            if run is None:
                run = self.runs[count] = re.compile(
                    b"(?:%s){%d}" % (self.pattern.pattern, count >> 1), re.DOTALL
                )
            match = run.match(data, pos)
            if match is None:
                return -1
            pos = match.end()
        return -1


@dataclass(frozen=True, slots=True)
class Shape:
    """The encoding of one topic's own schema, header included: what matches it is publishable."""

    walk: _Walk
    entity: int
    """Group of the key field's string, with its one-byte length prefix."""
    cluster: int | None
    """Group of the cluster's, when the key has one."""

    def accepts(self, key: bytes, value: bytes) -> bool:
        """True when ``value`` decodes by the expressions and ``key`` is its record's key; False
        says nothing: the record is then checked exactly (:func:`check_record`)."""
        walk = self.walk
        if walk.items:
            match = walk.pattern.match(value)
            if match is None or walk.skip_rest(value, match.end()) != len(value):
                return False
        else:
            match = walk.pattern.fullmatch(value)
            if match is None:
                return False
        entity = match[self.entity][1:]
        return key == (entity if self.cluster is None else match[self.cluster][1:] + b"/" + entity)


def compile_shape(spec: TopicSpec, schema_id: int) -> Shape | None:
    """The shape of ``spec``'s committed schema, registered as ``schema_id``; None when the
    expressions cannot cover it (every event of the topic is then checked exactly)."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(json.loads(committed(spec.record)), named_schemas=named)
    schema = typing.cast(dict[str, Any], parsed)  # a record's schema parses to a dict
    fields = {member["name"]: member["type"] for member in schema["fields"]}
    groups = {spec.key_field: "entity"}
    if "cluster" in fields and spec.key_field != "cluster":  # as record_key builds it
        groups["cluster"] = "cluster"
    if any(fields.get(name) != "string" for name in groups):
        return None
    try:
        walk = _compile(
            schema, named, spec.record, header=re.escape(confluent_header(schema_id)), groups=groups
        )
    except (_Unsupported, bounds.Unsupported):
        return None
    index = walk.pattern.groupindex
    return Shape(walk, index["entity"], index.get("cluster"))


def _compile(
    record: dict[str, Any],
    named: dict[str, Any],
    model: Any,
    *,
    header: bytes = b"",
    groups: dict[str, str] | None = None,
) -> _Walk:
    """``record`` (the schema of ``model``) split at its arrays and maps; the string fields named
    in ``groups`` are captured under the given group names, and must come before the first
    array or map."""
    pieces: list[list[bytes]] = [[header]]
    items: list[_Walk] = []
    fields, finite = _rules(model)
    for member in record["fields"]:
        kind = _resolve(member["type"], named)
        hint, checks = fields[member["name"]]
        group = (groups or {}).get(member["name"])
        if group is None:
            try:
                pieces[-1].append(_flat(kind, named, hint, checks, finite))
            except _TooLarge:  # an array or map whose items are walked one block at a time
                items.append(_item(kind, named, hint, finite))
                pieces.append([])
        elif items:
            raise _Unsupported(f"key field {member['name']} after an array or map")
        else:
            shortest = bounds.min_length(split(hint, checks)[1])
            string = _strings(_ASCII, _MAX_KEY_STRING, shortest)
            pieces[-1].append(b"(?P<%s>%s)" % (group.encode(), string))
    patterns = [re.compile(b"".join(piece), re.DOTALL) if any(piece) else None for piece in pieces]
    return _Walk(patterns[0] or re.compile(b""), tuple(items), tuple(patterns[1:]))


def _rules(model: Any) -> tuple[dict[str, tuple[Any, list[Any]]], bool]:
    """Each field's type hint and constraints, and whether the model refuses NaN and infinities."""
    if not isinstance(model, type) or not issubclass(model, BaseModel):
        raise _Unsupported(f"a record that is not a model: {model!r}")
    if has_validators(model):
        raise _Unsupported(f"{model.__name__} has validators")
    hints = typing.get_type_hints(model, include_extras=True)
    fields = {name: (hints[name], list(info.metadata)) for name, info in model.model_fields.items()}
    return fields, refuses_nan(model)


def _element(hint: Any) -> Any:
    """The hint of an array's items or a map's values, from the list or dict hint."""
    args = typing.get_args(split(hint)[0])
    return args[-1] if args else None


def _item(collection: dict[str, Any], named: dict[str, Any], hint: Any, finite: bool) -> _Walk:
    """How one item of an array, or one entry (a string key, then the value) of a map, is matched."""
    element = _element(hint)
    if collection["type"] == "map":
        value = _flat(collection["values"], named, element, [], finite)
        return _Walk(re.compile(_strings(_ASCII) + value, re.DOTALL))
    kind = _resolve(collection["items"], named)
    if isinstance(kind, dict) and kind["type"] == "record":
        return _compile(kind, named, element)
    return _Walk(re.compile(_flat(kind, named, element, [], finite), re.DOTALL))


def _inline(collection: dict[str, Any], named: dict[str, Any], hint: Any, finite: bool) -> bytes:
    """An array or map as one block (or none), as fastavro writes it: the count, the items, the
    closing zero. The expression spells out each count up to as many as fit _MAX_INLINE_BYTES
    (compiling is the cost: ~1 ms per kB), at least _MIN_INLINE, else :class:`_TooLarge`."""
    element = _element(hint)
    if collection["type"] == "map":
        item = _strings(_ASCII) + _flat(collection["values"], named, element, [], finite)
    else:
        item = _flat(collection["items"], named, element, [], finite)
    most = min(_MAX_INLINE, _MAX_INLINE_BYTES // len(item))
    if most < _MIN_INLINE:
        raise _TooLarge(f"{collection['type']} items of {len(item)} bytes of expression")
    blocks = [_varint(count) + b"(?:%s){%d}" % (item, count) for count in range(1, most + 1)]
    return b"(?:" + b"|".join(blocks) + b")?\x00"


def _resolve(kind: Any, named: dict[str, Any]) -> Any:
    """A named type's definition for its name (fastavro's parsed schemas refer by full name)."""
    return named[kind] if isinstance(kind, str) and kind in named else kind


def _flat(kind: Any, named: dict[str, Any], hint: Any, checks: list[Any], finite: bool) -> bytes:
    """The expression of a value without arrays or maps that keeps the model's rules for it
    (``hint`` and ``checks``; ``finite``: no NaN or infinity); :class:`_Unsupported` for anything
    else."""
    kind = _resolve(kind, named)
    hint, checks = split(hint, checks)
    if isinstance(kind, list):  # a union: the branch's index, then the branch
        inner = next((a for a in typing.get_args(hint) if a is not type(None)), None)
        return (
            b"(?:"
            + b"|".join(
                _varint(i) + (b"" if branch == "null" else _flat(branch, named, inner, checks, finite))
                for i, branch in enumerate(kind)
            )
            + b")"
        )
    if isinstance(kind, str):
        kind = {"type": kind}
    name, logical = kind["type"], kind.get("logicalType")
    if logical is not None:
        if (name, logical) != ("long", "timestamp-millis"):
            raise _Unsupported(f"logical type {logical}")
        return bounds.timestamp(checks, plain=_TIMESTAMP_MILLIS)
    if name == "double":
        return bounds.double(checks, finite=finite)
    if name == "long":
        return bounds.long(checks, plain=_LONG)
    if name in ("string", "bytes"):
        return _strings(_ASCII if name == "string" else rb".", _MAX_STRING, bounds.min_length(checks))
    if checks or (finite and name == "float"):
        raise _Unsupported(f"constraints {checks} on a {name}")
    if name in _FIXED_WIDTH:
        return _FIXED_WIDTH[name]
    if name == "int":
        return _INT
    if name == "fixed":
        return rb".{%d}" % kind["size"]
    if name == "enum":
        if len(kind["symbols"]) > _MAX_SYMBOLS:
            raise _Unsupported("an enum of more than 64 symbols")
        return b"[" + b"".join(_varint(i) for i in range(len(kind["symbols"]))) + b"]"
    if name == "record":
        fields, inner_finite = _rules(hint)
        return b"".join(
            _flat(member["type"], named, *fields[member["name"]], inner_finite) for member in kind["fields"]
        )
    if name in ("array", "map"):
        return _inline(kind, named, hint, finite)
    raise _Unsupported(f"type {name}")


@lru_cache(maxsize=8)
def _strings(byte: bytes, longest: int = _MAX_STRING, shortest: int = 0) -> bytes:
    """A length prefix and that many bytes, each matching ``byte``, for every length from
    ``shortest`` up to ``longest``."""
    lengths = range(shortest, longest + 1)
    return b"(?:" + b"|".join(_varint(n) + byte + b"{%d}" % n for n in lengths) + b")"


def _varint(value: int) -> bytes:
    """Avro's zig-zag varint of ``value``, escaped for an expression."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return re.escape(bytes(out))
