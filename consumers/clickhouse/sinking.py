"""The ClickHouse sink: catalog topics in, rows of the tables out, at least once, stored once.

Records are decoded by :class:`~schemas.consuming.DecodingConsumer` (undecodable ones go to
the DLQ with the reason), mapped to rows (:mod:`consumers.clickhouse.rows`) and collected in
a batch bounded by rows and age. A batch is written table by table, and the Kafka offsets of
everything in it are committed only after ClickHouse accepted every insert. A crash between
the two re-delivers the batch: ReplacingMergeTree keys (versions, event ids) store it once,
and a retried insert carries the same ``insert_deduplication_token`` (built from the batch's
topic/partition/offset ranges), which the engine honours for these tables. A producer event
whose ``event_id`` the sink saw recently with other content is dead-lettered as
``conflicting-duplicate`` instead (:mod:`consumers.clickhouse.duplicates`): the first row stays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_STORED, Consumer, TopicPartition
from prometheus_client import Counter, Histogram

from consumers.clickhouse.client import get_client
from consumers.clickhouse.duplicates import CONFLICTING_DUPLICATE, DuplicateGuard
from consumers.clickhouse.exceptions import SinkError
from consumers.clickhouse.migrating import migrate
from consumers.clickhouse.rows import SINK_TOPICS, Row, Table, rows_of
from consumers.clickhouse.settings import ClickHouseSettings, SinkSettings
from consumers.clickhouse.writing import TableWriter, retrying
from schemas.codec import AvroCodec
from schemas.consuming import ConsumeError, Decoded, DecodingConsumer, LagMonitor
from schemas.ids import event_id
from schemas.retrying import retry_transient
from schemas.settings import KafkaSettings
from schemas.sharding import UNSHARDED, Shard
from schemas.topics import TopicSpec

__all__ = ["Batch", "ClickHouseSink", "run_sink"]

log = logging.getLogger(__name__)

RECORDS = Counter("gpulens_sink_records_total", "Records the sink stored, by topic.", ["topic"])
BATCH_ROWS = Histogram(
    "gpulens_sink_batch_rows",
    "Rows per written batch (all tables).",
    buckets=(10, 100, 1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000),
)
UNCOMMITTED = Counter(
    "gpulens_sink_commit_failures_total", "Batches stored whose offsets could not be committed."
)


@dataclass
class Batch:
    """Rows on their way to ClickHouse and the offset ranges they came from."""

    rows: dict[Table, list[Row]] = field(default_factory=dict)
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    row_count: int = 0
    started: float = 0.0

    def add(self, item: Decoded) -> None:
        if not self.ranges:
            self.started = time.monotonic()
        for table, row in rows_of(item):
            self.rows.setdefault(table, []).append(row)
            self.row_count += 1
        where = (item.topic, item.partition)
        first, _ = self.ranges.get(where, (item.offset, item.offset))
        self.ranges[where] = (first, item.offset)
        self.records[item.topic] = self.records.get(item.topic, 0) + 1

    def token(self, table: Table) -> str:
        """The insert deduplication token of ``table``'s rows: same records, same token."""
        spans = sorted(f"{t}/{p}/{first}-{last}" for (t, p), (first, last) in self.ranges.items())
        return event_id(table.name, *spans)

    def ready(self, settings: SinkSettings) -> bool:
        """Full, or old enough to be written."""
        return self.row_count >= settings.batch_rows or (
            bool(self.ranges) and time.monotonic() - self.started >= settings.batch_seconds
        )


class ClickHouseSink:
    """Runs the consume → map → insert → commit loop."""

    def __init__(self, consumer: DecodingConsumer, writer: TableWriter, settings: SinkSettings) -> None:
        self._consumer = consumer
        self._writer = writer
        self._settings = settings
        self._batch = Batch()
        self._duplicates = DuplicateGuard(settings.duplicate_horizon)

    def run(self, stop: threading.Event) -> None:
        """Sink until ``stop`` is set, then write and commit the batch in hand."""
        try:
            while not stop.is_set():
                self.step()
            self.flush()
        finally:
            self._consumer.close()

    def step(self, timeout: float = 0.2) -> None:
        """Poll once; write the batch when it is full or due."""
        room = max(self._settings.batch_rows - self._batch.row_count, 1)
        for item in self._consumer.poll(min(room, 5_000), timeout):
            conflict = self._duplicates.conflict(item.record, item.value)
            if conflict is None:
                self._batch.add(item)
            else:
                self._consumer.dead_letter(item, CONFLICTING_DUPLICATE, conflict)
        if self._batch.ready(self._settings):
            self.flush()

    def flush(self) -> None:
        """Write every table of the batch, then commit its offsets."""
        batch, self._batch = self._batch, Batch()
        if not batch.ranges:
            return
        for table, rows in batch.rows.items():
            self._writer.write(table, rows, token=batch.token(table))
        BATCH_ROWS.observe(batch.row_count)
        for topic, count in batch.records.items():
            RECORDS.labels(topic).inc(count)
        try:
            self._consumer.commit()
        except ConsumeError as err:
            # Stored but not committed: it comes again after a restart or rebalance, stored once.
            UNCOMMITTED.inc()
            log.warning("batch of %d rows stored, offsets not committed: %s", batch.row_count, err)


def run_sink(
    kafka: KafkaSettings,
    codec: AvroCodec,
    clickhouse: ClickHouseSettings,
    settings: SinkSettings,
    stop: threading.Event,
    *,
    topics: Sequence[TopicSpec] = SINK_TOPICS,
    group_id: str | None = None,
    shard: Shard = UNSHARDED,
) -> None:
    """Migrate, then sink ``topics`` into ``clickhouse.database`` until ``stop`` is set.

    Waits (with the settings' backoff) for ClickHouse to answer before it starts. The
    ``shard`` of the group's sinks it is reads that shard's partitions of ``topics`` (all of
    them by default).
    """
    backoff = settings.retry_backoff_s

    def connect() -> TableWriter:
        for line in migrate(clickhouse, samples_ttl_days=settings.samples_ttl_days):
            log.info("%s: %s", clickhouse.database, line)
        client = get_client(clickhouse, database=clickhouse.database)
        return TableWriter(client, backoff=backoff, stop=stop)

    writer = retrying(connect, operation="connect", backoff=backoff, stop=stop)
    group = group_id or settings.group_id
    start = [tp for tp in _every_partition(kafka, group, topics, stop) if shard.owns(tp.partition)]
    consumer = DecodingConsumer(kafka, codec, group_id=group, topics=topics, start=start)
    log.info(
        "sinking %d partitions of %d topics (shard %s) into %s/%s",
        len(start), len(topics), shard, clickhouse.url, clickhouse.database,
    )  # fmt: skip
    lag = LagMonitor(kafka, group, start).start()
    try:
        ClickHouseSink(consumer, writer, settings).run(stop)
    finally:
        lag.stop()


def _every_partition(
    kafka: KafkaSettings, group: str, topics: Sequence[TopicSpec], stop: threading.Event
) -> list[TopicPartition]:
    """Every partition of ``topics``, from the group's committed offsets.

    Sinks are assigned their partitions, not subscribed: on the embedded broker a SIGKILLed
    group member is never expired, so a subscribed successor would wait for a rebalance
    forever; assigned, it resumes at once (several sinks of a group split them by shard).
    """
    consumer = Consumer(kafka.librdkafka(**{"group.id": group}))
    try:
        metadata = retry_transient(
            lambda: consumer.list_topics(timeout=30), operation="metadata", stop=stop
        ).topics
    finally:
        consumer.close()
    missing = [t.name for t in topics if t.name not in metadata]
    if missing:
        raise SinkError(f"topics missing: {', '.join(missing)}; run `gpulens topics create`")
    return [
        TopicPartition(t.name, p, OFFSET_STORED) for t in topics for p in sorted(metadata[t.name].partitions)
    ]
