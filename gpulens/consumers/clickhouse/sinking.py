"""The ClickHouse sink: catalog topics in, rows of the tables out, at least once, stored once.

Records are decoded by :class:`~gpulens.schemas.kafka.consuming.DecodingConsumer` (undecodable ones go to
the DLQ with the reason), mapped to rows (:mod:`gpulens.consumers.clickhouse.rows`) and collected in
a batch bounded by rows and age. GPU sample batches (the bulk of the data) and device changes
(two per device at a cluster's start) are not decoded here: their Kafka values go to
ClickHouse as they are (``FORMAT AvroConfluent``, see
:data:`~gpulens.consumers.clickhouse.rows.DECODED_BY_CLICKHOUSE`), which decodes them about ten times
faster than the Python reader. A set of values ClickHouse refuses is split in halves and
retried; once a refused part is small, the Python decoder decides each of its records: a bad
one goes to the DLQ with that decoder's reason, exactly as when the sink decoded everything,
and the good ones are written as rows. GPU samples and every other topic are batched apart:
samples are written every ``batch_seconds``, the small tables (pods, workloads, containers,
nodes, their events) every ``state_batch_seconds``, since each write costs ClickHouse a part per
table however few rows it holds. A batch is written table by table, and the Kafka offsets of its
topics are committed only after ClickHouse accepted every insert (every topic's, when the other
batch holds nothing). A crash between the two re-delivers the batch: ReplacingMergeTree keys
(versions, event ids) store it once, and a retried insert carries the same
``insert_deduplication_token`` (built from the batch's topic/partition/offset ranges), which the
engine honours for these tables. A producer event whose ``event_id`` the sink saw recently
with other content is dead-lettered as ``conflicting-duplicate`` instead
(:mod:`gpulens.consumers.clickhouse.duplicates`): the first row stays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_STORED, Consumer, TopicPartition
from prometheus_client import Counter, Histogram

from gpulens.consumers.clickhouse.client import get_client, insert_rows_only
from gpulens.consumers.clickhouse.duplicates import CONFLICTING_DUPLICATE, DuplicateGuard
from gpulens.consumers.clickhouse.exceptions import SinkError, StatementError
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.consumers.clickhouse.peeking import array_length, leading_string
from gpulens.consumers.clickhouse.rows import DECODED_BY_CLICKHOUSE, SINK_TOPICS, Intake, Row, Table, rows_of
from gpulens.consumers.clickhouse.settings import ClickHouseSettings, SinkSettings
from gpulens.consumers.clickhouse.writing import TableWriter, retrying
from gpulens.schemas.kafka.consuming import ConsumeError, Decoded, DecodingConsumer, LagMonitor, Undecoded
from gpulens.schemas.kafka.retrying import retry_transient
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.sharding import UNSHARDED, Shard
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import GpuSampleBatch
from gpulens.schemas.model.topics import GPU_SAMPLES, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

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
REFUSED = Counter(
    "gpulens_sink_refused_inserts_total",
    "Sets of Avro values ClickHouse refused (split and retried, or decided record by record).",
    ["table"],
)
MISREAD = Counter(
    "gpulens_sink_misread_inserts_total",
    "Accepted Avro inserts in which ClickHouse read another number of records than it was sent.",
    ["table"],
)
DECIDED_HERE = 1_024
"""Records of a refused set at or below which the Python decoder decides each one: splitting
further costs two inserts per halving (milliseconds each, HTTP and parsing in the holder),
about what decoding a thousand records here costs (~10 µs each). With 64, junk spread through
the samples made nearly every record an insert of its own (the fuzz test's sink fell from
about 6,000 to 800 records/s)."""


@dataclass
class Batch:
    """Rows on their way to ClickHouse and the offset ranges they came from."""

    rows: dict[Table, list[Row]] = field(default_factory=dict)
    values: dict[Intake, list[Undecoded]] = field(default_factory=dict)
    """Records for ClickHouse to decode, per table that takes them."""
    firsts: dict[str, tuple[Intake, Undecoded]] = field(default_factory=dict)
    """The first of ``values`` with each event id, and its table."""
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    row_count: int = 0
    """Rows; those of a record ClickHouse decodes as its value says (at least one)."""
    started: float = 0.0

    def add(self, item: Decoded) -> None:
        for table, row in rows_of(item):
            self.rows.setdefault(table, []).append(row)
            self.row_count += 1
        self._count(item)

    def add_value(self, intake: Intake, item: Undecoded, key: str | None, rows: int) -> None:
        """Add a record that ``intake`` takes as it is (ClickHouse decodes it into about ``rows``
        rows); ``key``: its event id."""
        self.values.setdefault(intake, []).append(item)
        if key is not None:
            self.firsts.setdefault(key, (intake, item))
        self.row_count += rows
        self._count(item)

    def drop_first(self, key: str) -> None:
        """Take the first record with event id ``key`` out (it went to the DLQ; its offset stays)."""
        intake, item = self.firsts.pop(key)
        self.values[intake].remove(item)

    def _count(self, item: Decoded | Undecoded) -> None:
        if not self.ranges:
            self.started = time.monotonic()
        where = (item.topic, item.partition)
        first, _ = self.ranges.get(where, (item.offset, item.offset))
        self.ranges[where] = (first, item.offset)
        self.records[item.topic] = self.records.get(item.topic, 0) + 1

    def token(self, table: Table) -> str:
        """The insert deduplication token of ``table``'s rows: same records, same token."""
        spans = sorted(f"{t}/{p}/{first}-{last}" for (t, p), (first, last) in self.ranges.items())
        return event_id(table.name, *spans)

    def ready(self, rows: int, seconds: float) -> bool:
        """Holding ``rows`` rows, or a record ``seconds`` old."""
        return self.row_count >= rows or (bool(self.ranges) and time.monotonic() - self.started >= seconds)


class ClickHouseSink:
    """Runs the consume → map → insert → commit loop."""

    def __init__(
        self,
        consumer: DecodingConsumer,
        writer: TableWriter,
        settings: SinkSettings,
        *,
        native: dict[str, tuple[Intake, int]] | None = None,
        samples: frozenset[str] = frozenset({GPU_SAMPLES.name}),
    ) -> None:
        """``native``: topics whose values ClickHouse decodes, with where it takes them and the
        topic's own writer schema id (values under another id are decoded here). ``samples``:
        the topics of GPU samples (written every ``batch_seconds``; the others every
        ``state_batch_seconds``)."""
        self._consumer = consumer
        self._writer = writer
        self._settings = settings
        self._samples = Batch()
        """GPU samples, written every ``batch_seconds``."""
        self._state = Batch()
        """Every other topic's rows, written every ``state_batch_seconds``."""
        self._duplicates = DuplicateGuard(settings.duplicate_horizon)
        self._native = native or {}
        self._sample_topics = samples

    def run(self, stop: threading.Event) -> None:
        """Sink until ``stop`` is set, then write and commit the batch in hand."""
        try:
            while not stop.is_set():
                self.step()
            self.flush(wait=True)
        finally:
            self._consumer.close()

    def step(self, timeout: float = 0.2) -> None:
        """Poll once; write a batch when it is full or due (both once they hold
        ``batch_rows`` rows together)."""
        settings = self._settings
        held = self._samples.row_count + self._state.row_count
        room = min(max(settings.batch_rows - held, 1), 5_000)
        for item in self._consumer.poll_undecoded(self._native, room, timeout):
            if isinstance(item, Undecoded):
                self._add_value(item)
                continue
            conflict = self._duplicates.conflict(item.record, item.value)
            if conflict is None:
                self._batch_of(item.topic).add(item)
            else:
                self._consumer.dead_letter(item, CONFLICTING_DUPLICATE, conflict)
        full = self._samples.row_count + self._state.row_count >= settings.batch_rows
        if full or self._samples.ready(settings.batch_rows, settings.batch_seconds):
            self._flush_samples()
        if full or self._state.ready(settings.batch_rows, settings.state_batch_seconds):
            self._flush_state()

    def _batch_of(self, topic: str) -> Batch:
        return self._samples if topic in self._sample_topics else self._state

    def _is_samples(self, topic: str) -> bool:
        return topic in self._sample_topics

    def _is_state(self, topic: str) -> bool:
        return topic not in self._sample_topics

    def _add_value(self, item: Undecoded) -> None:
        """Batch ``item`` for ClickHouse to decode, unless it must be decoded here: written under
        another schema than the topic's own (ClickHouse reads fields by the table's names), or
        repeating an event id with other content (a conflict only if it decodes)."""
        intake, schema_id = self._native[item.topic]
        own = item.value[:1] == b"\0" and int.from_bytes(item.value[1:5]) == schema_id
        key = leading_string(item.value) if own and intake.checked else None
        if own and (key is None or not self._conflicts(key, item)):
            rows = 1 if intake.rows_after is None else array_length(item.value, intake.rows_after) or 1
            rows = min(rows, len(item.value))
            self._batch_of(item.topic).add_value(intake, item, key, rows)
            return
        decoded = self._consumer.decode(item)
        if decoded is None:  # in the DLQ with the decoder's reason
            if key is not None:
                self._duplicates.forget(key, item.value)
            return
        conflict = self._duplicates.conflict(decoded.record, decoded.value)
        if conflict is None:
            self._batch_of(decoded.topic).add(decoded)
        else:
            self._consumer.dead_letter(decoded, CONFLICTING_DUPLICATE, conflict)

    def _conflicts(self, key: str, item: Undecoded) -> bool:
        """Whether ``item`` repeats event id ``key`` with other content than a first record
        that decodes. A first of this batch is decoded here to know (ClickHouse has not seen it
        yet): one that does not decode goes to the DLQ now, as it would have when decoded, and
        ``item`` is the first instead. A first of an earlier batch decoded, or was forgotten."""
        if self._duplicates.conflict_of(key, item.value) is None:
            return False
        batch = self._batch_of(item.topic)
        first = batch.firsts.get(key)
        if first is None or self._consumer.decode(first[1]) is not None:
            return True
        batch.drop_first(key)
        self._duplicates.forget(key, first[1].value)
        return self._duplicates.conflict_of(key, item.value) is not None

    def flush(self, *, wait: bool = False) -> None:
        """Write both batches and commit everything polled."""
        self._flush_samples(wait=wait)
        self._flush_state(wait=wait)

    def _flush_samples(self, *, wait: bool = False) -> None:
        batch, self._samples = self._samples, Batch()
        self._write(batch, wait=wait, only=None if not self._state.ranges else self._is_samples)

    def _flush_state(self, *, wait: bool = False) -> None:
        batch, self._state = self._state, Batch()
        self._write(batch, wait=wait, only=None if not self._samples.ranges else self._is_state)

    def _write(self, batch: Batch, *, wait: bool, only: Callable[[str], bool] | None) -> None:
        """Write every table of ``batch``, then commit the offsets of the topics ``only`` takes
        (all, when the other batch holds nothing): in the background while sinking (a failed
        commit loses nothing: the records come again, and the insert tokens store them once),
        waiting for the broker's answer with ``wait`` (the last batch)."""
        if not batch.ranges:
            return
        for intake, items in batch.values.items():
            self._write_values(intake, items)
        for table, rows in batch.rows.items():
            self._writer.write(table, rows, token=batch.token(table))
        BATCH_ROWS.observe(batch.row_count)
        for topic, count in batch.records.items():
            RECORDS.labels(topic).inc(count)
        try:
            self._consumer.commit(wait=wait, only=only)
        except ConsumeError as err:
            # Stored but not committed: it comes again after a restart or rebalance, stored once.
            UNCOMMITTED.inc()
            log.warning("batch of %d rows stored, offsets not committed: %s", batch.row_count, err)

    def _write_values(self, intake: Intake, items: list[Undecoded]) -> None:
        """Have ClickHouse decode and store ``items``; a refused set is split in halves and each
        half retried, and the records of a small refused set are decided here one by one.

        The same records split the same way: a batch written again after a crash carries the
        same insert tokens, part for part.
        """
        parts = [items]
        while parts:
            part = parts.pop()
            token = _token(intake.table, part)
            try:
                read = self._writer.write_avro(
                    intake.table, [i.value for i in part], into=intake.into, token=token
                )
            except StatementError as err:
                REFUSED.labels(intake.table).inc()
                log.info("%d records refused by %s: %s", len(part), intake.table, err)
                if len(part) > DECIDED_HERE:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]
                else:
                    self._decide(intake.table, part)
                continue
            if read != len(part):  # a record read past its end into the next: never seen, counted
                MISREAD.labels(intake.table).inc()
                log.error("%s read %d records of %d sent (token %s)", intake.table, read, len(part), token)

    def _decide(self, table: str, items: list[Undecoded]) -> None:
        """Decode ``items`` here: the bad ones go to the DLQ with the decoder's reason, the rows
        of the good ones are written as the Python mapper makes them."""
        rows: dict[Table, list[Row]] = {}
        for item in items:
            decoded = self._consumer.decode(item)
            if decoded is None:
                key = leading_string(item.value)
                if key is not None:
                    self._duplicates.forget(key, item.value)
                continue
            for target, row in rows_of(decoded):
                rows.setdefault(target, []).append(row)
        for target, kept in rows.items():
            self._writer.write(target, kept, token=_token(f"{table}>{target.name}", items))


def _token(table: str, items: Sequence[Undecoded]) -> str:
    """The insert deduplication token of ``items`` going to ``table``: same records, same token."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for item in items:
        first, _ = spans.get((item.topic, item.partition), (item.offset, item.offset))
        spans[(item.topic, item.partition)] = (first, item.offset)
    return event_id(table, str(len(items)), *sorted(f"{t}/{p}/{a}-{b}" for (t, p), (a, b) in spans.items()))


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
    registry_url: str | None = None,
) -> None:
    """Migrate, then sink ``topics`` into ``clickhouse.database`` until ``stop`` is set.

    Waits (with the settings' backoff) for ClickHouse to answer before it starts. The
    ``shard`` of the group's sinks it is reads that shard's partitions of ``topics`` (all of
    them by default). With ``registry_url`` (the schema registry as ClickHouse reaches it),
    ClickHouse decodes the records of :data:`DECODED_BY_CLICKHOUSE` types; without it, the
    sink decodes everything.
    """
    backoff = settings.retry_backoff_s
    insert_rows_only()

    def connect() -> TableWriter:
        for line in migrate(clickhouse, samples_ttl_days=settings.samples_ttl_days):
            log.info("%s: %s", clickhouse.database, line)
        client = get_client(clickhouse, database=clickhouse.database)
        return TableWriter(client, backoff=backoff, stop=stop, registry_url=registry_url)

    writer = retrying(connect, operation="connect", backoff=backoff, stop=stop)
    group = group_id or settings.group_id
    start = [tp for tp in _every_partition(kafka, group, topics, stop) if shard.owns(tp.partition)]
    native = {
        t.name: (DECODED_BY_CLICKHOUSE[t.record], codec.schema_id(t))
        for t in topics
        if registry_url is not None and t.record in DECODED_BY_CLICKHOUSE
    }
    consumer = DecodingConsumer(
        kafka,
        codec,
        group_id=group,
        topics=topics,
        start=start,
        on_commit_failed=lambda _why: UNCOMMITTED.inc(),
    )
    log.info(
        "sinking %d partitions of %d topics (shard %s) into %s/%s; decoded by ClickHouse: %s",
        len(start), len(topics), shard, clickhouse.url, clickhouse.database, ", ".join(native) or "none",
    )  # fmt: skip
    lag = LagMonitor(kafka, group, start).start()
    try:
        samples = frozenset(t.name for t in topics if t.record is GpuSampleBatch)
        ClickHouseSink(consumer, writer, settings, native=native, samples=samples).run(stop)
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
