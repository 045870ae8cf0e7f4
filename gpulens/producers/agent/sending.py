"""Sending records so that none is lost while Kafka is away: the delivery callback decides.

Acknowledged -> gone. Failed or timed out (after ``message.timeout.ms``) -> the spool. While
the spool holds anything, new records join it behind the older ones instead of overtaking
them; the spool drains, oldest first and a batch at a time, only when nothing else is in
flight, and a spooled record leaves the spool only once the broker acknowledged it. With the
idempotent producer a failure inside one partition fails everything behind it too, so
records of one key keep their order across an outage.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from confluent_kafka import KafkaError, Message

from gpulens.producers.agent.metrics import AgentMetrics
from gpulens.producers.agent.spooling import Spool, SpooledRecord
from gpulens.producers.publishing import BasePublisher
from gpulens.schemas.model.models import Event
from gpulens.schemas.model.topics import GPU_SAMPLES, TopicSpec

log = logging.getLogger(__name__)


class SpoolingSender:
    """Produces records straight to Kafka while it answers, through the spool while it does not."""

    def __init__(
        self, publisher: BasePublisher, spool: Spool, metrics: AgentMetrics, *, drain_batch: int = 1000
    ) -> None:
        self._publisher = publisher
        self._spool = spool
        self._metrics = metrics
        self._drain_batch = drain_batch
        self._seq = spool.last_seq
        self._in_flight = 0
        self._gauges()

    @property
    def in_flight(self) -> int:
        """Records handed to the producer whose delivery callback has not run yet."""
        return self._in_flight

    @property
    def spooled(self) -> int:
        """Records waiting in the spool."""
        return self._spool.count

    def send(self, topic: TopicSpec, event: Event) -> None:
        """Encode ``event`` and send it, or spool it behind older records."""
        key, value = self._publisher.encode(topic, event)
        self._seq += 1
        record = SpooledRecord(self._seq, topic.name, key, value, droppable=topic is GPU_SAMPLES)
        if self._spool.count:
            self._keep(record)
        else:
            self._produce(record, spooled=False)
        self.pump()

    def acknowledged(self, timeout_s: float) -> bool:
        """Serve delivery callbacks until nothing is in flight, ``timeout_s`` at most; True when
        the broker acknowledged every record sent so far (none in flight, none spooled)."""
        deadline = time.monotonic() + timeout_s
        self._publisher.poll(0)
        while self._in_flight and time.monotonic() < deadline:
            self._publisher.poll(0.05)
        return not self._in_flight and not self._spool.count

    def pump(self) -> None:
        """Serve delivery callbacks; once nothing is in flight, re-send the oldest spooled batch."""
        self._publisher.poll(0)
        if self._in_flight or not self._spool.count:
            return
        batch = self._spool.head(self._drain_batch)
        for record in batch:
            self._produce(record, spooled=True)

    def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for deliveries; spool whatever is still in flight, close the
        spool and the publisher."""
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            self._publisher.poll(0.05)
        if self._in_flight:
            self._publisher.purge()  # every purged record's callback runs: direct ones get spooled
            purge_deadline = time.monotonic() + 5.0
            while self._in_flight and time.monotonic() < purge_deadline:
                self._publisher.poll(0.05)
        self._spool.close()
        self._publisher.close()

    def _produce(self, record: SpooledRecord, *, spooled: bool) -> None:
        self._in_flight += 1
        self._publisher.produce(
            record.topic, record.key, record.value, on_delivery=partial(self._delivered, record, spooled)
        )

    def _delivered(
        self, record: SpooledRecord, spooled: bool, err: KafkaError | None, _msg: Message | None
    ) -> None:
        self._in_flight -= 1
        if err is None:
            self._metrics.records_published.labels(record.topic).inc()
            if spooled:
                self._spool.remove(record.seq)
        else:
            self._metrics.publish_errors.labels(record.topic).inc()
            log.debug("%s record %d not acknowledged: %s", record.topic, record.seq, err.str())
            if not spooled:
                self._keep(record)
        self._gauges()

    def _keep(self, record: SpooledRecord) -> None:
        dropped = self._spool.append(record)
        if dropped:
            self._metrics.dropped_samples.inc(dropped)
            log.warning(
                "spool full (%d bytes, bound %d): dropped the %d oldest GPU sample batches",
                self._spool.bytes,
                self._spool.max_bytes,
                dropped,
            )
        self._gauges()

    def _gauges(self) -> None:
        self._metrics.spool_bytes.set(self._spool.bytes)
        self._metrics.spool_records.set(self._spool.count)
