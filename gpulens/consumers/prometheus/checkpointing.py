"""The exporter's checkpoints: the series that changed and the offsets read, in a state log.

A restart restores the newest row of every series from ``gpulens.exporter.<group>.changelog``
(a :class:`~gpulens.schemas.kafka.state_log.StateLog`: its cost follows the live series, not the history)
and reads on from the offsets found there, instead of reading the topics from the beginning.

Format (documented, language-neutral), as the worker's changelogs: key = the UTF-8 JSON array
of the series key (see :mod:`gpulens.consumers.prometheus.state`: ``["gpus", "cluster-a", "node-7"]``)
or ``["offset", topic, partition]``; value = the row in the Confluent wire format (the bytes
it arrived as; its schema id names its writer schema), or the next offset to read as ASCII
digits; null when the series is gone.

No transaction: the state is the newest row per series, so applying a record again changes
nothing, and at-least-once is enough. One idempotent producer writes a checkpoint's rows
before its offsets (order kept on the one partition), so a checkpoint cut short by a kill
leaves rows at least as new as the offsets it did write, and reading on from those offsets
re-applies a few records harmlessly. The offsets are taken from the consumer's commit, which
first makes its dead letters durable: a record behind a checkpointed offset is in the state
or in the DLQ. The group's committed offsets are for the usual tools only; a restart trusts
the state log's, which always match its rows (an exporter of an older release committed
offsets without any state to go with them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from gpulens.consumers.prometheus.exceptions import ExporterError
from gpulens.consumers.prometheus.state import KIND_MODELS, LatestState, SeriesKey
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.state_log import Entries, StateLog
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import Record
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

Partition = tuple[str, int]

OFFSET = "offset"
"""First element of the key of a partition's next offset."""


@dataclass(frozen=True, slots=True)
class Restore:
    """What a start found in the state log."""

    series: int
    """Series loaded into the state."""
    offsets: dict[Partition, int]
    """Next offset to read per input partition (none: the partition was never checkpointed)."""
    records_read: int
    seconds: float


def state_log_topic(group_id: str) -> str:
    """The state log of the exporter whose consumer group is ``group_id``."""
    return f"gpulens.exporter.{group_id}.changelog"


class ExporterCheckpoint:
    """Writes the exporter's changed series and offsets to its state log, and reads them back."""

    def __init__(
        self, kafka: KafkaSettings, codec: AvroCodec, *, group_id: str, topics: Sequence[TopicSpec]
    ) -> None:
        self._log = StateLog(kafka, state_log_topic(group_id))
        self._kafka = kafka
        self._failed: KafkaError | None = None
        """The producer's fatal error, once it had one (its error callback says so)."""
        self._producer = self._new_producer()
        self._admin = AdminClient(kafka.librdkafka())
        """Cuts the state log behind its newest acknowledged snapshot."""
        self._codec = codec
        self._specs = {t.record: t for t in topics}
        self._offsets: dict[Partition, int] = {}
        self.written = 0
        """State records written since start (snapshots included)."""

    def restore(self, state: LatestState) -> Restore:
        """Load every checkpointed series into ``state``; the offsets to read on from."""
        self._log.create()
        restored = self._log.restore()
        series = 0
        for raw, value in restored.entries.items():
            key = tuple(json.loads(raw))
            if key[0] == OFFSET:
                self._offsets[(key[1], key[2])] = int(value)
                continue
            spec = self._specs.get(KIND_MODELS.get(key[0], Record))
            if spec is None:  # a kind this exporter no longer reads
                continue
            try:
                row = self._codec.decode(spec, value)
            except DecodeError as err:  # comes back with the series' next record
                log.warning("state log %s: %s not restored: %s", self._log.topic, key, err)
                continue
            state.load(key, row, value)
            series += 1
        return Restore(series, dict(self._offsets), restored.records_read, restored.seconds)

    def _new_producer(self) -> Producer:
        self._failed = None
        return Producer(
            self._kafka.producer(
                **{"enable.idempotence": True, "acks": "all", "linger.ms": 20, "error_cb": self._error}
            )
        )

    def _error(self, error: KafkaError) -> None:
        if error.fatal():
            self._failed = error

    def write(self, state: LatestState, offsets: dict[Partition, int]) -> int:
        """Write the series changed since the last call, then ``offsets``, and wait until the
        broker has them all; the records written (:class:`ExporterError` if it has not).

        A broker that lost records it had acknowledged (the embedded one after a SIGKILL)
        leaves the idempotent producer failed for good (OUT_OF_ORDER_SEQUENCE_NUMBER), and
        records of this or the last write may be lost with it: a new producer then writes a
        snapshot of every series and offset, instead of the exporter exiting."""
        try:
            written = self._write(state, offsets)
        except KafkaException as err:
            if not err.args[0].fatal():
                raise
            self._failed = err.args[0]
        if self._failed is None:
            return written
        log.warning(
            "state log %s: the producer failed (%s): a new one writes every series again",
            self._log.topic,
            self._failed.str(),
        )
        self._producer = self._new_producer()
        live = state.live()
        count = len(live) + len(self._offsets)
        self._log.snapshot(self._producer, lambda: self._everything(state, live), count)
        self._flushed()
        self.written += count
        return count

    def _everything(self, state: LatestState, live: Sequence[SeriesKey]) -> Entries:
        return [*self._rows(state, live), *_offset_entries(self._offsets)]

    def _write(self, state: LatestState, offsets: dict[Partition, int]) -> int:
        moved = {p: o for p, o in offsets.items() if self._offsets.get(p) != o}
        self._offsets.update(moved)
        changed = state.changed()
        written = self._snapshot_if_due(state, len(changed) + len(moved))
        if written is None:
            written = self._log.append(self._producer, [*self._rows(state, changed), *_offset_entries(moved)])
        self._flushed()
        self.written += written
        return written

    def _snapshot_if_due(self, state: LatestState, changes: int) -> int | None:
        """Write a snapshot in place of ``changes`` entries where one is due (it holds them);
        the records written, None where none is due."""
        if not self._log.snapshot_possible(changes):  # listing every live series each time would cost
            return None
        live = state.live()
        count = len(live) + len(self._offsets)
        if not self._log.snapshot_due(count, changes):
            return None
        self._log.snapshot(self._producer, lambda: self._everything(state, live), count)
        return count

    def _flushed(self) -> None:
        """Wait for the broker to have every record written, then cut the log behind its newest
        whole snapshot."""
        if self._producer.flush(30):
            raise ExporterError(f"state log {self._log.topic}: checkpoint not acknowledged within 30 s")
        if self._failed is None:
            self._log.cut(self._admin)

    def _rows(self, state: LatestState, keys: Sequence[SeriesKey] | set[SeriesKey]) -> Entries:
        """Rows as they arrived; one applied without its bytes is encoded, outside the state's
        lock (a scrape never waits for a checkpoint)."""
        return [
            (_key(key), held if held is None or isinstance(held, bytes) else self._encode(held))
            for key, held in state.rows(keys)
        ]

    def _encode(self, row: Record) -> bytes:
        return self._codec.encode(self._specs[type(row)], row)

    def close(self) -> None:
        self._producer.flush(10)


def _key(key: tuple[str | int, ...]) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


def _offset_entries(offsets: dict[Partition, int]) -> Iterator[tuple[bytes, bytes | None]]:
    for (topic, partition), offset in offsets.items():
        yield _key((OFFSET, topic, partition)), str(offset).encode()
