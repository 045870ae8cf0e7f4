"""Compaction by the writer: the worker's compacted topics kept bounded on a broker that never compacts.

noida-db, the embedded broker, never compacts: a compacted topic (``gpulens.state.*``) keeps
every row ever written to it, in the broker's memory, and a reader that starts at its beginning
(the demo's "now" view, a new subscriber) reads all of it (26.7 rows a second at 10,000 GPUs,
README). The worker, the topics' only writer there, does what Kafka's log cleaner would:

- it holds the newest row of each live key of each topic (key and value bytes, as written);
  a tombstone drops the key;
- once the rows written to a topic since its last rewrite outnumber its live keys (and number
  at least ``min_rows``), it writes every live row again, at the end of the cycle, in the
  cycle's transaction;
- once that transaction committed, it deletes (DeleteRecords) what precedes each partition's
  first rewritten row: every key there has a row at or after it, or is gone.

So a topic holds at most about its live rows twice over plus ``min_rows``, and a reader from
the beginning reads that much. A restart reads the topics back from their start to learn the
live rows again, a cost that follows the live size too (the rows since the last cut).

What it does not give that Kafka's compaction does: a tombstone stays readable only until the
next cut (Kafka keeps it ``delete.retention.ms``), so a reader more than a rewrite behind resumes
at the partition's new start, reads every live row there again, and misses the tombstones of
keys deleted in between. A partition without a live key is cut only once one lands there again.
It needs a sole writer (a row another writer superseded would come back), so the worker does it
unsharded only, and DeleteRecords needs ``cleanup.policy`` ``compact,delete``: the catalog
creates the topics so, and a topic created before as ``compact`` alone is altered at start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from functools import partial

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, DeletedRecords
from prometheus_client import Counter, Gauge

from gpulens.pipeline.hanging_transactions import StableOffsets
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.state_log import read_span
from gpulens.schemas.model.topics import COMPACTED, CUTTABLE_COMPACTED, TopicSpec

__all__ = ["WriterCompaction"]

log = logging.getLogger(__name__)

LIVE_ROWS = Gauge(
    "gpulens_worker_compacted_live_rows",
    "Live keys of a compacted topic the worker compacts itself (it holds their newest rows).",
    ["topic"],
)
REWRITES = Counter(
    "gpulens_worker_compaction_rewrites_total", "Rewrites of a compacted topic's live rows.", ["topic"]
)
REWRITTEN = Counter(
    "gpulens_worker_compaction_rewritten_rows_total", "Rows written again by those rewrites.", ["topic"]
)


class _Topic:
    """One topic's live rows and what was written to it since its last rewrite."""

    def __init__(self, spec: TopicSpec) -> None:
        self.spec = spec
        self.live: dict[bytes, bytes] = {}
        """Each live key's newest value."""
        self.since = 0
        """Rows written since the last rewrite (tombstones too): each supersedes one, or ends it."""
        self.first: dict[int, int] = {}
        """Per partition, the offset of the first row of the rewrite in flight, as delivered."""
        self.delivered = 0
        """Rows of the rewrite in flight the broker acknowledged."""
        self.rewritten = 0
        """Rows of the rewrite in flight (0: none)."""
        self.refused = False
        """The broker refused a cut (a topic it will not delete from): it keeps its rows."""

    def wrote(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.live.pop(key, None)
        else:
            self.live[key] = value
        self.since += 1

    def start_rewrite(self) -> None:
        self.first, self.delivered, self.rewritten = {}, 0, len(self.live)

    def end_rewrite(self) -> None:
        self.first, self.delivered, self.rewritten = {}, 0, 0

    def landed(self, err: KafkaError | None, message: Message) -> None:
        if err is not None:
            return
        partition, offset = message.partition() or 0, message.offset() or 0
        self.first[partition] = min(self.first.get(partition, offset), offset)
        self.delivered += 1


class WriterCompaction:
    """The compacted topics a worker writes, rewritten and cut by it (module docstring)."""

    def __init__(self, kafka: KafkaSettings, topics: Iterable[TopicSpec], *, min_rows: int) -> None:
        self._kafka = kafka
        self._topics = {spec.name: _Topic(spec) for spec in topics}
        self._min_rows = min_rows

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._topics)

    def restore(self, *, timeout: float = 30.0) -> int:
        """Learn each topic's live rows by reading it whole, committed rows only (call after
        fencing earlier incarnations: what they left open is aborted first, as nobody owns it);
        the number of live rows."""
        admin = AdminClient(self._kafka.librdkafka())
        self._allow_cuts(admin, timeout)
        offsets = StableOffsets(self._kafka, "gpulens-compaction-restore")
        try:
            partitions = [(name, p) for name in self._topics for p in offsets.partitions(name, timeout)]
            offsets.abort_open(partitions)
        finally:
            offsets.close()
        reader = Consumer(
            self._kafka.librdkafka(
                **{
                    "group.id": "gpulens-compaction-restore",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                }
            )
        )
        read = 0
        try:
            for name, partition in partitions:
                topic = self._topics[name]
                low, high = reader.get_watermark_offsets(TopicPartition(name, partition), timeout=timeout)
                if high <= low:
                    continue
                for _, key, value in read_span(reader, TopicPartition(name, partition, low), high, timeout):
                    topic.wrote(key, value)
                    read += 1
        finally:
            reader.close()
        live = 0
        for topic in self._topics.values():
            topic.since = max(0, topic.since - len(topic.live))  # the rows read that are superseded
            live += len(topic.live)
        log.info("compacted topics: %d live rows restored from %d records", live, read)
        return live

    def _allow_cuts(self, admin: AdminClient, timeout: float) -> None:
        """Make topics created as ``compact`` alone ``compact,delete`` with no retention, so that
        the broker takes their cuts and deletes nothing else."""
        described = admin.describe_configs([ConfigResource("topic", name) for name in self._topics])
        stale = []
        for resource, future in described.items():
            try:
                policy = future.result(timeout).get("cleanup.policy")
            except KafkaException as err:  # not created yet: the catalog creates it right
                log.debug("%s: no configuration (%s)", resource.name, err)
                continue
            if policy is not None and "delete" not in (policy.value or ""):
                stale.append(resource.name)
        if not stale:
            return
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in CUTTABLE_COMPACTED.items()
        ]
        altered = admin.incremental_alter_configs(
            [ConfigResource("topic", name, incremental_configs=entries) for name in stale]
        )
        for resource, future in altered.items():
            try:
                future.result(timeout)
                log.info("%s: cleanup.policy now %s (cut by its writer)", resource.name, COMPACTED)
            except KafkaException as err:
                log.warning("%s: cleanup.policy not altered, it keeps its history: %s", resource.name, err)

    def live_rows(self, topic: str) -> int:
        return len(self._topics[topic].live)

    def held_bytes(self) -> int:
        """The keys and values held, in bytes (what the bound costs this process, objects aside)."""
        return sum(len(k) + len(v) for topic in self._topics.values() for k, v in topic.live.items())

    def wrote(self, topic: str, key: bytes, value: bytes | None) -> None:
        """A row (``None``: a tombstone) written to ``topic`` in this cycle."""
        self._topics[topic].wrote(key, value)

    def rewrite(self, producer: Producer) -> None:
        """Write every live row of each topic due (module docstring) through ``producer``, in
        its open transaction."""
        for topic in self._topics.values():
            if topic.refused or topic.since < max(len(topic.live), self._min_rows):
                continue
            topic.start_rewrite()
            landed = topic.landed
            for key, value in topic.live.items():
                produce_with_backpressure(producer, topic.spec.name, key=key, value=value, on_delivery=landed)
            log.info(
                "%s: rewriting its %d live rows (%d rows written since the last rewrite)",
                topic.spec.name,
                topic.rewritten,
                topic.since,
            )
            REWRITES.labels(topic.spec.name).inc()
            REWRITTEN.labels(topic.spec.name).inc(topic.rewritten)
            topic.since = 0
        for topic in self._topics.values():
            LIVE_ROWS.labels(topic.spec.name).set(len(topic.live))

    def cut(self, admin: AdminClient) -> list[Future[DeletedRecords]]:
        """Once the transaction holding a rewrite committed: delete what precedes it, in the
        background (a failure is logged; the next rewrite cuts); the deletions."""
        cuts: list[TopicPartition] = []
        for topic in self._topics.values():
            if topic.rewritten and topic.delivered == topic.rewritten:
                cuts += [TopicPartition(topic.spec.name, p, o) for p, o in sorted(topic.first.items())]
            topic.end_rewrite()
        if not cuts:
            return []
        deleting = admin.delete_records(cuts, request_timeout=30)
        for partition, future in deleting.items():
            future.add_done_callback(partial(self._cut_done, partition.topic))
        return list(deleting.values())

    def forget(self) -> None:
        """The rewrite in flight was aborted with its transaction: never cut behind it."""
        for topic in self._topics.values():
            topic.end_rewrite()

    def _cut_done(self, name: str, future: Future[DeletedRecords]) -> None:
        try:
            future.result()
        except KafkaException as err:
            if err.args[0].code() == KafkaError.POLICY_VIOLATION:
                self._topics[name].refused = True
                log.warning("%s: the broker refuses to cut it (cleanup.policy?): it keeps its history", name)
            else:
                log.warning("%s: cut not made (the next rewrite cuts): %s", name, err)
