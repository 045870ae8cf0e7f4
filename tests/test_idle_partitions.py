"""Idle partitions are paused instead of fetched in a loop, and records still get through."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpulens.config import GPULensSettings
from schemas.consuming import IdlePartitions

PARTITIONS = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def topic(platform: GPULensSettings, unique: str) -> str:
    name = f"idle-{unique}"
    admin = AdminClient(platform.kafka.librdkafka())
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


@pytest.fixture
def consumer(platform: GPULensSettings, topic: str, unique: str):
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"idle-{unique}", "enable.partition.eof": True})
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    yield consumer
    consumer.close()


def poll(consumer: Consumer, idle: IdlePartitions, seconds: float) -> list[bytes]:
    """Poll as a consumer loop does, for ``seconds``; returns the values received."""
    values: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for message in consumer.consume(100, 0.05):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                idle.at_end(message.topic() or "", message.partition() or 0)
            elif error is None:
                values.append(message.value() or b"")
        idle.tick()
    return values


def wait_until_all_paused(consumer: Consumer, idle: IdlePartitions) -> None:
    deadline = time.monotonic() + 20
    while idle.paused < PARTITIONS and time.monotonic() < deadline:
        poll(consumer, idle, 0.1)
    assert idle.paused == PARTITIONS, "every partition reached its end and should be paused"


def test_partitions_at_their_end_are_paused(consumer: Consumer) -> None:
    idle = IdlePartitions(consumer, backoff_s=60)
    wait_until_all_paused(consumer, idle)


def test_a_record_reaching_a_paused_partition_is_delivered(
    platform: GPULensSettings, consumer: Consumer, topic: str
) -> None:
    idle = IdlePartitions(consumer, backoff_s=0.25)
    wait_until_all_paused(consumer, idle)
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(topic, b"late news", partition=2)
    assert producer.flush(10) == 0
    received: list[bytes] = []
    deadline = time.monotonic() + 20
    while not received and time.monotonic() < deadline:
        received += poll(consumer, idle, 0.1)
    assert received == [b"late news"]


def test_a_paused_partition_is_fetched_again_after_the_backoff(consumer: Consumer) -> None:
    clock = FakeClock()
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    clock.now += 0.9
    idle.tick()
    assert idle.paused == PARTITIONS, "still within the backoff"
    clock.now += 0.1
    idle.tick()
    assert idle.paused == 0


def test_a_resumed_partition_with_nothing_new_is_paused_again(consumer: Consumer) -> None:
    idle = IdlePartitions(consumer, backoff_s=0.2)
    wait_until_all_paused(consumer, idle)
    time.sleep(0.2)
    idle.tick()
    assert idle.paused == 0
    wait_until_all_paused(consumer, idle)
