"""Idle partitions are paused instead of fetched in a loop, and records still get through."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY

from gpulens.config import GPULensSettings
from gpulens.schemas.kafka.consuming import IdlePartitions
from gpulens.testing.clocks import ManualClock

PARTITIONS = 4


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


def poll_once(consumer: Consumer, idle: IdlePartitions, timeout: float = 0.5) -> list[bytes]:
    """One poll of a consumer loop; the values it delivered."""
    values: list[bytes] = []
    for message in consumer.consume(idle.batch(100), timeout):
        error = message.error()
        if error is not None and error.code() == KafkaError._PARTITION_EOF:
            idle.at_end(message.topic() or "", message.partition() or 0)
        elif error is None:
            idle.received(message.topic() or "", message.partition() or 0)
            values.append(message.value() or b"")
    idle.tick()
    return values


def poll(consumer: Consumer, idle: IdlePartitions, seconds: float) -> list[bytes]:
    """Poll as a consumer loop does, for ``seconds``; returns the values received."""
    values: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        values += poll_once(consumer, idle, 0.05)
    return values


def wait_until_all_paused(consumer: Consumer, idle: IdlePartitions) -> None:
    deadline = time.monotonic() + 20
    while idle.paused < PARTITIONS and time.monotonic() < deadline:
        poll(consumer, idle, 0.01)
    assert idle.paused == PARTITIONS, "every partition reached its end and should be paused"


def test_partitions_at_their_end_are_paused(consumer: Consumer) -> None:
    idle = IdlePartitions(consumer, backoff_s=60, max_backoff_s=60)
    wait_until_all_paused(consumer, idle)


@pytest.mark.parametrize("quiet_s", [0.0, 3.0])
def test_a_record_reaching_a_paused_partition_is_delivered_within_the_longest_delay(
    platform: GPULensSettings, consumer: Consumer, topic: str, quiet_s: float
) -> None:
    """Right after the partitions ran empty, and after a quiet spell long enough for the delay
    to have grown to its longest: the record waits no longer than that delay and a fetch."""
    idle = IdlePartitions(consumer, backoff_s=0.1, max_backoff_s=0.5)
    wait_until_all_paused(consumer, idle)
    poll(consumer, idle, quiet_s)
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(topic, b"late news", partition=2)
    assert producer.flush(10) == 0
    sent = time.monotonic()
    received: list[bytes] = []
    while not received and time.monotonic() < sent + 20:
        received += poll(consumer, idle, 0.01)
    waited = time.monotonic() - sent
    assert received == [b"late news"]
    assert waited < 0.5 + 0.25, f"the record waited {waited:.2f} s"


def test_the_delay_doubles_while_nothing_comes_and_falls_back_on_a_record(
    consumer: Consumer, topic: str
) -> None:
    clock = ManualClock()
    idle = IdlePartitions(consumer, backoff_s=1.0, max_backoff_s=3.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    for delay in (1.0, 2.0, 3.0, 3.0):
        clock.now += delay - 0.01
        idle.tick()
        assert idle.paused == PARTITIONS, f"still within the delay of {delay} s"
        clock.now += 0.01
        idle.tick()
        assert idle.paused == 0, f"fetched again after {delay} s"
        wait_until_all_paused(consumer, idle)
    clock.now += 3.0
    idle.tick()
    idle.received(topic, 0)  # a record, as the resumed partitions are fetched
    wait_until_all_paused(consumer, idle)
    clock.now += 1.0
    idle.tick()
    assert idle.paused == 0, "a record brings the delay back to its shortest"


def test_partitions_resumed_together_wait_for_their_ends_not_the_poll_timeout(consumer: Consumer) -> None:
    """After a resume, consume asks for no more messages than partitions to hear from: it
    returns on their end-of-partition events (librdkafka re-fetches until they are paused)."""
    clock = ManualClock()
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    assert idle.batch(100) == 100
    clock.now += 1.0
    idle.tick()
    assert idle.batch(100) == PARTITIONS
    started = time.monotonic()
    ends = [m for m in consumer.consume(idle.batch(100), 10.0) if m.error() is not None]
    assert len(ends) == PARTITIONS and time.monotonic() - started < 5.0
    for message in ends:
        idle.at_end(message.topic() or "", message.partition() or 0)
    assert idle.batch(100) == 100
    idle.tick()
    assert idle.paused == PARTITIONS


def test_a_resumed_partition_that_never_answers_stops_limiting_the_batch(consumer: Consumer) -> None:
    """A partition paused by someone else right after the resume (the worker's alignment)
    sends no end event: after ``ANSWER_S`` consume asks for full batches again."""
    clock = ManualClock()
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    clock.now += 1.0
    idle.tick()
    silent = consumer.assignment()[0]
    consumer.pause([silent])
    deadline = time.monotonic() + 20
    while idle.batch(100) > 1 and time.monotonic() < deadline:
        for message in consumer.consume(idle.batch(100), 0.5):
            if message.error() is not None:
                idle.at_end(message.topic() or "", message.partition() or 0)
    assert idle.batch(100) == 1, "every other partition answered"
    clock.now += IdlePartitions.ANSWER_S
    assert idle.batch(100) == 100


def test_records_flowing_come_in_full_batches_while_a_resumed_partition_is_awaited(
    platform: GPULensSettings, topic: str, consumer: Consumer
) -> None:
    """Once a poll comes back full of records, more are queued: consume asks for a full batch
    again although a resumed partition has not answered (the worker took sample batches a few
    at a time otherwise, each poll's own cost paid for a handful of records)."""
    clock = ManualClock()  # never moves: the silent partition is awaited all along
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    producer = Producer(platform.kafka.librdkafka())
    for i in range(500):
        producer.produce(topic, value=str(i).encode(), partition=1)
    assert producer.flush(30) == 0
    clock.now += 1.0
    idle.tick()
    consumer.pause([TopicPartition(topic, 0)])  # resumed, then paused by someone else: silent
    taken, full_batches = 0, 0
    deadline = time.monotonic() + 20
    while taken < 500 and time.monotonic() < deadline:
        asked = idle.batch(100)
        records = 0
        for message in consumer.consume(asked, 0.5):
            if message.error() is not None:
                idle.at_end(message.topic() or "", message.partition() or 0)
            else:
                idle.received(message.topic() or "", message.partition() or 0)
                records += 1
        taken += records
        full_batches += asked == records == 100
        idle.tick()
    assert taken == 500
    assert full_batches >= 3, "records taken 100 at a time once they flow"


def fetcher_wakes() -> float:
    """Round trips this process made to wake a consumer's fetcher."""
    return REGISTRY.get_sample_value("gpulens_consumer_fetcher_wakes_total") or 0.0


def test_resumed_partitions_are_fetched_without_a_round_trip_while_records_flow(
    platform: GPULensSettings, topic: str, consumer: Consumer
) -> None:
    """A resume after a quiet poll wakes the fetcher with a round trip to the broker; one
    while another partition delivers records needs none (the fetcher is awake), and the
    resumed partitions still answer."""
    clock = ManualClock()  # the answer time never runs out: no probe asks the broker either
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    producer = Producer(platform.kafka.librdkafka())
    flowing = PARTITIONS - 1  # the last: the others' end events come before its records
    for i in range(5_000):
        producer.produce(topic, value=str(i).encode(), partition=flowing)
    assert producer.flush(30) == 0
    wakes = fetcher_wakes()
    clock.now += 1.0
    idle.tick()
    assert fetcher_wakes() == wakes + 1, "resumed after a quiet poll: the fetcher is woken"
    deadline = time.monotonic() + 20
    while idle.paused < PARTITIONS - 1 and time.monotonic() < deadline:
        poll_once(consumer, idle)
    assert idle.paused == PARTITIONS - 1, f"the others are at their end again, partition {flowing} flows"
    clock.now += 1.0
    assert poll_once(consumer, idle) and idle.paused == 0, "resumed after a poll of records"
    while idle.paused < PARTITIONS - 1 and time.monotonic() < deadline:
        poll_once(consumer, idle)
    assert idle.paused >= PARTITIONS - 1, "the resumed partitions answered (at their end again)"
    assert fetcher_wakes() == wakes + 1, "no round trip while records flowed"


def test_a_silent_partition_is_not_probed_while_records_flow(
    platform: GPULensSettings, topic: str, consumer: Consumer
) -> None:
    """A resumed partition that does not answer in time stops limiting the batch; it costs a
    round trip to the broker only when no records flow (they prove the broker answers)."""
    clock = ManualClock()
    idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
    wait_until_all_paused(consumer, idle)
    producer = Producer(platform.kafka.librdkafka())
    for i in range(5_000):
        producer.produce(topic, value=str(i).encode(), partition=PARTITIONS - 1)
    assert producer.flush(30) == 0
    clock.now += 1.0
    idle.tick()  # all resumed after a quiet poll: one wake
    consumer.pause([TopicPartition(topic, 0)])  # resumed, then paused by someone else: silent
    deadline = time.monotonic() + 20
    while idle.batch(100) > 1 and time.monotonic() < deadline:
        poll_once(consumer, idle)
    assert idle.batch(100) == 1, "only the silent partition is awaited"
    wakes = fetcher_wakes()
    clock.now += IdlePartitions.ANSWER_S
    assert poll_once(consumer, idle), "records flow"
    assert idle.batch(100) == 100, "the silent partition no longer limits the batch"
    assert fetcher_wakes() == wakes, "no probe while records flow"


@pytest.fixture
def stalled_broker() -> Iterator[str]:
    """The address of a broker that stopped answering (as one under SIGSTOP): the kernel
    accepts connections into the backlog, nothing ever reads or answers them."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def wake_failures() -> float:
    """Broker calls that woke a fetcher and failed, as this process's metrics count them."""
    labels = {"operation": "wake fetcher"}
    return REGISTRY.get_sample_value("gpulens_kafka_transient_errors_total", labels) or 0.0


def test_resumed_partitions_whose_broker_stopped_answering_are_noticed_within_the_answer_time(
    stalled_broker: str, unique: str
) -> None:
    """A broker that stalls while the resumed partitions' fetch is in flight sends neither
    records nor end events: the consumer asks it again once their answer is overdue, and
    counts the failure then, not at librdkafka's 60 s socket timeout."""
    consumer = Consumer({"bootstrap.servers": stalled_broker, "group.id": f"stalled-{unique}"})
    try:
        partitions = [TopicPartition("stalled", p, 0) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        clock = ManualClock()
        idle = IdlePartitions(consumer, backoff_s=1.0, clock=clock)
        for tp in partitions:
            idle.at_end(tp.topic, tp.partition)
        idle.tick()
        clock.now += 1.0
        idle.tick()  # resumed: their fetch goes to the stalled broker
        failures = wake_failures()
        clock.now += IdlePartitions.ANSWER_S - 0.01
        idle.tick()
        assert wake_failures() == failures, "still within the answer time"
        clock.now += 0.01
        idle.tick()
        assert wake_failures() == failures + 1
        assert idle.batch(100) == 100, "no silent partition limits the batch any longer"
    finally:
        consumer.close()
