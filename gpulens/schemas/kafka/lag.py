"""Consumer-group lag in records: what a group has not consumed yet, transaction markers excluded.

A group's lag on a partition is the partition's end offset minus the group's committed offset
(its low watermark where the group committed nothing). On a topic written in transactions (the
worker's outputs) every commit leaves a control record, a marker, in the log: it takes an
offset, no consumer ever receives it, and a consumer that has read everything commits the offset
after its last record, before the marker. Counted in offsets such a group is never drained
(issue 14: ``gpulens_consumer_lag_records`` never reached 0).

So a gap between the committed and the end offset is read once with a ``read_committed``
consumer from the committed offset: when it delivers no record before the end (only markers, or
records of aborted transactions), the lag is 0; otherwise it counts from the first record it
delivers. The answer is kept per (committed, end) pair, so an idle group costs two broker
requests per measurement (committed offsets, end offsets; batched over its partitions) and no
reading. Gaps longer than ``probe_limit`` offsets are not read, but counted as they are: a
caught-up group stops a marker or a few before the end, and a longer gap is a backlog (read
every measurement while it moves, it would cost the broker a fetch of it each time). An aborted
transaction longer than that (a worker killed mid-cycle) counts until the restarted worker
publishes that cycle again after it and the group reads past it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class LagError(GPULensError):
    """The broker did not say where a group stands (committed or end offsets unavailable)."""


class RecordLag:
    """Measures consumer groups' lag in records over a connection of its own (admin + reader)."""

    def __init__(self, kafka: KafkaSettings, *, probe_limit: int = 1_000, timeout_s: float = 10.0) -> None:
        self._admin = AdminClient(kafka.librdkafka())
        self._reader = Consumer(
            kafka.librdkafka(
                **{
                    "group.id": "gpulens-lag-reader",  # never joins nor commits: assigned only
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._probe_limit, self._timeout_s = probe_limit, timeout_s
        self._known: dict[Partition, tuple[int, int, int]] = {}
        """(committed, end, lag) of the gaps read before."""

    def committed(self, group: str) -> list[TopicPartition]:
        """Every partition ``group`` has committed an offset on, with that offset."""
        found = self._result(
            self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group],
            f"committed offsets of {group}",
        )
        return [tp for tp in found.topic_partitions if tp.offset >= 0]

    def measure(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """Records of ``partitions`` that ``group`` has not consumed, per partition."""
        wanted = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
        if not wanted:
            return {}
        found = self._result(
            self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, wanted)])[group],
            f"committed offsets of {group}",
        )
        committed = {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions}
        ends = self._offsets(wanted, OffsetSpec.latest())
        unread = [TopicPartition(t, p) for t, p in ends if committed.get((t, p), -1) < 0]
        starts = {**committed, **(self._offsets(unread, OffsetSpec.earliest()) if unread else {})}
        lag: dict[Partition, int] = {}
        gaps: dict[Partition, tuple[int, int]] = {}
        for where, end in ends.items():
            start = starts[where]
            known = self._known.get(where)
            if end <= start:
                lag[where] = 0
            elif known is not None and known[:2] == (start, end):
                lag[where] = known[2]
            elif end - start > self._probe_limit:
                lag[where] = end - start
            else:
                gaps[where] = (start, end)
        for where, first in self._first_records(gaps).items():
            start, end = gaps[where]
            lag[where] = 0 if first is None else end - first
            self._known[where] = (start, end, lag[where])
        return lag

    def close(self) -> None:
        self._reader.close()

    def _offsets(self, partitions: Sequence[TopicPartition], spec: OffsetSpec) -> dict[Partition, int]:
        futures = self._admin.list_offsets(
            {tp: spec for tp in partitions},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self._timeout_s,
        )
        return {
            (tp.topic, tp.partition): self._result(future, f"offsets of {tp.topic}/{tp.partition}").offset
            for tp, future in futures.items()
        }

    def _first_records(self, gaps: dict[Partition, tuple[int, int]]) -> dict[Partition, int | None]:
        """Per gap, the offset of the first record a read_committed consumer gets in it, or
        where an open transaction stops it (None: neither, the gap holds markers or aborted
        records only). A gap not read in time counts as holding a record at its start."""
        first: dict[Partition, int | None] = {where: start for where, (start, _) in gaps.items()}
        if not gaps:
            return first
        self._reader.assign([TopicPartition(t, p, start) for (t, p), (start, _) in gaps.items()])
        left = set(gaps)
        deadline = time.monotonic() + self._timeout_s
        try:
            while left and time.monotonic() < deadline:
                for message in self._reader.consume(len(left), 0.5):
                    where = (message.topic() or "", message.partition() or 0)
                    if where not in left:
                        continue
                    offset, end = message.offset() or 0, gaps[where][1]
                    error = message.error()
                    if error is None:
                        first[where] = offset if offset < end else None
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # short of the end: an open transaction holds the rest, still to come
                        first[where] = offset if offset < end else None
                    else:
                        log.debug("lag reader %s/%d: %s", *where, error.str())
                        continue
                    left.discard(where)
        finally:
            self._reader.unassign()
        if left:
            log.warning("lag: %d partitions not read to their end in %.0f s", len(left), self._timeout_s)
        return first

    def _result(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(self._timeout_s)
        except (KafkaException, TimeoutError) as err:
            raise LagError(f"{what}: {str(err) or f'no answer within {self._timeout_s:.0f} s'}") from err


def per_topic(lag: dict[Partition, int]) -> dict[str, int]:
    """Partition lags summed per topic."""
    topics: dict[str, int] = {}
    for (topic, _), records in lag.items():
        topics[topic] = topics.get(topic, 0) + records
    return topics
