"""GPU sample batches of a whole fetch decoded at once, by column, with numpy.

The generated reader (:mod:`gpulens.schemas.wire.compiled_reader`) spends about 30 µs of Python on a batch
of 8 GPUs, the largest part of the worker's time on the sample path, building 9 model
instances of which the worker's operators read two fields per GPU. Here the bodies of a fetch
are read in lockstep: one numpy operation reads a field of every batch at once (a varint, a
string's length, a union's branch, a double), so the cost per call is fixed (about 130 field
steps for batches of 8 GPUs) and the cost per batch small (5-11 µs a batch of 8 GPUs in fetches
of 5,000 to 200, against 26-35 µs); only fetches of at least :data:`SMALLEST` batches take
this path.

Measured alternative: chDB's ``Avro`` input format (one container block of the fetch's bodies)
reads the columns in about 5 µs a batch, but its embedded server is one per process (a
connection held open here would refuse the sink's engine in the same process; one per call
costs about 60 ms), and building per-batch objects from its Arrow output cost about as much as
the generated reader.

It is sound, not complete, as the generated reader is: a batch comes out as
:class:`SampleColumns` only when it was written with the topic's own schema in the usual
encoding (one block of at most 64 samples, union branches 0 or 1), its strings are UTF-8, its values pass
every rule of the model (:mod:`gpulens.schemas.model.models`: lengths, bounds, finite numbers) and its body
ends exactly where the reading did. Any other batch is left to the exact path (``None``), which
decides, dead-letter reason included.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from gpulens.schemas.model.models import EARLIEST, LATEST, GpuSample, GpuSampleBatch
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

SMALLEST = 64
"""Fewest batches worth one columnar read: its fixed cost is about 1.2 ms a fetch (`python -m
bench.sample_decode`, batches of 8 GPUs, CPU µs a batch: 42.2 by column at 32 a fetch, 22.9 at 64,
13.4 at 128, 5.4 at 5,000; one by one through the generated reader 26-27 at any size). A batch
read by column also joins the runs the operators take at once."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LOWEST_MS, _BEYOND_MS = round(EARLIEST.timestamp() * 1000), round(LATEST.timestamp() * 1000)
_HEADER = 5
"""Confluent framing: magic byte and schema id."""
_MOST_NODES = 100_000
"""Nodes whose names :class:`NativeSampleDecoder` keeps to share (about 1 KB each with 8 GPUs);
past it they are forgotten and kept anew, whatever names the records make up."""
_MOST_GPUS = 64
"""Batches of more GPUs are left to the exact path: each GPU slot costs a read of every batch."""
_TEN = np.arange(10)
_SHIFTS = (np.arange(10) * 7).astype(np.uint64)


class SampleColumns(NamedTuple):
    """One GpuSampleBatch as the worker reads it: the batch's fields, and per GPU (in order) its
    ``device_id``, ``utilization_pct`` and ``memory_used_bytes``. ``value`` is the record's wire
    bytes: :meth:`batch` decodes the whole model where a reader needs it (republishing the batch,
    a dead letter)."""

    event_id: str
    cluster: str
    event_ms: int
    """Event time in epoch milliseconds, as the wire holds it (operators compare integers: the
    datetime was built per batch and turned back into milliseconds per operator, ``to_ms`` alone
    3.7 % of the worker)."""
    source: str
    node: str
    device_ids: list[str]
    utilizations: list[float | None]
    memories: list[int | None]
    """VRAM used (the idle split tells memory-idle GPUs by it)."""
    value: bytes
    codec: AvroCodec
    topic: TopicSpec

    @property
    def event_time(self) -> datetime:
        return _EPOCH + timedelta(milliseconds=self.event_ms)

    def batch(self) -> GpuSampleBatch:
        """The model, decoded exactly from the wire bytes."""
        return self.codec.decode(self.topic, self.value, GpuSampleBatch)


def readings(batch: GpuSampleBatch | SampleColumns) -> Iterable[tuple[str, float | None]]:
    """``(device_id, utilization_pct)`` of each GPU of a batch, in order, however it was read."""
    return zip(*columns(batch), strict=True)


def columns(batch: GpuSampleBatch | SampleColumns) -> tuple[list[str], list[float | None]]:
    """The device_ids and the utilizations of a batch's GPUs, in order, however it was read
    (a loop over whole columns makes one call per batch where it would make one per GPU)."""
    if isinstance(batch, SampleColumns):
        return batch.device_ids, batch.utilizations
    samples = batch.samples
    return [sample.device_id for sample in samples], [sample.utilization_pct for sample in samples]


def event_name(event: object) -> str:
    """The record type an event is, as messages name it (a batch read by column is a
    GpuSampleBatch)."""
    return GpuSampleBatch.__name__ if isinstance(event, SampleColumns) else type(event).__name__


def _kind(annotation: Any) -> str:
    text = str(annotation)
    return "double" if "float" in text else "long" if "int" in text else "string"


_OPTIONAL = [(name, _kind(info.annotation)) for name, info in GpuSample.model_fields.items()][2:]
"""The sample's optional fields after device_id and index, in order: (name, Avro type)."""
_UTILIZATION, _MEMORY = "utilization_pct", "memory_used_bytes"
_AT_MOST = {name: 100.0 for name, info in GpuSample.model_fields.items() if "le=100" in repr(info.metadata)}
_PAD = 16 + 11 * (len(_OPTIONAL) + 2)
"""Zero bytes after a fetch's bodies: past the furthest a bad body's reads go between two
strings (a sample's index and every optional field as a branch and a 10-byte varint)."""
if [name for name, _ in _OPTIONAL][:2] != [_UTILIZATION, _MEMORY] or list(_AT_MOST) != [_UTILIZATION]:
    raise RuntimeError("GpuSample changed: the columnar reader must follow it")


class _Lockstep:
    """Reading position and verdict of every body of a fetch, field by field.

    A body's position only moves forward, so one that ran past its end stays past it and the
    final check (position == end) refuses it: no read checks the end on its own. A string's
    length moves a position at most to ``beyond``, one byte past the fetch (past every end);
    the reads between two strings advance at most :data:`_PAD` bytes less a varint's, so every
    read, however bad the body, stays inside the padded buffer.
    """

    def __init__(self, blob: bytes, ends: np.ndarray, starts: np.ndarray) -> None:
        """``blob``: the bodies, then :data:`_PAD` zero bytes (joined with them: one copy)."""
        self.blob = blob
        self.buf = np.frombuffer(blob, dtype=np.uint8)
        self.beyond = len(blob) - _PAD + 1
        self.ends = ends
        self.pos = starts.copy()
        self.ok = np.ones(len(starts), dtype=bool)
        self.tens = as_strided(self.buf, shape=(len(self.buf) - 9, 10), strides=(1, 1))
        """The ten bytes from each position (a long varint's at most), one fancy index per read."""
        self.doubles = np.ndarray((len(self.buf) - 7,), dtype="<f8", buffer=self.buf, strides=(1,))
        """The little-endian double at each byte position (unaligned: numpy copies on indexing)."""

    def varint(self, active: np.ndarray) -> np.ndarray:
        """The zigzag long at each active body's position (rows with a bad one turn bad)."""
        first = self.buf[self.pos].astype(np.int64)
        value: np.ndarray = (first >> 1) ^ -(first & 1)
        longer = np.flatnonzero(active & (first >= 128))
        self.pos += active
        if len(longer):  # most varints here are one byte: the rest byte by byte
            grid = self.tens[self.pos[longer] - 1]
            more = grid >= 128
            size = np.argmin(more, axis=1) + 1
            bits = ((grid & 127).astype(np.uint64) << _SHIFTS) * (size[:, None] > _TEN)
            unsigned = np.bitwise_or.reduce(bits, axis=1)
            value[longer] = (unsigned >> np.uint64(1)).astype(np.int64) ^ -(unsigned & np.uint64(1)).astype(
                np.int64
            )
            self.pos[longer] += size - 1
            self.ok[longer[more.all(axis=1) | ((size == 10) & (grid[:, 9] > 1))]] = False
        return value

    def string(self, active: np.ndarray, *, nonempty: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of each active body's string (its UTF-8 is checked where it is decoded)."""
        length = self.varint(active)
        self.ok &= ~active | (length >= (1 if nonempty else 0))
        start = self.pos.copy()
        end = start + np.clip(length, 0, self.beyond)  # a garbage length cannot overflow
        np.minimum(end, self.beyond, out=self.pos, where=active)
        return start, end

    def branch(self, active: np.ndarray) -> np.ndarray:
        """Whether each active body's union holds a value (branch 1; branch 0 is null)."""
        tag = self.buf[self.pos]
        self.ok &= ~active | ((tag | 2) == 2)  # branch 0 or 1: zigzag 0 or 2
        holds: np.ndarray = active & (tag == 2)
        self.pos += active
        return holds

    def double(self, active: np.ndarray) -> np.ndarray:
        value: np.ndarray = self.doubles[self.pos]
        np.add(self.pos, 8, out=self.pos, where=active)
        return value


def _strings(blob: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[list[Any], bool]:
    """The strings at these spans of ``blob`` (None where one is not UTF-8), and whether all are."""
    spans = zip(starts.tolist(), ends.tolist(), strict=True)
    try:
        return [blob[s:e].decode() for s, e in spans], True
    except UnicodeDecodeError:
        return [_utf8(blob[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)], False


def _optional(column: tuple[np.ndarray, np.ndarray], rows: np.ndarray, kept: np.ndarray) -> list[Any]:
    """The values of an optional field of the kept samples, in order (None where it is null)."""
    values, present = column
    out = values[rows][kept].astype(object)
    out[~present[rows][kept]] = None
    listed: list[Any] = out.tolist()
    return listed


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


class NativeSampleDecoder:
    """Decodes the GpuSampleBatch values of one fetch by column (module docstring)."""

    def __init__(self, codec: AvroCodec, topic: TopicSpec) -> None:
        self._codec = codec
        self._topic = topic
        self._ours: dict[bytes, bool] = {}
        """Per framing header: whether it names the topic's own schema."""
        self._names: dict[str, tuple[str, str, str, list[str]]] = {}
        """Per node, the cluster, source, node and GPU ids of its last batch: a batch naming the
        same shares them. A worker holding batches for event time (a large cluster's start:
        75,000-200,000 at 100,000 GPUs) held a copy of each per batch: 1,950 bytes of objects
        a batch of 8 GPUs, 1,056 shared, for about 1 us more a batch (interning each string
        instead cost 2 us and left 1,221)."""

    def decode(self, values: Sequence[bytes]) -> list[SampleColumns | None]:
        """Per value, its columns, or None where the exact path must decode it."""
        out: list[SampleColumns | None] = [None] * len(values)
        taken = [i for i, value in enumerate(values) if self._ours_framed(value)]
        if len(taken) < SMALLEST:
            return out
        bodies = [memoryview(values[i])[_HEADER:] for i in taken]
        lengths = np.fromiter((len(b) for b in bodies), dtype=np.int64, count=len(bodies))
        ends = np.cumsum(lengths)
        read = _Lockstep(b"".join([*bodies, bytes(_PAD)]), ends, ends - lengths)
        every = np.ones(len(taken), dtype=bool)
        event_id = read.string(every)
        cluster = read.string(every, nonempty=True)
        event_ms = read.varint(every)
        read.ok &= (event_ms >= _LOWEST_MS) & (event_ms < _BEYOND_MS)
        source = read.string(every, nonempty=True)
        node = read.string(every, nonempty=True)
        count = read.varint(every)
        read.ok &= (count >= 0) & (count <= _MOST_GPUS)
        slots = int(count[read.ok].max(initial=0))
        device = np.zeros((len(taken), slots, 2), dtype=np.int64)
        utilization = np.full((len(taken), slots), np.nan)
        measured = np.zeros((len(taken), slots), dtype=bool)
        memory = np.zeros((len(taken), slots), dtype=np.int64)
        weighed = np.zeros((len(taken), slots), dtype=bool)
        for slot in range(slots):
            active = read.ok & (count > slot)
            if not active.any():
                break
            device[:, slot, 0], device[:, slot, 1] = read.string(active)
            read.ok &= ~active | (read.varint(active) >= 0)
            for name, kind in _OPTIONAL:
                present = read.branch(active)
                if kind == "double":  # NaN and infinities fail one of the two comparisons
                    value, upper = read.double(present), _AT_MOST.get(name)
                    good = (value >= 0) & (value < np.inf if upper is None else value <= upper)
                else:
                    value = read.varint(present)
                    good = value >= 0
                read.ok &= ~present | good
                if name == _UTILIZATION:
                    utilization[:, slot], measured[:, slot] = value, present
                elif name == _MEMORY:
                    memory[:, slot], weighed[:, slot] = value, present
        more = read.varint(read.ok & (count > 0))
        read.ok &= (count == 0) | (more == 0)
        read.ok &= read.pos == ends
        return self._columns(values, taken, read, (event_id, cluster, source, node), event_ms, count, device,
                             (utilization, measured), (memory, weighed), out)  # fmt: skip

    def _columns(
        self, values: Sequence[bytes], taken: list[int], read: _Lockstep, spans: tuple[Any, ...],
        event_ms: np.ndarray, count: np.ndarray, device: np.ndarray,
        utilization: tuple[np.ndarray, np.ndarray], memory: tuple[np.ndarray, np.ndarray],
        out: list[SampleColumns | None],
    ) -> list[SampleColumns | None]:  # fmt: skip
        blob, codec, topic = read.blob, self._codec, self._topic
        rows = np.flatnonzero(read.ok)
        decoded = [_strings(blob, a[rows], b[rows]) for a, b in spans]
        fields = [strings for strings, _ in decoded]
        times, counts = event_ms[rows].tolist(), count[rows]
        kept = np.arange(device.shape[1]) < counts[:, None]  # the samples each row has, in order
        device_ids, utf8 = _strings(blob, device[rows, :, 0][kept], device[rows, :, 1][kept])
        utf8 = utf8 and all(clean for _, clean in decoded)
        utilizations, memories = _optional(utilization, rows, kept), _optional(memory, rows, kept)
        firsts = np.concatenate(([0], np.cumsum(counts))).tolist()
        names = self._names
        if len(names) >= _MOST_NODES:
            names.clear()
        for at, row in enumerate(rows.tolist()):
            first, last = firsts[at], firsts[at + 1]
            if not utf8 and None in [f[at] for f in fields] + device_ids[first:last]:
                continue  # not UTF-8: the exact path refuses it
            index = taken[row]
            named = (fields[1][at], fields[2][at], fields[3][at], device_ids[first:last])
            known = names.get(named[2])
            if known == named:
                named = known
            else:
                names[named[2]] = named
            cluster, source, node, gpus = named
            out[index] = SampleColumns(
                fields[0][at], cluster, times[at], source, node, gpus,
                utilizations[first:last], memories[first:last], values[index], codec, topic,
            )  # fmt: skip
        return out

    def _ours_framed(self, value: bytes) -> bool:
        if len(value) <= _HEADER or value[0] != 0:
            return False
        head = value[:_HEADER]
        ours = self._ours.get(head)
        if ours is None:
            try:
                ours = self._ours[head] = self._codec.writes_committed(self._topic, int.from_bytes(head[1:]))
            except Exception:  # unknown id, registry away: the exact path says what it is
                return False
        return ours
