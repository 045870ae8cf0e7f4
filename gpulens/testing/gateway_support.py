"""What the gateway tests and the benchmark share: a private topic, events for it, reading it back."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from gpulens.producers.gateway import GatewaySettings
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import StorageEvent
from gpulens.schemas.model.topics import STORAGE, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

TOKEN = "gateway-test-token"


def private_topic(kafka: KafkaSettings, name: str, partitions: int = 6) -> TopicSpec:
    """A StorageEvent topic of this test's own (the gateway is given it as its catalog)."""
    spec = TopicSpec(name, StorageEvent, "name", partitions)
    create_topics(kafka, [spec])
    return spec


def gateway_settings(**overrides: Any) -> GatewaySettings:
    return GatewaySettings(host="127.0.0.1", port=0, tokens=(SecretStr(TOKEN),), metrics_port=0, **overrides)


def storage_values(volume: str) -> dict[str, Any]:
    """The fields of a StorageEvent for ``volume``, to encode with an ``event_id`` of one's own."""
    return {**example_events()[STORAGE].model_dump(), "name": volume}


def storage_event(
    codec: AvroCodec, topic: TopicSpec, event_id: str, *, volume: str = "vol"
) -> tuple[bytes, bytes]:
    """Key and value of one StorageEvent on ``topic`` with its own ``event_id``."""
    values = storage_values(volume)
    return record_key(topic, StorageEvent.model_construct(**values)), codec.encode_dict(
        topic, {**values, "event_id": event_id}
    )


def event_ids(
    kafka: KafkaSettings, codec: AvroCodec, topic: TopicSpec, *, timeout: float = 60
) -> Counter[str]:
    """How often each event_id is on ``topic``, reading every partition up to its end offset."""
    consumer = Consumer(kafka.librdkafka(**{"group.id": f"gateway-check-{time.monotonic_ns()}"}))
    try:
        metadata = consumer.list_topics(topic.name, timeout=10).topics[topic.name]
        ends = {}
        for partition in metadata.partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic.name, partition), timeout=10)
            if high:
                ends[partition] = high
        consumer.assign([TopicPartition(topic.name, p, 0) for p in ends])
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                if message.error() is not None:
                    continue
                seen[codec.decode_dict(topic, message.value() or b"")["event_id"]] += 1
                if (message.offset() or 0) + 1 >= ends.get(message.partition(), 0):
                    ends.pop(message.partition(), None)
        assert not ends, f"partitions not read to their end: {ends}"
        return seen
    finally:
        consumer.close()
