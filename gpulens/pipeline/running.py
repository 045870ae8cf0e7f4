"""The stream worker: runs operators over the event topics in event time, exactly once.

Every cycle is one Kafka transaction holding the rows produced, the dead letters, the state
each operator changed and the input offsets (:mod:`gpulens.pipeline.checkpointing`), so a crash (even
SIGKILL) leaves either all of a cycle or none of it. A restart restores the operators' state
from their state logs and reads on from the checkpointed offsets: its cost follows the live
state, not the history, and the inputs' retention no longer bounds what state can hold. Only
a worker with no checkpoint at all (a new group) reads its inputs from the beginning.

Event time comes from the sources' watermarks (:mod:`gpulens.pipeline.event_time`): records are
released per cluster in event-time order once below the smallest watermark of its live sources
minus the allowed lateness; a state change older than what was already released is applied at
that instant and reported, never dropped; operators see a cluster's final watermark once every
source of it has sent its own. Clusters without watermarks fall back to the partition rule of
:mod:`gpulens.pipeline.merging`. A record whose event time is out of bounds (far ahead of the wall clock
and of its cluster, before 2000, or far behind what its cluster released: see
:class:`~gpulens.pipeline.event_time.EventTimeBounds`) is dead-lettered as ``event-time-out-of-bounds``
before it can move any clock.

Work per record is bounded: the windows a record's time closes (a day's gap on a large cluster
is millions of rows) come from the operators one window at a time (``Operator.advance``), are
published as they come, and the cycle is committed between two windows when it is full, the
record itself still counting as unprocessed; a restart gives it again and the operators close
only the windows left. A stop (SIGTERM) is checked between records and between windows: the
cycle in flight is aborted, so the worker exits within about one window's work, and a restart
redoes that cycle from the last commit.

GPU sample batches read by column that come one after another in a cluster's release go to the
operators as a run (at most :data:`RUN_MOST` within :data:`RUN_SPAN_MS`): an operator that
takes runs applies it at once, exactly as one by one (:class:`~gpulens.pipeline.operators.TakesSampleRuns`),
the others get its batches one by one. No commit falls inside a run; its span bounds the
windows it closes.

One worker owns every partition of its inputs: cluster-level windows need every pod of a
cluster. Scale-out is by processor, not by partition: each set of processors runs as a worker
of its own (its own ``--group``), and one worker group per output topic: two groups writing
the same outputs would both publish.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from itertools import islice
from typing import cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ListOffsetsResultInfo, OffsetSpec
from prometheus_client import Counter, Gauge

from gpulens.pipeline.alignment import Alignment
from gpulens.pipeline.checkpointing import Checkpoint, Stateful
from gpulens.pipeline.compaction import WriterCompaction
from gpulens.pipeline.event_time import DEFAULT_BOUNDS, EventClocks, EventTimeBounds
from gpulens.pipeline.exceptions import CycleAborted, LateEvent, PipelineError
from gpulens.pipeline.hanging_transactions import HangingTransactionReaper
from gpulens.pipeline.held_chunks import HeldChunks, PackedValue
from gpulens.pipeline.merging import EventTimeMerge, PartitionEnds, Stamped
from gpulens.pipeline.operators import INPUT_ORDER, Given, Operator, Row, TakesSampleRuns, WritesCompacted
from gpulens.pipeline.positions import InputPositions
from gpulens.pipeline.state_tables import Tombstone
from gpulens.pipeline.windows import event_time_ms, from_ms
from gpulens.schemas.kafka.consuming import NO_RESET, IdlePartitions, LagMonitor, resume_at_nearest
from gpulens.schemas.kafka.dead_letters import DeadLetterPublisher
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.retrying import is_transient, retry_transient, transient_failure
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.sharding import UNSHARDED, Shard
from gpulens.schemas.model.exceptions import DecodeError, DecodeFailure
from gpulens.schemas.model.models import (
    ContainerEvent,
    DeviceInventory,
    Event,
    NodeEvent,
    PodEvent,
    Watermark,
    WorkloadEvent,
)
from gpulens.schemas.model.topics import DLQ, GPU_SAMPLES, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.event_head import EventHeadReader
from gpulens.schemas.wire.sample_columns import NativeSampleDecoder, SampleColumns

log = logging.getLogger(__name__)


class _OffsetOnly:
    """Stands in the merge for a record no operator sees (a cluster another shard keeps, a
    source's watermark): only its offset counts."""


@dataclass(frozen=True, slots=True)
class _OutOfBounds:
    """A record whose event time is out of bounds: dead-lettered in its place, applied nowhere."""

    record: Event
    detail: str


class _AsBytes:
    """Stands in the merge for a record held as its wire bytes (``Stamped.value``) while many
    records are held, and decoded when released: a decoded pod, node or inventory record
    takes about 8.7 KB, its bytes about 600 B (a 100,000-GPU cluster's start held 150,000 records,
    1.4 GB of the worker's RSS). See :attr:`WorkerOptions.hold_decoded`."""


OFFSET_ONLY = _OffsetOnly()
AS_BYTES = _AsBytes()
RUN_MOST = 1_000
"""Most GPU sample batches in one run (:meth:`StreamWorker._process_run`)."""
RUN_SPAN_MS = 10_000
"""Longest event-time span of a run: what the windows it closes one by one (no commit between
them) may cost stays small."""
Input = Given | DecodeError | _OffsetOnly | _OutOfBounds | _AsBytes | PackedValue
"""What the merge holds: a record, or what stands for it until it is released (a GPU sample
batch held as its bytes: a :class:`PackedValue`, its bytes compressed with its neighbours')."""
STATE_CHANGES = (NodeEvent, PodEvent, WorkloadEvent, DeviceInventory, ContainerEvent)
"""Records that change state: never dropped as late (see ``StreamWorker._take``)."""

RESTORED = Gauge("gpulens_worker_restored_state_keys", "State keys restored from the state logs at start.")
CYCLES = Counter("gpulens_worker_cycles_total", "Cycles committed (one transaction each).")
CYCLE_SECONDS = Gauge(
    "gpulens_worker_cycle_seconds",
    "How long the current cycle lasts before its commit: cycle_s, stretched under load so that "
    "commits take about commit_share of the worker's wall time.",
)
COMMIT_SECONDS = Gauge("gpulens_worker_commit_seconds", "How long the last commit took.")
RECORDS_IN = Counter("gpulens_worker_records_in_total", "Records processed by the worker.", ["topic"])
ROWS_OUT = Counter("gpulens_worker_rows_out_total", "Rows published by the worker.", ["topic"])
BY_COLUMN = Counter(
    "gpulens_worker_sample_batches_by_column_total",
    "GPU sample batches read by column (the fast path: a fetch of 64 or more); the rest one by one.",
)
AS_BYTES_HELD = Counter(
    "gpulens_worker_records_held_as_bytes_total",
    "Records held as their wire bytes while many were held, decoded when released.",
)
PLACED_BY_HEAD = Counter(
    "gpulens_worker_records_placed_by_head_total",
    "Records held as bytes that were placed by their head alone (cluster, time, source), decoded "
    "only when released.",
)
LATE = Counter("gpulens_worker_late_events_total", "Events older than applied event time (sent to the DLQ).")
LATE_STATE = Counter(
    "gpulens_worker_late_state_changes_total",
    "State changes older than their cluster's released event time: applied at that time, not dropped.",
)
OUT_OF_BOUNDS = Counter(
    "gpulens_worker_event_time_out_of_bounds_total",
    "Records whose event time is out of bounds (sent to the DLQ as event-time-out-of-bounds).",
    ["topic"],
)
WAITING = Gauge(
    "gpulens_worker_buffered_records", "Records buffered until their cluster's event time passes them."
)
WAITING_PEAK = Gauge("gpulens_worker_buffered_records_peak", "The most records buffered at once since start.")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How the worker runs."""

    group_id: str = "gpulens-worker"
    idle_ms: int = 3_000
    """Clusters without watermarks: how long a partition at its end may stay quiet before the
    others go on without it."""
    source_timeout_s: float = 10.0
    """A source silent this long (wall time) stops holding its cluster's event time back."""
    allowed_lateness_ms: int = 0
    """Records are released this far behind their cluster's event time (from watermarks)."""
    hold_records: int = 50_000
    """Records held past which partitions running ahead in event time are paused
    (:mod:`gpulens.pipeline.alignment`)."""
    hold_decoded: int = 10_000
    """Records held decoded at most: past this many held (at the last step), a record decoded one
    by one is held as its bytes and decoded when released (:class:`_AsBytes`), placed by its head
    alone where its source is live (:meth:`StreamWorker._read`); GPU sample batches: see
    :attr:`hold_columns`."""
    hold_columns: int = 200_000
    """Records held past which GPU sample batches are held as their bytes too, placed by their
    heads and read by column when released (:meth:`StreamWorker._read_held_samples`)."""
    cycle_s: float = 1.0
    """Time between two transaction commits while commits are cheap."""
    commit_share: float = 0.1
    """Under load a cycle lasts at least its last commit's time divided by this, so that
    commits take about this share of the worker's wall time: at fleet scale every workload's usage
    changes every 2 s, and committing every second took a third of the worker's CPU at 50,000 GPUs."""
    cycle_max_s: float = 10.0
    """The longest a cycle stretches under load (outputs wait for their cycle's commit)."""
    cycle_records: int = 20_000
    """Records processed plus rows published that fill a cycle of :attr:`cycle_s` (a gap's rows
    count too); a cycle stretched under load holds as many more as it lasts longer
    (:meth:`records_for`)."""
    report_s: float = 10.0
    """How often progress is logged."""
    shard: Shard = UNSHARDED
    """Which clusters this worker keeps (by record key); every one by default."""
    bounds: EventTimeBounds = DEFAULT_BOUNDS
    """Event times the worker applies; records outside go to the DLQ."""
    hanging_transaction_s: float | None = 75.0
    """A transaction open this long on a partition the worker writes (its first record the
    partition's last stable offset all along, the broker answering) is aborted: a broker that
    forgot it (noida-db after a SIGKILL) never would. Above librdkafka's default
    ``transaction.timeout.ms`` (60 s), after which Apache Kafka aborts it itself. ``None``: left
    to the broker (a real Kafka's coordinator), and nothing is aborted at restore either."""
    compaction_min_rows: int = 0
    """Compacted topics the worker writes are compacted by it (:mod:`gpulens.pipeline.compaction`),
    a topic rewritten once the rows written since its last rewrite outnumber its live rows and
    this many; 0: never (the broker compacts). Unsharded workers only: it needs a sole writer."""

    def next_cycle_s(self, commit_s: float) -> float:
        """How long the cycle after a commit that took ``commit_s`` lasts: :attr:`cycle_s`, or
        ``commit_s / commit_share`` where that is longer, up to :attr:`cycle_max_s`."""
        return min(max(self.cycle_s, commit_s / self.commit_share), max(self.cycle_max_s, self.cycle_s))

    def records_for(self, cycle_s: float) -> int:
        """Records and rows that fill a cycle of ``cycle_s``: :attr:`cycle_records` per
        :attr:`cycle_s`. A count fixed at :attr:`cycle_records` cut every stretched cycle short at
        100,000 GPUs (20,000 records and rows came every 2 s, and each commit rewrote every
        workload's usage and every node's last sample: commits took a third of the worker)."""
        return round(self.cycle_records * cycle_s / self.cycle_s)


class StreamWorker:
    """Runs operators over their input topics, one transaction per cycle."""

    def __init__(
        self, kafka: KafkaSettings, codec: AvroCodec, operators: list[Operator], options: WorkerOptions
    ) -> None:
        self._codec = codec
        self._kafka = kafka
        self._options = options
        self._operators = operators
        wanted = {spec.name for op in operators for spec in op.inputs}
        self._inputs = tuple(spec for spec in INPUT_ORDER if spec.name in wanted)
        self._routes = {spec.name: [op for op in operators if spec in op.inputs] for spec in self._inputs}
        self._sample_route = [
            (op, op if isinstance(op, TakesSampleRuns) else None)
            for op in self._routes.get(GPU_SAMPLES.name, [])
        ]
        """The operators of the GPU samples, each with itself where it takes runs (asked once
        here, not per run: checking a runtime protocol is slow)."""
        self._columns = NativeSampleDecoder(codec, GPU_SAMPLES) if GPU_SAMPLES in self._inputs else None
        """Reads the GPU sample batches of a fetch by column (each other record one by one)."""
        self._heads = EventHeadReader(codec)
        """Reads what places a record held as bytes (:meth:`_read`)."""
        self._packed = HeldChunks()
        """Where GPU sample batches held as bytes wait, compressed (:meth:`_read_held_samples`)."""
        self._consumer = Consumer(
            kafka.streaming_consumer(
                **{
                    "group.id": options.group_id,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    # a checkpointed offset out of range resumes at the nearest valid one (_take)
                    "auto.offset.reset": NO_RESET,
                }
            )
        )
        partitions = self._partitions()
        self._fence(
            kafka,
            retry_transient(lambda: self._consumer.committed(partitions, timeout=30), operation="committed"),
        )
        self._incarnation = f"{options.group_id}-{uuid.uuid4().hex[:12]}"
        self._producer = Producer(
            kafka.producer(**{"transactional.id": self._incarnation, "linger.ms": 20, "acks": "all"})
        )
        self._dlq = DeadLetterPublisher(self._producer, codec, consumer=options.group_id)
        self._last_ms: dict[tuple[str, int], int] = {}
        self._ends = PartitionEnds([(tp.topic, tp.partition) for tp in partitions], drained=self._drained)
        self._admin = AdminClient(kafka.librdkafka())
        """Asks end offsets in the background (:meth:`_ask_ends`)."""
        self._asked_ends: tuple[int, dict[TopicPartition, Future[ListOffsetsResultInfo]]] | None = None
        """The end offsets asked for (:meth:`_ask_ends`): how many watermarks read they cover, an
        answer per partition."""
        self._merges: dict[str, EventTimeMerge[Input]] = {}
        self._clocks = EventClocks(
            source_timeout_s=options.source_timeout_s, allowed_lateness_ms=options.allowed_lateness_ms
        )
        self._shard = options.shard if options.shard.count > 1 else None
        self._rank = {spec.name: rank for rank, spec in enumerate(self._inputs)}
        self._specs = {spec.name: spec for spec in self._inputs}
        self._records_in = {spec.name: RECORDS_IN.labels(spec.name) for spec in self._inputs}
        self._rows_out: dict[str, Counter] = {}
        """ROWS_OUT's child per topic (``labels()`` per row was 1 % of the worker)."""
        self._positions = InputPositions()
        parts: dict[str, Stateful] = {op.name: op.state for op in operators}
        self._checkpoint = Checkpoint(
            kafka,
            self._producer,
            self._consumer,
            group_id=options.group_id,
            parts=parts | {"positions": self._positions, "clocks": self._clocks},
            hanging_transaction_s=options.hanging_transaction_s,
        )
        self._reaper = HangingTransactionReaper(
            kafka, options.group_id, after_s=options.hanging_transaction_s
        )
        self._reaper.watch([*self._checkpoint.topics, DLQ.name])
        self._written: set[str] = set()
        """Topics this worker has published to (watched for hanging transactions)."""
        self._compaction = self._writer_compaction(kafka, operators, options)
        self._compacted = self._compaction.names if self._compaction is not None else frozenset()
        started = time.monotonic()
        restored = self._checkpoint.restore()
        if self._compaction is not None:
            self._compaction.restore()
        RESTORED.set(restored)
        cold = not self._positions.restart
        self._fetched: dict[tuple[str, int], int] = {
            (tp.topic, tp.partition): self._positions.restart.get((tp.topic, tp.partition), 0)
            for tp in partitions
        }
        """Next offset to fetch per partition."""
        self._stamped_ms: dict[tuple[str, int], int] = {}
        """The latest timestamp of a record fetched per partition: what brings watermarks'
        barriers down (:meth:`EventClocks.settle`)."""
        self._consumer.assign(
            [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    OFFSET_BEGINNING if cold else self._fetched[(tp.topic, tp.partition)],
                )
                for tp in partitions
            ]
        )
        self._idle = IdlePartitions(self._consumer)
        self._alignment = Alignment(
            self._consumer, self._ends, self._last_ms, from_buffered=options.hold_records
        )
        self._producer.init_transactions(30)
        self._checkpoint.begin()
        self._pending = 0
        self._cycle_s = options.cycle_s
        """How long the current cycle lasts (:meth:`WorkerOptions.next_cycle_s`)."""
        self._cycle_records = options.cycle_records
        """What fills the current cycle (:meth:`WorkerOptions.records_for`)."""
        self._peak_buffered = 0
        self._buffered = 0
        """Records held at the end of the last step."""
        self._released: deque[Stamped[Input]] = deque()
        """Records the current merge released and not (fully) processed yet."""
        self.processed = 0
        """Records processed since start."""
        self.published = 0
        """Rows published since start."""
        self._reported = (time.monotonic(), 0)
        self._commit(claim=True)  # before this incarnation publishes anything
        if cold:
            log.info("worker %s: no checkpoint, reading the inputs from the beginning", options.group_id)
        else:
            log.info(
                "worker %s: restored %d state keys in %.2f s; reading on from the checkpointed offsets",
                options.group_id,
                restored,
                time.monotonic() - started,
            )

    def _writer_compaction(
        self, kafka: KafkaSettings, operators: list[Operator], options: WorkerOptions
    ) -> WriterCompaction | None:
        if not options.compaction_min_rows:
            return None
        if self._shard is not None:
            raise PipelineError("a sharded worker cannot compact the topics it writes: its shards share them")
        compacted = [spec for op in operators if isinstance(op, WritesCompacted) for spec in op.compacted]
        return WriterCompaction(kafka, compacted, min_rows=options.compaction_min_rows) if compacted else None

    def _fence(self, kafka: KafkaSettings, committed: list[TopicPartition]) -> None:
        """Abort what the previous incarnation left open, and stop it if it still runs.

        Each incarnation has its own transactional id, named in the metadata of the offsets it
        commits. A transactional id is never reused after a crash: noida-db keeps listing the
        aborted transaction in later fetches, and read_committed consumers positioned past it
        then skip every later record of that producer (measured: the rows of a restarted worker
        never reached a running sink).
        """
        for previous in sorted({tp.metadata for tp in committed if tp.metadata}):
            log.info("worker %s: fencing the previous incarnation %s", self._options.group_id, previous)
            Producer(kafka.producer(**{"transactional.id": previous})).init_transactions(30)

    def _drained(self, partition: tuple[str, int]) -> bool:
        """At its end; a broker that does not answer in time leaves it not drained for now."""
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(*partition), timeout=5, cached=False
            )
        except KafkaException as err:
            if not is_transient(err):
                raise
            transient_failure("end offset", err)
            return False
        return bool(high <= self._fetched.get(partition, 0))

    def _ask_ends(self) -> None:
        """Ask the broker, in the background and in one request, for every input partition's end
        offset: the barrier of the watermarks read so far (:meth:`_take_ends`). Asked in line, one
        partition at a time, it took 5 % of the worker's wall time at 100,000 GPUs."""
        covers = self._clocks.asking_ends()
        wanted = {TopicPartition(t, p): OffsetSpec.latest() for t, p in self._ends.since}
        try:
            answers = self._admin.list_offsets(wanted, request_timeout=5)
        except KafkaException as err:
            if not is_transient(err):
                raise
            transient_failure("end offsets", err)
            return
        self._asked_ends = (covers, answers)

    def _take_ends(self) -> None:
        """Give the clocks the broker's end offsets, once they have come back: the barrier of the
        watermarks read before they were asked for (none, where the broker did not answer in
        time: they are asked for again)."""
        if self._asked_ends is None or not all(f.done() for f in self._asked_ends[1].values()):
            return
        covers, answers = self._asked_ends
        self._asked_ends = None
        try:
            ends = {(tp.topic, tp.partition): answer.result().offset for tp, answer in answers.items()}
        except KafkaException as err:
            if not is_transient(err):
                raise
            transient_failure("end offsets", err)
            return
        self._clocks.barrier(ends, covers=covers)

    def _partitions(self) -> list[TopicPartition]:
        metadata = retry_transient(
            lambda: self._consumer.list_topics(timeout=30), operation="metadata"
        ).topics
        missing = [spec.name for spec in self._inputs if spec.name not in metadata]
        if missing:
            raise PipelineError(f"input topics missing: {', '.join(missing)}; run `gpulens topics create`")
        return [
            TopicPartition(spec.name, p)
            for spec in self._inputs
            for p in sorted(metadata[spec.name].partitions)
        ]

    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set; commits what was processed before returning."""
        partitions = [TopicPartition(t, p) for t, p in self._ends.since]
        lag = LagMonitor(self._kafka, self._options.group_id, partitions).start()
        reaper = self._reaper.start()
        try:
            while not stop.is_set():
                if not self.step(stop=stop):
                    self._abort(stop)
                    return
            self._commit(stop=stop)
        except KafkaException as err:
            if not stop.is_set() or not is_transient(err):
                raise
            log.warning("stopping with the broker away (%s): a restart redoes the open cycle", err)
        finally:
            reaper.stop()
            lag.stop()
            self._consumer.close()

    def step(self, timeout: float = 0.2, *, stop: threading.Event | None = None) -> bool:
        """Fetch, merge, process what is ready, and commit when the cycle is full or old.

        False when ``stop`` was set before the records released were all processed: the cycle
        in flight is then half done, and the caller must abort it (:meth:`run` does).
        """
        messages = self._consumer.consume(self._idle.batch(self._alignment.fetch_size), timeout)
        for message, columns in zip(messages, self._read_samples(messages), strict=True):
            self._take(message, columns)
        self._packed.seal()
        self._idle.tick()
        if self._asked_ends is None and self._clocks.wants_barrier:
            self._ask_ends()
        self._take_ends()
        self._clocks.settle(self._fetched, self._stamped_ms)
        for cluster, merge in list(self._merges.items()):
            # Processed records leave at once: a start or a catch-up releases tens of thousands
            # (each with its wire bytes), and holding them all until the end of the release
            # raised the worker's peak, which its heap then keeps.
            items = self._released = deque(merge.release(self._clocks.limit(cluster)))
            # A source's watermark is the worker's business; operators hear only the end of a
            # cluster: the last final watermark, once every source of it has sent one.
            ends_cluster = bool(items) and self._clocks.ended(cluster)
            while items:
                if stop is not None and stop.is_set():
                    return False
                if type(items[0].record) is PackedValue:
                    self._read_held_samples(items)
                end = self._run_end(items)
                if end > 1:
                    if not self._process_run(list(islice(items, end)), cluster, stop):
                        return False
                else:
                    item = items[0]
                    if isinstance(item.record, Watermark) and not (
                        ends_cluster and len(items) == 1 and item.record.final
                    ):
                        item = replace(item, record=OFFSET_ONLY)
                    self._clocks.released(cluster, item.event_ms)
                    if not self._process(item, cluster, stop):
                        return False
                for _ in range(end):
                    items.popleft()
                if self._cycle_full():  # mid-release too: a catch-up's rows come out as it goes
                    self._commit(stop=stop)
        buffered = self._buffered = sum(m.buffered for m in self._merges.values())
        WAITING.set(buffered)
        if buffered > self._peak_buffered:
            self._peak_buffered = buffered
            WAITING_PEAK.set(buffered)
        self._alignment.tick(buffered, waiting=self._clocks.starting)
        if self._alignment.paused:
            self._clocks.hold_silence()
        if self._pending and time.monotonic() - self._cycle_started >= self._cycle_s:
            self._commit(stop=stop)
        return True

    def _cycle_full(self) -> bool:
        """The cycle holds enough or is old enough to commit. Asked per record: a restart
        catching up releases tens of thousands of records at once, and a cycle that waited for
        the end of them kept its rows from readers until then (10,000 GPUs: 9 s)."""
        return self._pending >= self._cycle_records or time.monotonic() - self._cycle_started >= self._cycle_s

    def _report(self) -> None:
        now, before = time.monotonic(), self._reported
        rate = (self.processed - before[1]) / max(now - before[0], 1e-9)
        waiting = [f"{t}/{p}" for (t, p), since in self._ends.since.items() if since is None]
        log.info(
            "processed %d records (%.0f/s), published %d rows, %d buffered, cycle %.1f s%s",
            self.processed,
            rate,
            self.published,
            sum(m.buffered for m in self._merges.values()),
            self._cycle_s,
            f", waiting on {', '.join(waiting[:5])}" if waiting else "",
        )
        self._reported = (now, self.processed)

    def _read_samples(self, messages: list[Message]) -> list[SampleColumns | None]:
        """Per message, its GPU sample batch read by column where the fetch holds enough of them
        (None: decoded one by one, as every other record). Past ``hold_columns`` records held,
        none: they are held as their bytes, placed by their heads, and read by column when
        released (:meth:`_read_held_samples`)."""
        decoded: list[SampleColumns | None] = [None] * len(messages)
        if self._columns is None or (self._buffered >= self._options.hold_columns and self._shard is None):
            return decoded
        shard = self._shard
        at = [
            i
            for i, m in enumerate(messages)
            if m.topic() == GPU_SAMPLES.name
            and m.error() is None
            and (shard is None or shard.owns_key(m.key()))
        ]
        by_column = 0
        for i, columns in zip(
            at, self._columns.decode([messages[i].value() or b"" for i in at]), strict=True
        ):
            decoded[i] = columns
            by_column += columns is not None
        BY_COLUMN.inc(by_column)
        return decoded

    def _take(self, message: Message, columns: SampleColumns | None = None) -> None:
        # interned: each call gives a new string, and a start holds 190,000 records (80 B each)
        topic, partition = sys.intern(message.topic() or ""), message.partition() or 0
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._fetched[(topic, partition)] = message.offset() or 0
                self._ends.reached((topic, partition))
                self._idle.at_end(topic, partition)
                return
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                offset = resume_at_nearest(
                    self._consumer,
                    message,
                    group=self._options.group_id,
                    unknown=lambda t, p: self._fetched[(t, p)],
                )
                if offset < self._fetched[(topic, partition)]:
                    self._positions.rewound(topic, partition, offset)
                self._fetched[(topic, partition)] = offset
                self._stamped_ms.pop((topic, partition), None)  # what it vouched for is read again
                return
            if not is_transient(error):
                raise PipelineError(f"{topic}/{partition}: {error.str()}")
            log.warning("transient consume error: %s", error.str())
            return
        offset = message.offset() or 0
        hold_decoded = self._options.hold_decoded
        self._fetched[(topic, partition)] = offset + 1
        stamp_ms = message.timestamp()[1]  # -1 where the record has none: it vouches for nothing
        if stamp_ms > self._stamped_ms.get((topic, partition), -1):
            self._stamped_ms[(topic, partition)] = stamp_ms
        self._idle.received(topic, partition)
        record: Input
        key = message.key()
        try:
            if self._shard is not None and not self._shard.owns_key(key):
                record, event_ms, cluster = OFFSET_ONLY, self._last_ms.get((topic, partition), 0), ""
            else:
                spec = self._specs[topic]
                record, event_ms, cluster, source = self._read(spec, message, columns)
                beyond = self._options.bounds.violation(
                    event_ms,
                    now_ms=round(time.time() * 1000),
                    newest_ms=self._clocks.newest_ms(cluster),
                    released_ms=self._clocks.released_ms(cluster),
                    watermark=isinstance(record, Watermark),
                )
                if beyond is not None:  # it moves no clock and keeps its partition's place
                    record = _OutOfBounds(self._exact(record, spec, message), beyond)
                    event_ms = self._last_ms.get((topic, partition), 0)
                elif isinstance(record, Watermark):
                    self._last_ms[(topic, partition)] = event_ms
                    kind, produced_ms = message.timestamp()
                    self._clocks.watermark(
                        cluster, record.source, event_ms, final=record.final,
                        produced_ms=produced_ms if kind == TIMESTAMP_CREATE_TIME else None,
                    )  # fmt: skip
                else:
                    self._last_ms[(topic, partition)] = event_ms
                    self._clocks.heard(cluster, source)
                    released = self._clocks.released_ms(cluster)
                    if (
                        released is not None
                        and event_ms < released
                        and issubclass(spec.record, STATE_CHANGES)
                    ):
                        record, event_ms = _restamp(self._exact(record, spec, message), released), released
                    elif record is AS_BYTES or (columns is None and self._buffered >= hold_decoded):
                        record = AS_BYTES  # placed by its head, or dropped to its bytes
                        AS_BYTES_HELD.inc()
        except DecodeError as err:
            record, event_ms, cluster = err, self._last_ms.get((topic, partition), 0), ""
        if self._positions.seen(cluster, topic, partition, offset):
            return  # processed before the restart (another cluster held the restart offset back)
        value = message.value()
        if record is AS_BYTES and topic == GPU_SAMPLES.name:  # its bytes compressed with its neighbours'
            record, value = self._packed.hold(topic, partition, value or b""), None
        stamped = Stamped(event_ms, self._rank[topic], partition, offset, topic, record, key, value)
        if not cluster:
            # An undecodable record, or another shard's: no clock orders it, so it is dead-lettered
            # or passed over now (it waited for every partition's end in a merge of its own: 200,000
            # junk records stalled the worker for a minute). The offset committed past it still
            # never skips a record of another cluster waiting in its merge (see _commit).
            self._process(stamped, cluster, None)
            return
        merge = self._merges.get(cluster)
        if merge is None:
            merge = self._merges[cluster] = EventTimeMerge(self._ends, idle_ms=self._options.idle_ms)
        merge.add(stamped)

    def _read(
        self, spec: TopicSpec, message: Message, columns: SampleColumns | None
    ) -> tuple[Input, int, str, str]:
        """The record fetched (AS_BYTES where its head alone was read), its event time, cluster
        and source. Past ``hold_decoded`` records held (for a GPU sample batch, the lower of it
        and ``hold_columns``), a record is held as its bytes and decoded when released, so its
        head is all that is read now (:mod:`event_head`)."""
        value = message.value() or b""
        limit = self._options.hold_decoded
        if spec is GPU_SAMPLES:  # a batch not read by column (past hold_columns, or a fetch of
            # too few) is placed by its head, not decoded in full and then dropped to its bytes
            limit = min(limit, self._options.hold_columns)
        if columns is None and self._buffered >= limit and self._shard is None:
            head = None if spec.record is Watermark else self._heads.read(spec, value)
            # Only a live source's: the record may yet be refused, and must not have made its
            # source known, revived it or kept its cluster from ending (a final watermark sent).
            if head is not None and self._clocks.hears(head.cluster, head.source):
                PLACED_BY_HEAD.inc()
                return AS_BYTES, head.event_ms, head.cluster, head.source
        # The worker reads only its operators' inputs: event topics, so a record is an Event.
        record = columns if columns is not None else cast(Event, self._codec.decode(spec, value))
        if self._shard is not None:
            _check_key(message.key(), record)
        return record, event_time_ms(record), record.cluster, record.source

    def _exact(self, record: Input, spec: TopicSpec, message: Message) -> Event:
        """``record`` as its model: a batch read by column as one, one held as bytes decoded."""
        if isinstance(record, SampleColumns):
            return record.batch()
        if record is AS_BYTES:
            return cast(Event, self._codec.decode(spec, message.value() or b""))
        assert isinstance(record, Event)  # what a record read is when not held as bytes
        return record

    def _process(self, item: Stamped[Input], cluster: str, stop: threading.Event | None) -> bool:
        """Process one released record; False when ``stop`` came while its windows closed."""
        record = item.record
        self.processed += 1
        self._pending += 1
        if record is AS_BYTES:  # placed by its head, or decoded once when fetched: decoded now
            record = self._held(item.topic, item.value or b"")
        if record is OFFSET_ONLY:
            self._positions.processed(cluster, item.topic, item.partition, item.offset)
            return True
        self._records_in[item.topic].inc()
        if isinstance(record, DecodeError | _OutOfBounds):
            self._dead_letter(item, record)
            self._positions.processed(cluster, item.topic, item.partition, item.offset)
            return True
        assert isinstance(record, Event | SampleColumns)
        if isinstance(record, Watermark) and record.final:
            log.info(
                "final watermark of cluster %s at %s: closing its windows", record.cluster, record.event_time
            )
        operators = self._routes[item.topic]
        for operator in operators:
            for window in operator.advance(record):
                self._publish(operator, window)
                if stop is not None and stop.is_set():
                    return False
                if self._cycle_full():
                    self._commit(stop=stop)  # between two windows, this record still unprocessed
        late: LateEvent | None = None
        for operator in operators:
            late = self._apply(operator, record) or late
        if late is not None:
            LATE.inc()
            self._dlq.send_read(item, "late-event", str(late))
        self._positions.processed(cluster, item.topic, item.partition, item.offset)
        return True

    def _read_held_samples(self, items: deque[Stamped[Input]]) -> None:
        """Decode the GPU sample batches held as bytes among the next :data:`RUN_MOST` records
        released: by column in one call, each one the columns refuse in full (its model, or
        the DecodeError that dead-letters it), so that none is looked at twice. Each keeps its
        bytes again, for a dead letter.

        Held as columns, a batch of 8 GPUs took about 2.6 KB of the worker, against about 1.6 KB
        as its bytes and 0.9 KB compressed (:mod:`~gpulens.pipeline.held_chunks`); a worker
        digesting the start of 100,000 GPUs held up to 190,000 records, most of them sample
        batches."""
        held = [
            (i, item) for i, item in enumerate(islice(items, RUN_MOST)) if type(item.record) is PackedValue
        ]
        assert self._columns is not None  # a batch is held as bytes only where the worker reads samples
        values = [cast(PackedValue, item.record).value() for _, item in held]
        columns = self._columns.decode(values)
        by_column = 0
        for (i, item), value, read in zip(held, values, columns, strict=True):
            by_column += read is not None
            record = read if read is not None else self._held(item.topic, value)
            # built, not dataclasses.replace, which costs twice as much (a start holds 190,000)
            items[i] = Stamped(item.event_ms, item.rank, item.partition, item.offset, item.topic, record,
                               item.key, value)  # fmt: skip
        BY_COLUMN.inc(by_column)

    def _held(self, topic: str, value: bytes) -> Event | DecodeError:
        """A record held as its bytes, decoded now: only its head was read, so the rest may be
        refused now (the DecodeError, to dead-letter)."""
        try:
            return cast(Event, self._codec.decode(self._specs[topic], value))
        except DecodeError as err:
            return err

    def _run_end(self, items: deque[Stamped[Input]]) -> int:
        """Where the run of GPU sample batches read by column that starts ``items`` ends
        (excluded): at most :data:`RUN_MOST` of them within :data:`RUN_SPAN_MS` of event time;
        1 when no run starts there."""
        if type(items[0].record) is not SampleColumns:
            return 1
        end, limit = 1, min(len(items), RUN_MOST)
        until = items[0].event_ms + RUN_SPAN_MS
        while end < limit and type(items[end].record) is SampleColumns and items[end].event_ms <= until:
            end += 1
        return end

    def _process_run(self, run: list[Stamped[Input]], cluster: str, stop: threading.Event | None) -> bool:
        """Process a run of one cluster's GPU sample batches (:meth:`_run_end`): each operator
        that can takes the whole run at once (:class:`~gpulens.pipeline.operators.TakesSampleRuns`),
        the others get the batches one by one, windows first, as :meth:`_process` gives them.
        The cycle is not committed within a run: the windows its span closes are few. False
        when ``stop`` came while windows closed."""
        batches = [cast(SampleColumns, item.record) for item in run]
        self._clocks.released(cluster, run[-1].event_ms)
        late: dict[int, LateEvent] = {}
        for operator, takes_runs in self._sample_route:
            rows = takes_runs.process_samples(batches) if takes_runs is not None else None
            if rows is not None:
                self._publish(operator, rows)
                continue
            for index, batch in enumerate(batches):
                for window in operator.advance(batch):
                    self._publish(operator, window)
                    if stop is not None and stop.is_set():
                        return False
                error = self._apply(operator, batch)
                if error is not None:
                    late.setdefault(index, error)
        self.processed += len(run)
        self._pending += len(run)
        self._records_in[GPU_SAMPLES.name].inc(len(run))
        for index, error in sorted(late.items()):
            LATE.inc()
            self._dlq.send_read(run[index], "late-event", str(error))
        for item in run:
            self._positions.processed(cluster, item.topic, item.partition, item.offset)
        return True

    def _apply(self, operator: Operator, record: Given) -> LateEvent | None:
        """Publish the rows ``record`` itself causes in ``operator`` (its windows closed first);
        the LateEvent the operator raised instead, if it did."""
        try:
            rows = operator.process(record)
        except LateEvent as err:
            return err
        self._publish(operator, rows)
        return None

    def _dead_letter(self, item: Stamped[Input], record: DecodeError | _OutOfBounds) -> None:
        if isinstance(record, DecodeError):
            reason, detail = record.reason.value, record.detail
        else:
            OUT_OF_BOUNDS.labels(item.topic).inc()
            event = record.record
            reason = "event-time-out-of-bounds"
            detail = f"{type(event).__name__} {event.event_id} of cluster {event.cluster}: {record.detail}"
        self._dlq.send_read(item, reason, detail)

    def _publish(self, operator: Operator, rows: Iterable[Row]) -> None:
        for row in rows:
            spec = operator.output(row)
            self._produce(spec, row)
            counted = self._rows_out.get(spec.name)
            if counted is None:
                counted = self._rows_out[spec.name] = ROWS_OUT.labels(spec.name)
            counted.inc()
            self.published += 1
            self._pending += 1

    def _produce(self, spec: TopicSpec, row: Row) -> None:
        if isinstance(row, Tombstone):
            key, value = row.key, None
        elif isinstance(row, SampleColumns):  # republished as read
            key, value = record_key(spec, row), self._codec.reframe(row.topic, spec, row.value)
        else:
            key, value = record_key(spec, row), self._codec.encode(spec, row)
        if spec.name in self._compacted:
            cast(WriterCompaction, self._compaction).wrote(spec.name, key, value)
        if spec.name not in self._written:
            self._written.add(spec.name)
            self._reaper.watch([spec.name])
        produce_with_backpressure(self._producer, spec.name, key=key, value=value)

    def _commit(self, *, claim: bool = False, stop: threading.Event | None = None) -> None:
        """Commit the cycle, waiting while the broker is away (until ``stop``); ``claim``: name
        this incarnation in every partition's offsets."""
        restart = dict(self._fetched)
        for merge in self._merges.values():
            for partition, first in merge.first_offsets().items():
                restart[partition] = min(restart[partition], first)
        for item in self._released:
            partition = (item.topic, item.partition)
            restart[partition] = min(restart[partition], item.offset)
        moved = self._positions.advance(restart)
        offsets = restart if claim else moved
        started = time.monotonic()
        if self._compaction is not None:
            self._compaction.rewrite(self._producer)
        self._checkpoint.commit(
            [TopicPartition(t, p, o, metadata=self._incarnation) for (t, p), o in offsets.items()], stop=stop
        )
        if self._compaction is not None:
            self._compaction.cut(self._admin)
        self._checkpoint.begin()
        CYCLES.inc()
        self._pending = 0
        self._cycle_started = time.monotonic()
        commit_s = self._cycle_started - started
        self._cycle_s = self._options.next_cycle_s(commit_s)
        self._cycle_records = self._options.records_for(self._cycle_s)
        COMMIT_SECONDS.set(commit_s)
        CYCLE_SECONDS.set(self._cycle_s)
        if time.monotonic() - self._reported[0] >= self._options.report_s:
            self._report()  # here, not per step: one step may last long (a catch-up, a gap)

    def _abort(self, stop: threading.Event) -> None:
        """Stopped mid-cycle: drop the cycle in flight; a restart redoes it from the last commit."""
        log.info("stopped mid-cycle: aborting the transaction in flight (%d records and rows)", self._pending)
        if self._compaction is not None:
            self._compaction.forget()
        self._checkpoint.abort(stop=stop)


def run_worker(
    kafka: KafkaSettings,
    codec: AvroCodec,
    operators: Callable[[], list[Operator]],
    options: WorkerOptions,
    stop: threading.Event,
) -> None:
    """Run a worker until ``stop``. A cycle whose transaction the broker made abort
    (:class:`~gpulens.pipeline.exceptions.CycleAborted`) left the operators' memory ahead of the last
    checkpoint: a fresh worker with fresh ``operators()`` restores that checkpoint and redoes
    the cycle, in this process, instead of an exit and a supervisor's restart."""
    while True:
        try:
            StreamWorker(kafka, codec, operators(), options).run(stop)
            return
        except CycleAborted as err:
            log.warning("%s: starting again from the last checkpoint", err)


def _restamp(record: Event, released_ms: int) -> Event:
    """A state change older than what its cluster already released: applied now, and reported.

    Dropping it would leave state wrong from then on (a node never added, a pod never deleted);
    applied at the released instant it fixes state, and the windows it would have changed say so.
    """
    LATE_STATE.inc()
    log.warning(
        "late %s %s of cluster %s at %s (source %s): applied at %s; windows from %s on closed without it",
        type(record).__name__,
        record.event_id,
        record.cluster,
        record.event_time.isoformat(),
        record.source,
        from_ms(released_ms).isoformat(),
        record.event_time.isoformat(),
    )
    return record.model_copy(update={"event_time": from_ms(released_ms)})


def _check_key(key: bytes | None, record: Given) -> None:
    """A sharded worker places records by key: the key must name the record's cluster."""
    cluster = record.cluster.encode()
    if key != cluster and not (key or b"").startswith(cluster + b"/"):
        raise DecodeError(
            DecodeFailure.KEY_MISMATCH, f"key {key!r} does not name the record's cluster {record.cluster!r}"
        )
