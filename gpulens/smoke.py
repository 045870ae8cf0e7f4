"""The smoke flow: publish one record of every type and read each back through the platform.

Smoke records belong to a cluster of their own, :data:`SMOKE_CLUSTER`, never the configured one:
they are stamped now, and in a real cluster they would move its event time to now, so that a
later replay of a past trace into it would be dead-lettered as late (issue 14).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.schemas.kafka.consuming import DecodingConsumer
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.topics import record_key
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

SMOKE_CLUSTER = "gpulens-smoke"
"""The cluster of every smoke record."""


class SmokeError(GPULensError):
    """A record did not come back, or came back different."""


@dataclass(frozen=True, slots=True)
class SmokeResult:
    topic: str
    record_type: str
    schema_id: int
    partition: int
    offset: int
    round_trip_ms: float


def _end_offsets(settings: GPULensSettings, topics: list[str]) -> list[TopicPartition]:
    probe = Consumer(settings.kafka.librdkafka(**{"group.id": "gpulens-smoke-probe"}))
    try:
        metadata = probe.list_topics(timeout=10).topics
        ends = []
        for topic in topics:
            for partition in metadata[topic].partitions:
                _, high = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                ends.append(TopicPartition(topic, partition, high))
        return ends
    finally:
        probe.close()


def run_smoke(settings: GPULensSettings, *, timeout: float = 30.0) -> list[SmokeResult]:
    """Produce one example of every event type and consume them back; :class:`SmokeError` if not."""
    codec = AvroCodec(registry_client(settings.registry.url))
    events = example_events(cluster=SMOKE_CLUSTER, source="smoke", at=datetime.now(UTC))
    start = _end_offsets(settings, [t.name for t in events])
    producer = Producer(settings.kafka.producer(**{"enable.idempotence": True}))
    sent_at: dict[str, float] = {}
    for topic, event in events.items():
        sent_at[event.event_id] = time.perf_counter()
        producer.produce(topic.name, key=record_key(topic, event), value=codec.encode(topic, event))
    if producer.flush(timeout):
        raise SmokeError(f"the broker at {settings.kafka.bootstrap_servers} did not acknowledge the records")
    wanted = {e.event_id: (t, e) for t, e in events.items()}
    consumer = DecodingConsumer(
        settings.kafka,
        codec,
        group_id=f"gpulens-smoke-{uuid.uuid4().hex[:8]}",
        topics=list(events),
        start=start,
    )
    results: list[SmokeResult] = []
    deadline = time.monotonic() + timeout
    try:
        while wanted and time.monotonic() < deadline:
            for item in consumer.poll(100, 0.5):
                found = wanted.pop(getattr(item.record, "event_id", ""), None)
                if found is None:
                    continue
                topic, event = found
                if item.record != event:
                    raise SmokeError(f"{topic.name}: the record read back differs from the one sent")
                results.append(
                    SmokeResult(
                        topic.name,
                        type(event).__name__,
                        codec.schema_id(topic),
                        item.partition,
                        item.offset,
                        (time.perf_counter() - sent_at[event.event_id]) * 1000,
                    )
                )
    finally:
        consumer.close()
    if wanted:
        missing = ", ".join(t.name for t, _ in wanted.values())
        raise SmokeError(f"not read back within {timeout:.0f}s: {missing}")
    return results
