"""A pipeline consumer's committed offsets reach a partition's end, past the marker a
transaction leaves there: a restart does not start behind it, and lag reads 0."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.schemas.kafka.consuming import DecodingConsumer
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

RECORDS = 3


def test_a_consumer_at_the_end_of_a_transaction_commits_past_its_marker(
    platform: GPULensSettings, codec: AvroCodec, unique: str
) -> None:
    topic = TopicSpec(f"positions-{unique}", PodEvent, "uid", 1)
    create_topics(platform.kafka, [topic])
    producer = Producer(platform.kafka.producer(**{"transactional.id": topic.name}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(RECORDS):
        producer.produce(topic.name, value=str(i).encode())
    producer.commit_transaction(30)
    probe = Consumer(platform.kafka.librdkafka(**{"group.id": topic.name}))
    try:
        end = probe.get_watermark_offsets(TopicPartition(topic.name, 0), timeout=10, cached=False)[1]
    finally:
        probe.close()
    assert end == RECORDS + 1, "the broker gave the transaction's marker an offset of its own"

    consumer = DecodingConsumer(
        platform.kafka,
        codec,
        group_id=topic.name,
        topics=[topic],
        start=[TopicPartition(topic.name, 0, 0)],
    )
    try:
        received, committed, deadline = 0, {}, time.monotonic() + 30
        while committed.get((topic.name, 0), 0) < end and time.monotonic() < deadline:
            received += len(consumer.poll_undecoded({topic.name}, 100, 0.2))
            committed |= consumer.commit()
    finally:
        consumer.close()
    assert received == RECORDS
    assert committed == {(topic.name, 0): end}
