"""A process's keyed state on one compacted partition, restorable at the cost of its live size.

A state log holds ``key -> value`` bytes. Writers append the entries that changed (a null value
deletes a key) and, from time to time, a *snapshot*: a marker record followed by every live
entry. Restoring starts at the newest committed snapshot and applies what follows, so it
reads about ``live size + changes since the snapshot`` records however long the log is:

- on Apache Kafka compaction also removes superseded records, but the restore does not rely
  on it: noida-db, the embedded broker, never compacts (measured: 300,000 writes over 100
  keys read back as 300,000 records 20 s later);
- a snapshot is written once the changes since the previous one, with those about to be
  written, outnumber the live entries (and at least ``min_between`` records), so the log's
  unread tail stays within about twice the live size. A snapshot holds every live value, so
  it is written *instead of* that write's changes: where every key changes at every write (the
  worker's per-workload usage at 100,000 GPUs), each write was the changes and then a snapshot
  of the same keys, twice the records;
- the newest complete snapshot is found by reading the partition backwards in growing spans
  from its end, so nothing older than it is read. A snapshot is complete once its closing
  marker follows its entries: a writer without transactions (the exporter) killed in the
  middle of one leaves it open, and the restore starts at the snapshot before (the open
  one's entries, being ordinary writes, are still applied in log order);
- once a snapshot is durable (its transaction committed, or its closing marker acknowledged)
  the writer *cuts* the log there: DeleteRecords of everything before its opening marker, so
  the broker holds about the live size too (noida-db keeps every record in memory: the
  changelogs were most of its 1.5 GB at 20,000 GPUs). Brokers refuse DeleteRecords on a topic
  that is only ``compact``; the log is ``compact,delete`` with no time or size retention, so
  nothing else is ever deleted. A log created before cuts is left whole (logged once).

Writes go through the caller's producer: a transactional producer puts them in the same
transaction as its outputs and input offsets, and a ``read_committed`` restore then sees a
state that matches those offsets exactly. Keys starting with ``\\x00`` are reserved.

A writer with many small entries a cycle may write them *packed*: one record, keyed
``\\x00batch:<unique id>``, holds a batch of entries in a format the writer owns and reads back
(the restore takes its ``unpack``). One produce call and one encoding per batch instead of per
entry (the worker's checkpoint: :mod:`gpulens.pipeline.checkpointing`). A batch applies its
entries in order, at its place in the log, so a log may mix batches and plain entries (a log
written before batches restores as it is). Batch keys are unique, so compaction never drops
one; the cuts behind each snapshot bound the log instead. Counts (snapshot policy, restore
cost) are in entries, whatever records hold them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, DeletedRecords, NewTopic

from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.topics import CUTTABLE_COMPACTED

log = logging.getLogger(__name__)

SNAPSHOT_MARKER = b"\x00snapshot"
"""Key of the record that opens a snapshot (its value: the snapshot's entry count, ASCII)."""

SNAPSHOT_END = b"\x00snapshot-end"
"""Key of the record that closes a complete snapshot (its value: the entry count, ASCII)."""

BATCH = b"\x00batch:"
"""Key prefix of a record holding a batch of entries (module docstring)."""

FIRST_SPAN = 4_096
"""Records read from the end before looking further back for a snapshot."""


class StateLogError(GPULensError):
    """A state log cannot be created or read."""


V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Restored(Generic[V]):
    """What a restore found."""

    entries: dict[bytes, V]
    """Live keys and their newest values (as stored, or as the writer's ``unpack`` read them)."""
    records_read: int
    """Records read to get there (the restore's cost)."""
    seconds: float
    from_snapshot: bool
    """Whether it started at a complete snapshot (else at the log's start: nothing written
    before the log's first record can be in it)."""


Entries = Iterable[tuple[bytes, bytes | None]]
Packed = tuple[bytes, int]
"""A batch record's value, packed by the writer, and how many entries it holds."""
Unpack = Callable[[bytes], Iterable[tuple[bytes, V | None]]]
"""The writer's reader of its batches: each entry's key and value (None: the key is gone)."""


class StateLog:
    """One state log: a compacted single-partition topic, written through a caller's producer."""

    def __init__(self, kafka: KafkaSettings, topic: str, *, min_between: int = 10_000) -> None:
        self.topic = topic
        self._kafka = kafka
        self._min_between = min_between
        self._since_snapshot = 0
        """Entries appended since the last snapshot (restored ones included)."""
        self._live_told = 0
        """The live count last given to :meth:`snapshot_due`."""
        self._opened: int | None = None
        """Offset of the newest snapshot's opening marker, once the broker has it."""
        self._cut_at: int | None = None
        """Offset of the opening marker of a snapshot whose closing marker the broker has too."""
        self._cuts_refused = False
        self._forced = False
        """The next write is a snapshot, however few changes preceded it (:meth:`snapshot_next`)."""
        self._batch_ids = itertools.count()
        self._batch_prefix = BATCH + f"{time.time_ns():x}-".encode()
        """Batch keys: unique across incarnations, so compaction never supersedes one."""

    def create(self, *, timeout: float = 30.0) -> None:
        """Create the topic if it does not exist (compacted, one partition)."""
        admin = AdminClient(self._kafka.librdkafka())
        future = admin.create_topics(
            [NewTopic(self.topic, 1, 1, config=dict(CUTTABLE_COMPACTED))], operation_timeout=timeout
        )
        try:
            future[self.topic].result(timeout)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise StateLogError(f"cannot create state log {self.topic}: {err.args[0].str()}") from err

    def append(self, producer: Producer, entries: Entries) -> int:
        """Write changed entries (``None``: the key is gone); the number written."""
        written = 0
        for key, value in entries:
            produce_with_backpressure(producer, self.topic, key=key, value=value)
            written += 1
        self._since_snapshot += written
        return written

    def append_packed(self, producer: Producer, batches: Iterable[Packed]) -> int:
        """Write batch records (module docstring); the number of entries they hold."""
        written = 0
        for value, count in batches:
            key = self._batch_prefix + str(next(self._batch_ids)).encode()
            produce_with_backpressure(producer, self.topic, key=key, value=value)
            written += count
        self._since_snapshot += written
        return written

    def snapshot_possible(self, changes: int = 0) -> bool:
        """Whether enough was appended since the last snapshot, with ``changes`` entries about to
        be, for one to be due at all: at least ``min_between`` entries, and the live count
        :meth:`snapshot_due` was last told (live sizes move slowly; counting 50,000 live keys at
        every cycle cost the worker 5 %)."""
        return self._forced or self._since_snapshot + changes >= max(self._min_between, self._live_told)

    def snapshot_next(self) -> None:
        """Make the next write a snapshot (until one is written: a restore decides again)."""
        self._forced = True

    def snapshot_due(self, live: int, changes: int = 0) -> bool:
        """Whether the changes since the last snapshot, with ``changes`` entries about to be
        written, outnumber the ``live`` entries: write a snapshot then, instead of those changes."""
        self._live_told = live
        return self._forced or self._since_snapshot + changes >= max(live, self._min_between)

    def snapshot(self, producer: Producer, live: Callable[[], Entries], count: int) -> None:
        """Write a snapshot of the ``count`` live entries (restores start here from now on)."""
        self.snapshot_packed(producer, lambda: [], count, plain=live)

    def snapshot_packed(
        self,
        producer: Producer,
        batches: Callable[[], Iterable[Packed]],
        count: int,
        *,
        plain: Callable[[], Entries] = lambda: (),
    ) -> None:
        """Write a snapshot of the ``count`` live entries, packed in ``batches`` (and ``plain``)."""
        produce_with_backpressure(
            producer, self.topic, key=SNAPSHOT_MARKER, value=str(count).encode(), on_delivery=self._marker
        )
        for key, value in plain():
            produce_with_backpressure(producer, self.topic, key=key, value=value)
        self.append_packed(producer, batches())
        produce_with_backpressure(
            producer, self.topic, key=SNAPSHOT_END, value=str(count).encode(), on_delivery=self._end
        )
        self._since_snapshot = 0
        self._forced = False

    def cut(self, admin: AdminClient) -> Future[DeletedRecords] | None:
        """Delete what precedes the newest snapshot the broker has whole; the deletion's future,
        None when there is nothing to cut. Call it once that snapshot is durable: after its
        transaction committed, or after a flush without one. The deletion runs in the
        background; a failure is logged and the next snapshot cuts."""
        offset, self._cut_at = self._cut_at, None
        if offset is None or self._cuts_refused:
            return None
        deleting = admin.delete_records([TopicPartition(self.topic, 0, offset)], request_timeout=30)
        (future,) = deleting.values()
        future.add_done_callback(self._cut_done)
        return future

    def forget_snapshot(self) -> None:
        """The snapshot written since the last cut was aborted with its transaction: never cut there."""
        self._opened = self._cut_at = None

    def _marker(self, err: KafkaError | None, message: Message) -> None:
        self._opened = message.offset() if err is None else None

    def _end(self, err: KafkaError | None, message: Message) -> None:
        if err is None and self._opened is not None:
            self._cut_at = self._opened
        self._opened = None

    def _cut_done(self, future: Future[DeletedRecords]) -> None:
        try:
            future.result()
        except KafkaException as err:
            if err.args[0].code() == KafkaError.POLICY_VIOLATION:
                self._cuts_refused = True
                log.warning(
                    "state log %s is cleanup.policy=compact only, created before logs were cut: it "
                    "keeps its history (set cleanup.policy=compact,delete to bound it)",
                    self.topic,
                )
            else:
                log.warning("state log %s: cut not made (the next snapshot cuts): %s", self.topic, err)

    @overload
    def restore(self, *, timeout: float = 30.0) -> Restored[bytes]: ...
    @overload
    def restore(self, *, unpack: Unpack[V], timeout: float = 30.0) -> Restored[bytes | V]: ...
    def restore(self, *, unpack: Unpack[V] | None = None, timeout: float = 30.0) -> Restored[bytes | V]:
        """The live entries as of the newest committed write (call after fencing older writers);
        batches are read with ``unpack`` (:class:`StateLogError` for one when there is none)."""
        started = time.monotonic()
        reader = Consumer(
            self._kafka.librdkafka(
                **{
                    "group.id": f"{self.topic}-restore",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                }
            )
        )
        try:
            low, high = reader.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=timeout)
            records: list[tuple[int, bytes, bytes | None]] = []
            start, span = high, FIRST_SPAN
            while start > low:
                begin = max(low, start - span)
                records[:0] = read_span(reader, TopicPartition(self.topic, 0, begin), start, timeout)
                start, span = begin, span * 4
                if _newest_complete(records) is not None:
                    break
        finally:
            reader.close()
        first = _newest_complete(records)
        entries: dict[bytes, bytes | V] = {}
        # Only entries written after the snapshot count towards the next one: counting the
        # snapshot's own made every restart write a full snapshot at its first commit.
        after_snapshot, tail = first is None, 0
        for _, key, value in records[first or 0 :]:
            if key in (SNAPSHOT_MARKER, SNAPSHOT_END):
                after_snapshot = after_snapshot or key == SNAPSHOT_END
                continue
            applied = 0
            if key.startswith(BATCH):
                if unpack is None:
                    raise StateLogError(f"state log {self.topic}: a batch record and no reader for it")
                for entry, unpacked in unpack(value or b""):
                    _apply(entries, entry, unpacked)
                    applied += 1
            else:
                _apply(entries, key, value)
                applied = 1
            if after_snapshot:
                tail += applied
        self._since_snapshot = tail
        restored = Restored(entries, len(records), time.monotonic() - started, first is not None)
        log.info(
            "state log %s: %d live entries restored from %d records in %.2f s",
            self.topic,
            len(entries),
            restored.records_read,
            restored.seconds,
        )
        return restored


def _apply(entries: dict[bytes, bytes | V], key: bytes, value: bytes | V | None) -> None:
    if value is None:
        entries.pop(key, None)
    else:
        entries[key] = value


def _newest_complete(records: list[tuple[int, bytes, bytes | None]]) -> int | None:
    """Index of the opening marker of the newest snapshot closed before the next one opens."""
    closed = False
    for i in range(len(records) - 1, -1, -1):
        key = records[i][1]
        if key == SNAPSHOT_END:
            closed = True
        elif key == SNAPSHOT_MARKER:
            if closed:
                return i
            closed = False
    return None


def read_span(
    reader: Consumer, partition: TopicPartition, end: int, timeout: float
) -> list[tuple[int, bytes, bytes | None]]:
    """Records of ``partition`` from its offset up to ``end`` (excluded) or the partition's end,
    as ``reader`` sees them (``read_committed``: aborted records and markers have none)."""
    topic, begin = partition.topic, partition.offset
    reader.assign([partition])
    out: list[tuple[int, bytes, bytes | None]] = []
    deadline = time.monotonic() + timeout
    while True:
        batch = reader.consume(10_000, 0.05)  # returns early only once it has all 10,000
        if not batch and time.monotonic() > deadline:
            raise StateLogError(
                f"{topic}/{partition.partition}: no data from offset {begin} within {timeout:g} s"
            )
        for message in batch:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                if error.fatal() or not error.retriable():
                    raise StateLogError(f"{topic}/{partition.partition}: {error.str()}")
                continue
            offset = message.offset() or 0
            if offset >= end:
                return out
            out.append((offset, message.key() or b"", message.value()))
        if batch:
            deadline = time.monotonic() + timeout
