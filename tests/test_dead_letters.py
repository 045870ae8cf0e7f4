"""Records that cannot be decoded land in the DLQ with distinct reasons; nothing else is lost."""

from __future__ import annotations

import io
import json
import struct
import time

import fastavro
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sink_support import dead_letters

from gpulens.schemas.kafka.consuming import DecodingConsumer
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import DecodeFailure
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import PODS, TopicSpec
from gpulens.testing.examples import example_events


@pytest.fixture
def pods_topic(platform, unique) -> TopicSpec:
    """A private copy of the pods topic; DLQ entries are told apart by their source topic."""
    spec = TopicSpec(f"gpulens.pods.v1.{unique}", PodEvent, "uid", 1)
    create_topics(platform.kafka, [spec])
    return spec


def test_undecodable_records_go_to_the_dlq_with_distinct_reasons(platform, codec, pods_topic) -> None:
    good = example_events()[PODS]
    second = good.model_copy(update={"event_id": "second", "uid": "other"})
    schema_id = codec.schema_id(pods_topic)
    invalid = io.BytesIO()
    invalid.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(
        invalid,
        fastavro.parse_schema(json.loads(committed(PodEvent))),
        {**good.model_dump(), "gpu_amount": -2.0},
    )
    bad = {
        DecodeFailure.AVRO_DECODE: struct.pack(">bI", 0, schema_id) + b"\xff\xfe garbage \x00\x01",
        DecodeFailure.BAD_MAGIC: b"\x01" + codec.encode(pods_topic, good)[1:],
        DecodeFailure.UNKNOWN_SCHEMA_ID: struct.pack(">bI", 0, 987_654) + b"\x00",
        DecodeFailure.TRUNCATED: b"\x00\x00",
        DecodeFailure.INVALID_RECORD: invalid.getvalue(),
    }
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(pods_topic.name, key=b"k", value=codec.encode(pods_topic, good))
    for value in bad.values():
        producer.produce(pods_topic.name, key=b"k", value=value)
    producer.produce(pods_topic.name, key=b"k", value=codec.encode(pods_topic, second))
    producer.flush(30)

    consumer = DecodingConsumer(platform.kafka, codec, group_id=f"g-{pods_topic.name}", topics=[pods_topic])
    decoded = []
    try:
        for _ in range(30):
            decoded += consumer.poll(100, 0.5)
            if len(decoded) >= 2:
                break
        consumer.commit()
    finally:
        consumer.close()

    assert [d.record for d in decoded] == [good, second]
    letters = dead_letters(platform, codec, {pods_topic.name}, len(bad))
    assert {letter.reason for letter in letters} == {reason.value for reason in bad}
    assert len(letters) == len(bad)
    by_reason = {letter.reason: letter for letter in letters}
    for reason, value in bad.items():
        letter = by_reason[reason.value]
        assert letter.value == value
        assert letter.key == b"k"
        assert letter.source_partition == 0
    assert sorted(letter.source_offset for letter in letters) == [1, 2, 3, 4, 5]
    assert "gpu_amount" in by_reason[DecodeFailure.INVALID_RECORD.value].detail


def test_commit_resumes_after_the_last_record_without_redelivery(platform, codec, pods_topic) -> None:
    producer = Producer(platform.kafka.librdkafka())
    events = [example_events()[PODS].model_copy(update={"event_id": f"e{i}"}) for i in range(3)]
    for event in events:
        producer.produce(pods_topic.name, value=codec.encode(pods_topic, event))
    producer.flush(30)
    group = f"resume-{pods_topic.name}"

    first = DecodingConsumer(platform.kafka, codec, group_id=group, topics=[pods_topic])
    got = []
    while len(got) < 3:
        got += first.poll(1, 1.0)[:1]
    first.commit()
    first.close()

    producer.produce(
        pods_topic.name, value=codec.encode(pods_topic, events[0].model_copy(update={"event_id": "e3"}))
    )
    producer.flush(30)
    second = DecodingConsumer(platform.kafka, codec, group_id=group, topics=[pods_topic])
    later = []
    for _ in range(20):
        later += second.poll(10, 0.5)
        if later:
            break
    second.close()
    assert [d.record.event_id for d in later] == ["e3"]


def test_a_commit_sent_in_the_background_lands_while_polling_goes_on(platform, codec, pods_topic) -> None:
    """``commit(wait=False)`` returns before the broker answers (the sink's commits); the offsets
    land as the consumer polls on, and no failure is told."""
    producer = Producer(platform.kafka.librdkafka())
    for _ in range(3):
        producer.produce(pods_topic.name, value=codec.encode(pods_topic, example_events()[PODS]))
    producer.flush(30)
    group, failures = f"background-{pods_topic.name}", []
    consumer = DecodingConsumer(
        platform.kafka, codec, group_id=group, topics=[pods_topic], on_commit_failed=failures.append
    )
    reader = Consumer(platform.kafka.librdkafka(**{"group.id": group}))
    try:
        got = []
        while len(got) < 3:
            got += consumer.poll(10, 1.0)
        assert consumer.commit(wait=False) == {(pods_topic.name, 0): 3}
        deadline = time.monotonic() + 30
        committed = -1
        while committed != 3 and time.monotonic() < deadline:
            consumer.poll(10, 0.2)  # serves librdkafka's answer
            committed = reader.committed([TopicPartition(pods_topic.name, 0)], timeout=10)[0].offset
        assert committed == 3
        assert failures == []
    finally:
        reader.close()
        consumer.close()
