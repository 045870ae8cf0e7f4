"""Retention on the embedded broker: DeleteRecords of what every consumer group has consumed.

noida-db keeps every record of every partition in memory (8 MB to 1.5 GB in 220 s at 20,000
GPUs). It enforces a topic's ``retention.ms`` and ``retention.bytes`` itself only per segment,
and with the default ``segment.ms`` (7 days) nothing ever rolls (measured: README, "Retention
on the embedded broker"); that retention would also ignore consumers, and the catalog's is days
long (the topics are public: a subscriber may come back tomorrow). So a pass here cuts each
partition of every catalog topic with ``cleanup.policy=delete`` at the lower of

- the least offset committed on it by any consumer group (a record some group has not
  consumed stays; a partition no group has committed on stays whole), where each of the
  ``required`` groups must have committed on every partition of the topics it reads (a
  pipeline group that has not started, or reads a partition from its first record without a
  commit yet, holds the whole partition back), and counts only there (the exporter's group
  of an earlier release committed on the GPU samples, which it no longer reads); a required
  group given no topics (the worker) counts wherever it committed; and
- the first offset whose timestamp lies within the topic's retention (the catalog's
  ``retention.ms``, capped at ``keep_ms``: the embedded broker cannot hold days of samples),

unless the partition would keep more than ``max_records``: then it keeps its newest
``max_records``, consumed or not, and every record younger than ``spare_ms`` (a burst, such as
the 200,000 device changes of a 100,000-GPU cluster's start, gets that long to be consumed). A
consumer that cannot keep up (the worker at 100,000 GPUs on 2 cores read 2,690 of 6,372
records/s) otherwise held everything back, and the broker grew
to 19.9 GB in 10 minutes, near the machine's end; the groups behind lose their oldest records
instead (logged as a warning naming them, counted by ``gpulens_retention_dropped_records``) and
resume at the new low watermark, as a Kafka consumer past ``retention.bytes`` does. The cap
counts records, not bytes: the broker reports no size per partition, and its memory per record
is measured (README, "Retention on the embedded broker").

Cuts are made with DeleteRecords, which moves the partition's low watermark; records below it are gone from
the broker's memory. Compacted topics (``gpulens.state.*``) and every topic outside the catalog
(the worker's and exporter's checkpoint changelogs, ``gpulens.worker.*.changelog``) are never
touched: their old records are live state (the changelogs' writers cut them behind their
snapshots themselves, :mod:`gpulens.schemas.kafka.state_log`). Groups named with an
``ignored`` prefix (the smoke check's, one per run, never coming back) hold nothing back.

A pass that cannot reach the broker deletes nothing and raises :class:`RetentionError`; the
loop logs it, counts it and tries again at the next interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.topics import TopicSpec

__all__ = ["Cut", "Retainer", "RetentionError", "RetentionMetrics", "RetentionPolicy", "run_retention"]

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class RetentionError(GPULensError):
    """The broker did not answer a retention pass (offsets, groups or the deletion itself)."""


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What may be deleted: from which topics, how old, held back by which groups."""

    topics: tuple[TopicSpec, ...]
    """Candidates; compacted ones among them are left out (see :attr:`truncated`)."""
    keep_ms: int
    """Records younger than this stay, whatever every group has consumed."""
    required: Mapping[str, tuple[TopicSpec, ...]] = field(default_factory=dict)
    """Groups that must have committed on every partition of these topics before any of it
    goes; their commits on other topics hold nothing back (an earlier release read them). A
    group given no topics (the worker: its inputs follow its processors) holds back wherever
    it committed."""
    ignored: tuple[str, ...] = ()
    """Group name prefixes whose commits hold nothing back."""
    max_records: int = 0
    """Most records a partition keeps, consumed or not (0: no cap)."""
    spare_ms: int = 0
    """Records younger than this stay even past ``max_records``: a burst gets this long to be
    consumed before the cap takes it (memory past the cap then follows the rate records come at)."""

    @property
    def truncated(self) -> tuple[TopicSpec, ...]:
        """The topics a pass may cut: delete-policy only, never a compacted one."""
        return tuple(t for t in self.topics if not t.compacted)

    def retention_ms(self, topic: TopicSpec) -> int:
        return min(topic.retention_ms, self.keep_ms)


@dataclass(frozen=True, slots=True)
class Cut:
    """One partition's records deleted by a pass: ``[start, offset)``."""

    topic: str
    partition: int
    start: int
    """The low watermark before."""
    offset: int
    """The low watermark after."""
    consumed: int
    """The least offset every group has committed (what no group still needs below)."""
    horizon: int
    """The first offset within the topic's retention time."""
    behind: tuple[str, ...] = ()
    """Groups that had not consumed every record cut (the cap cut past them), by name."""

    @property
    def records(self) -> int:
        return self.offset - self.start

    @property
    def dropped(self) -> int:
        """Records cut that some group had not consumed: only the cap cuts those."""
        return max(0, self.offset - max(self.consumed, self.start))


class RetentionMetrics:
    """The job's counters, in a registry of their own (served by `gpulens retention`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.passes = Counter(
            "gpulens_retention_passes", "Retention passes completed.", registry=self.registry
        )
        self.failures = Counter(
            "gpulens_retention_failures", "Passes the broker did not answer.", registry=self.registry
        )
        self.deleted = Counter(
            "gpulens_retention_deleted_records",
            "Offsets deleted below the low watermark, per topic.",
            ["topic"],
            registry=self.registry,
        )
        self.retained = Gauge(
            "gpulens_retention_retained_records",
            "Offsets between the low and the high watermark after the last pass, per topic.",
            ["topic"],
            registry=self.registry,
        )
        self.dropped = Counter(
            "gpulens_retention_dropped_records",
            "Records deleted before every group had consumed them: the partition held more than "
            "retention.max_records_per_partition, per topic.",
            ["topic"],
            registry=self.registry,
        )
        self.held = Gauge(
            "gpulens_retention_held_records",
            "Offsets past the retention time kept because a group has not consumed them, per topic.",
            ["topic"],
            registry=self.registry,
        )
        self.duration = Gauge(
            "gpulens_retention_pass_seconds", "Wall time of the last pass.", registry=self.registry
        )


class Retainer:
    """Runs retention passes over an admin connection of its own."""

    def __init__(
        self,
        kafka: KafkaSettings,
        policy: RetentionPolicy,
        *,
        metrics: RetentionMetrics | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        timeout_s: float = 10.0,
    ) -> None:
        self._admin = AdminClient(kafka.librdkafka())
        self._policy = policy
        self._metrics = metrics or RetentionMetrics()
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s

    @property
    def max_records(self) -> int:
        return self._policy.max_records

    def run_once(self) -> list[Cut]:
        """One pass: cut every partition that has records no group needs past their retention;
        the cuts made (partitions left alone are not listed)."""
        began = time.monotonic()
        counts = self._partition_counts()
        topics = [t for t in self._policy.truncated if t.name in counts]
        partitions = [TopicPartition(t.name, p) for t in topics for p in range(counts[t.name])]
        if not partitions:
            return []
        committed = self._committed({(tp.topic, tp.partition) for tp in partitions}, counts)
        now = self._clock_ms()
        starts = self._offsets(partitions, lambda _tp: OffsetSpec.earliest())
        ends = self._offsets(partitions, lambda _tp: OffsetSpec.latest())
        by_name = {t.name: t for t in topics}
        horizons = self._offsets(
            partitions,
            lambda tp: OffsetSpec.for_timestamp(now - self._policy.retention_ms(by_name[tp.topic])),
        )
        spared = self._spared(starts, ends, now)
        cuts: list[Cut] = []
        held: dict[str, int] = dict.fromkeys(by_name, 0)
        for where in sorted(starts):
            start, end = starts[where], ends[where]
            horizon = end if horizons[where] < 0 else horizons[where]  # -1: every record is older
            groups = committed.get(where, {})
            least = min(groups.values(), default=start)
            offset = min(least, horizon, end)
            if self._policy.max_records:
                offset = max(offset, min(end - self._policy.max_records, spared.get(where, end)))
            held[where[0]] += max(0, min(horizon, end) - max(offset, start))
            if offset > start:
                behind = tuple(sorted(g for g, at in groups.items() if at < offset))
                cuts.append(Cut(where[0], where[1], start, offset, least, horizon, behind))
        self._delete(cuts)
        low = {**starts, **{(c.topic, c.partition): c.offset for c in cuts}}
        for name in by_name:
            retained = sum(ends[w] - low[w] for w in ends if w[0] == name)
            self._metrics.retained.labels(name).set(retained)
            self._metrics.held.labels(name).set(held[name])
        for cut in cuts:
            self._metrics.deleted.labels(cut.topic).inc(cut.records)
            if cut.dropped:
                self._metrics.dropped.labels(cut.topic).inc(cut.dropped)
        self._metrics.passes.inc()
        self._metrics.duration.set(time.monotonic() - began)
        return cuts

    def _spared(
        self, starts: Mapping[Partition, int], ends: Mapping[Partition, int], now: int
    ) -> dict[Partition, int]:
        """Per partition over the cap, its first record the cap spares (younger than
        ``spare_ms``); asked of the broker only for those."""
        cap, spare_ms = self._policy.max_records, self._policy.spare_ms
        if not (cap and spare_ms):
            return {}
        over = [TopicPartition(*where) for where, end in ends.items() if end - starts[where] > cap]
        if not over:
            return {}
        found = self._offsets(over, lambda _tp: OffsetSpec.for_timestamp(now - spare_ms))
        return {where: ends[where] if offset < 0 else offset for where, offset in found.items()}

    def _partition_counts(self) -> dict[str, int]:
        """Every topic the broker has, with its number of partitions."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s).topics
        except KafkaException as err:
            raise RetentionError(f"no topic metadata: {err.args[0].str()}") from err
        return {name: len(m.partitions) for name, m in metadata.items()}

    def _committed(
        self, partitions: set[Partition], counts: Mapping[str, int]
    ) -> dict[Partition, dict[str, int]]:
        """Per partition, the offset each group that holds it back has committed there; a
        required group that has not committed on it counts as consumed up to nothing (-1)."""
        listed = self._result(self._admin.list_consumer_groups(request_timeout=self._timeout_s), "groups")
        groups = {g.group_id for g in listed.valid} | set(self._policy.required)
        by_partition: dict[Partition, dict[str, int]] = {}
        for group in sorted(groups):
            if group.startswith(self._policy.ignored) and group not in self._policy.required:
                continue
            found = self._result(
                self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group],
                f"committed offsets of {group}",
            )
            committed = {
                (tp.topic, tp.partition): tp.offset for tp in found.topic_partitions if tp.offset >= 0
            }
            if self._policy.required.get(group):  # its commits on what it no longer reads hold nothing
                reads = {t.name for t in self._policy.required[group]}
                committed = {where: offset for where, offset in committed.items() if where[0] in reads}
            needed = {
                (t.name, p)
                for t in self._policy.required.get(group, ())
                for p in range(counts.get(t.name, 0))
            }
            for where in partitions & (set(committed) | needed):
                by_partition.setdefault(where, {})[group] = committed.get(where, -1)
        return by_partition

    def _offsets(
        self, partitions: list[TopicPartition], spec: Callable[[TopicPartition], OffsetSpec]
    ) -> dict[Partition, int]:
        futures = self._admin.list_offsets(
            {tp: spec(tp) for tp in partitions}, request_timeout=self._timeout_s
        )
        return {
            (tp.topic, tp.partition): self._result(future, f"offsets of {tp.topic}/{tp.partition}").offset
            for tp, future in futures.items()
        }

    def _delete(self, cuts: list[Cut]) -> None:
        if not cuts:
            return
        futures = self._admin.delete_records(
            [TopicPartition(c.topic, c.partition, c.offset) for c in cuts], request_timeout=self._timeout_s
        )
        for tp, future in futures.items():
            self._result(future, f"deleting records of {tp.topic}/{tp.partition} below {tp.offset}")

    def _result(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(timeout=self._timeout_s)
        except KafkaException as err:
            raise RetentionError(f"{what}: {err.args[0].str()}") from err
        except TimeoutError as err:
            raise RetentionError(f"{what}: no answer within {self._timeout_s:.0f} s") from err


def run_retention(
    retainer: Retainer, metrics: RetentionMetrics, *, interval_s: float, stop: threading.Event
) -> None:
    """Run a pass every ``interval_s`` until ``stop``; a failed pass is logged and counted."""
    while not stop.is_set():
        try:
            cuts = retainer.run_once()
        except RetentionError as err:
            metrics.failures.inc()
            log.warning("retention pass failed, deleting nothing: %s", err)
        else:
            for cut in cuts:
                if cut.dropped:
                    log.warning(
                        "%s/%d: deleted %d records %s had not consumed: the partition held more "
                        "than retention.max_records_per_partition (%d); they resume at %d",
                        cut.topic,
                        cut.partition,
                        cut.dropped,
                        ", ".join(cut.behind) or "any group",
                        retainer.max_records,
                        cut.offset,
                    )
                log.info(
                    "%s/%d: deleted %d records below %d (least committed %d, retention from %d)",
                    cut.topic,
                    cut.partition,
                    cut.records,
                    cut.offset,
                    cut.consumed,
                    cut.horizon,
                )
        stop.wait(interval_s)
