"""The wire bytes of a :class:`SampleRound`'s GpuSampleBatches, without building or encoding records.

A batch's Avro body has the same layout from one interval to the next: what changes is its
event id (always 32 hex characters), its event time (a varint of the same length for
centuries) and the samples' float fields (8 bytes each). So each node's record is laid out
once, in a row of a byte matrix, with the offsets of those fields; each round then writes the
event ids, the time and every float of the fleet into the matrix with a few numpy operations
and slices the rows out. A node is laid out again when what its layout holds changes: the set
of its GPUs (one lost, one back), an integer field (memory used changes when a pod starts or
ends, the ECC counter rarely); all are when the length of the time varint changes, or which
float columns are null.

The bytes are exactly :meth:`gpulens.schemas.wire.codec.AvroCodec.encode`'s for :meth:`SampleRound.batches`
(tests compare them byte for byte); the writer refuses a committed schema whose shape it does
not know, so a schema change cannot make it write something else.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from gpulens.producers.simulate.rounds import Ints, SampleRound
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import GpuSampleBatch
from gpulens.schemas.model.topics import entity_key
from gpulens.schemas.wire.codec import MAGIC

_HEADER = struct.Struct(">bI")
_ID_CHARS = 32
"""Event ids are 128-bit hex (gpulens.schemas.model.ids.event_id)."""
_BATCH_FIELDS = [
    ("event_id", "string"),
    ("cluster", "string"),
    ("event_time", {"type": "long", "logicalType": "timestamp-millis"}),
    ("source", "string"),
    ("node", "string"),
]
_NULL, _PRESENT = b"\x00", b"\x02"
"""Union branch indexes of ``["null", X]`` as Avro longs."""


def avro_long(value: int) -> bytes:
    """An Avro long: zig-zag, then 7 bits a byte, low bits first."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def avro_string(value: str) -> bytes:
    data = value.encode()
    return avro_long(len(data)) + data


def _sample_fields() -> list[tuple[str, str, bool]]:
    """(name, Avro type, nullable) of GpuSample's fields, checked against what this writer writes."""
    schema = json.loads(committed(GpuSampleBatch))
    fields = schema["fields"]
    head = [(f["name"], f["type"]) for f in fields[: len(_BATCH_FIELDS)]]
    samples = fields[len(_BATCH_FIELDS) :]
    if head != _BATCH_FIELDS or len(samples) != 1 or samples[0]["name"] != "samples":
        raise ValueError("GpuSampleBatch's schema changed: SampleBatchWriter must learn its new layout")
    out = []
    for field in samples[0]["type"]["items"]["fields"]:
        kind: Any = field["type"]
        nullable = isinstance(kind, list)
        if nullable:
            if len(kind) != 2 or kind[0] != "null":
                raise ValueError(f"GpuSample.{field['name']}: union {kind} not written here")
            kind = kind[1]
        if kind not in ("string", "long", "double") or (kind == "string" and nullable):
            raise ValueError(f"GpuSample.{field['name']}: type {field['type']} not written here")
        out.append((field["name"], kind, nullable))
    return out


class SampleBatchWriter:
    """Writes rounds of one cluster and source as Confluent-framed Avro, schema ``schema_id``."""

    def __init__(self, schema_id: int) -> None:
        self._header = _HEADER.pack(MAGIC, schema_id) + avro_long(_ID_CHARS)
        self._fields = _sample_fields()
        self._floats = [name for name, kind, _ in self._fields if kind == "double"]
        self._rows: dict[str, int] = {}
        """Row of each node's record."""
        self._keys: list[bytes] = []
        self._width = 0
        self._matrix = np.zeros((0, 0), np.uint8)
        self._length = np.zeros(0, np.int64)
        """Bytes of each row's record; -1 until laid out."""
        self._offsets = np.zeros((0, len(self._floats)), np.int64)
        """Per slot: where each float field's 8 bytes lie in its row (-1 for a null one)."""
        self._laid_row = np.zeros(0, np.int64)
        """Per slot: the row whose layout holds it (-1 none)."""
        self._laid_ints: dict[str, npt.NDArray[np.int64]] = {}
        self._laid_slots: dict[int, list[int]] = {}
        """Per row: the slots its layout holds."""
        self._laid_count = np.zeros(0, np.int64)
        self._origin: tuple[str, str] | None = None
        """The cluster and source every round must have (they fix where the time lies)."""
        self._time_at = 0
        """Offset of the event time in every row (the cluster's length decides it)."""
        self._time_len = 0
        self._nulls: frozenset[str] = frozenset()
        """The float columns null in every sample of the layouts."""
        self._where_of: tuple[tuple[int, int, tuple[int, ...]], Ints, Ints, Ints] | None = None
        """(key, rows, slots, byte index) of the previous round (:meth:`_where`)."""

    def write(self, round_: SampleRound) -> tuple[list[bytes], list[bytes]]:
        """Keys and values of every batch of ``round_``, in its node order."""
        if self._origin is None:
            self._origin = (round_.cluster, round_.source)
        elif self._origin != (round_.cluster, round_.source):
            raise ValueError(f"a writer of {self._origin} got a round of {(round_.cluster, round_.source)}")
        rows = self._rows_of(round_)
        time = avro_long(round_.at_ms)
        nulls = frozenset(name for name, column in round_.floats.items() if column is None)
        if (len(time), nulls) != (self._time_len, self._nulls):  # every layout moves: all laid out again
            self._time_len, self._nulls = len(time), nulls
            self._length[:] = -1
        changed = self._changed(round_, rows)
        self._lay_out(round_, rows, changed)
        matrix, at = self._matrix, self._time_at
        matrix[rows, at : at + len(time)] = np.frombuffer(time, np.uint8)
        ids = np.frombuffer("".join(round_.event_ids).encode("ascii"), np.uint8)
        matrix[rows, len(self._header) : len(self._header) + _ID_CHARS] = ids.reshape(-1, _ID_CHARS)
        floats = [round_.floats[name] for name in self._floats]
        present = [(k, column) for k, column in enumerate(floats) if column is not None]
        if present and round_.samples:
            columns = [k for k, _ in present]
            values = np.column_stack([column for _, column in present]).astype("<f8", copy=False)
            where = self._where(round_, rows, columns, changed)
            matrix.reshape(-1)[where] = values.view(np.uint8).reshape(where.shape)
        blob = matrix[rows].tobytes()
        width, lengths = self._width, self._length[rows].tolist()
        values_out = [blob[k * width : k * width + n] for k, n in enumerate(lengths)]
        return [self._keys[row] for row in rows.tolist()], values_out

    def _where(
        self, round_: SampleRound, rows: npt.NDArray[np.int64], columns: list[int], changed: list[int]
    ) -> npt.NDArray[np.int64]:
        """Where each byte of each sample's floats goes in the flattened matrix. Building this
        index costs several times the copy it directs, so it is kept from one round to the next
        and only the samples of nodes laid out again are redone, while the nodes, their GPUs,
        the float columns and the matrix's width stay the same."""
        key = (len(self._keys), self._width, tuple(columns))
        last = self._where_of
        if (
            last is not None
            and last[0] == key
            and np.array_equal(last[1], rows)
            and np.array_equal(last[2], round_.slots)
        ):
            where = last[3]
            starts = round_.starts
            for k in changed:
                first, end = starts[k], starts[k + 1]
                where[first:end] = self._bytes_at(rows[k], round_.slots[first:end], columns)
        else:
            row_of = np.repeat(rows, np.diff(round_.starts))
            where = self._bytes_at(row_of[:, None], round_.slots, columns)
        self._where_of = (key, rows, round_.slots, where)
        return where

    def _bytes_at(self, row: Any, slots: npt.NDArray[np.int64], columns: list[int]) -> npt.NDArray[np.int64]:
        start: npt.NDArray[np.int64] = row * self._width + self._offsets[slots][:, columns]
        return start[..., None] + np.arange(8)

    def _rows_of(self, round_: SampleRound) -> npt.NDArray[np.int64]:
        known = self._rows
        for node in round_.nodes:
            if node not in known:
                known[node] = len(self._keys)
                self._keys.append(entity_key(round_.cluster, node))
        if len(self._keys) > len(self._length):
            grown = max(len(self._keys), 2 * len(self._length))
            extra = grown - len(self._length)
            self._length = np.concatenate([self._length, np.full(extra, -1, np.int64)])
            self._laid_count = np.concatenate([self._laid_count, np.zeros(extra, np.int64)])
            self._matrix = _resized(self._matrix, grown, self._width)
        top = int(round_.slots.max()) + 1 if round_.samples else 0
        if top > len(self._laid_row):
            grown = max(top, 2 * len(self._laid_row))
            extra = grown - len(self._laid_row)
            self._laid_row = np.concatenate([self._laid_row, np.full(extra, -1, np.int64)])
            self._offsets = np.concatenate([self._offsets, np.full((extra, len(self._floats)), -1, np.int64)])
            for name in round_.ints:
                old = self._laid_ints.get(name, np.zeros(0, np.int64))
                self._laid_ints[name] = np.concatenate([old, np.zeros(grown - len(old), np.int64)])
        return np.fromiter((known[node] for node in round_.nodes), np.int64, len(round_.nodes))

    def _changed(self, round_: SampleRound, rows: npt.NDArray[np.int64]) -> list[int]:
        """Positions (in the round) of the nodes whose layout is missing or stale."""
        counts = np.diff(round_.starts)
        stale = self._length[rows] < 0
        if round_.samples:
            slots = round_.slots
            node_of = np.repeat(np.arange(len(rows)), counts)
            moved = self._laid_row[slots] != rows[node_of]
            for name, column in round_.ints.items():
                moved |= self._laid_ints[name][slots] != column
            moved_nodes = np.zeros(len(rows), bool)
            moved_nodes[node_of[moved]] = True
            stale |= moved_nodes
        stale |= self._laid_count[rows] != counts
        return np.flatnonzero(stale).tolist()

    def _lay_out(self, round_: SampleRound, rows: npt.NDArray[np.int64], changed: list[int]) -> None:
        if not changed:
            return
        cluster = avro_string(round_.cluster)
        self._time_at = len(self._header) + _ID_CHARS + len(cluster)
        source = avro_string(round_.source)
        starts = round_.starts
        blank = bytes(8)
        for k in changed:
            row, first, end = int(rows[k]), int(starts[k]), int(starts[k + 1])
            slots = round_.slots[first:end].tolist()
            ints = {name: column[first:end].tolist() for name, column in round_.ints.items()}
            ints["index"] = round_.index[first:end].tolist()
            self._laid_row[self._laid_slots.get(row, [])] = -1
            self._laid_slots[row] = slots
            self._laid_count[row] = end - first
            parts = [self._header, bytes(_ID_CHARS), cluster, bytes(self._time_len), source]
            parts.append(avro_string(round_.nodes[k]))
            if end > first:
                parts.append(avro_long(end - first))
            size = sum(map(len, parts))
            for i, slot in enumerate(slots):
                self._laid_row[slot] = row
                for name, kind, nullable in self._fields:
                    if kind == "string":
                        piece = avro_string(round_.device_ids[slot])
                    elif kind == "long":
                        value = ints[name][i]
                        if name != "index":
                            self._laid_ints[name][slot] = value
                        piece = (_PRESENT if nullable else b"") + avro_long(value)
                    elif round_.floats[name] is None:
                        if not nullable:
                            raise ValueError(f"GpuSample.{name} cannot be null")
                        self._offsets[slot, self._floats.index(name)] = -1
                        piece = _NULL
                    else:
                        prefix = _PRESENT if nullable else b""
                        self._offsets[slot, self._floats.index(name)] = size + len(prefix)
                        piece = prefix + blank
                    parts.append(piece)
                    size += len(piece)
            parts.append(b"\x00")
            record = b"".join(parts)
            if len(record) > self._width:
                self._width = max(len(record), self._width * 3 // 2)
                self._matrix = _resized(self._matrix, len(self._length), self._width)
            self._matrix[row, : len(record)] = np.frombuffer(record, np.uint8)
            self._length[row] = len(record)


def _resized(matrix: npt.NDArray[np.uint8], rows: int, width: int) -> npt.NDArray[np.uint8]:
    out = np.zeros((rows, width), np.uint8)
    out[: matrix.shape[0], : matrix.shape[1]] = matrix
    return out
