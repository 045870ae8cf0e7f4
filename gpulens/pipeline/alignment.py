"""Keeping the input partitions close in event time while the worker holds many records.

A worker catching up on a backlog fetches whatever the broker hands out first, and the broker
need not be fair: noida-db filled the fetches with sample partitions while the watermarks
partition waited, so a worker catching up on 60 minutes of 2,000 GPUs buffered everything
until the watermarks came (7.8 GB). Holding records is fine until there are many of them;
past ``from_buffered``, a partition whose newest record is more than ``ahead_ms`` of event time
ahead of the slowest partition still being read is paused, so the fetches go to the
partitions behind (the watermarks among them), and resumed once the others caught up or the
buffer drained. The slowest partition is never paused, so reading always goes on: a
partition at its end no longer counts, and one never fetched yet counts as the slowest.

One exception: while a cluster's time stays put for its sources to speak (the wait after the
worker first hears of it, :mod:`gpulens.pipeline.event_time`), reading on cannot release
anything, only add to what is held. Past ``from_buffered``, every partition is then paused
until the wait ends: a worker catching up on 30,000 records with ``from_buffered`` 2,000 held
11,400 of them after a 1 s wait, and would hold everything fetched in the default 10 s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpulens.pipeline.merging import Partition, PartitionEnds

log = logging.getLogger(__name__)


class Alignment:
    """Pauses the partitions running ahead in event time while many records are buffered."""

    def __init__(
        self,
        consumer: Consumer,
        ends: PartitionEnds,
        newest: Mapping[Partition, int],
        *,
        ahead_ms: int = 60_000,
        from_buffered: int = 50_000,
    ) -> None:
        self._consumer = consumer
        self._ends = ends
        self._newest = newest
        """Event time of the newest record fetched, per partition."""
        self.ahead_ms = ahead_ms
        self.from_buffered = from_buffered
        self.paused: set[Partition] = set()
        """Partitions this alignment paused."""
        self.holding = False
        """``from_buffered`` records or more were held at the last tick."""

    @property
    def fetch_size(self) -> int:
        """Records to take per fetch: a few while holding many, so that what a pause leaves out
        is not taken in the meantime."""
        return 500 if self.holding else min(5_000, self.from_buffered)

    def tick(self, buffered: int, *, waiting: bool = False) -> None:
        """Pause and resume by how far each partition is ahead, given ``buffered`` records held;
        ``waiting``: a cluster's time stays put until its sources spoke (module docstring)."""
        reading = [p for p, since in self._ends.since.items() if since is None]
        ahead: set[Partition] = set()
        self.holding = buffered >= self.from_buffered
        if self.holding and waiting:
            ahead = set(reading)
        elif self.holding and reading:
            slowest = min(self._newest.get(p, -(2**63)) for p in reading)
            ahead = {p for p in reading if self._newest.get(p, -(2**63)) > slowest + self.ahead_ms}
        self._call(self._consumer.resume, self.paused - ahead)
        self._call(self._consumer.pause, ahead - self.paused)
        self.paused = ahead

    @staticmethod
    def _call(action: object, partitions: set[Partition]) -> None:
        if not partitions:
            return
        try:
            action([TopicPartition(t, p) for t, p in sorted(partitions)])  # type: ignore[operator]
        except KafkaException as err:  # revoked meanwhile: nothing to pause or resume
            log.debug("pause/resume of %d partitions: %s", len(partitions), err)
