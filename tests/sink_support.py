"""What the sink tests share: a database and private topics per test, the sink in a thread, waits."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.exceptions import ClickHouseError
from gpulens.consumers.clickhouse.rows import SINK_TOPICS
from gpulens.consumers.clickhouse.settings import SinkSettings
from gpulens.consumers.clickhouse.sinking import run_sink
from gpulens.schemas.kafka.sharding import UNSHARDED, Shard
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import DeadLetter, GpuSampleBatch, Record
from gpulens.schemas.model.topics import DLQ, GPU_SAMPLES, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

GPUS = 8
"""GPUs in each batch of :func:`sample_batches`."""

FAST = SinkSettings(
    batch_rows=20_000, batch_seconds=0.3, state_batch_seconds=0.3, retry_backoff_s=(0.1, 0.2, 0.5)
)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return as soon as ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


class SinkThread:
    """The sink of one test: private topics, its own database, running in a thread."""

    def __init__(
        self,
        platform,
        codec: AvroCodec,
        unique: str,
        settings: SinkSettings = FAST,
        *,
        registry_url: str | None = None,
    ) -> None:
        """``registry_url``: the registry as ClickHouse is told to reach it (default: the platform's)."""
        self.clickhouse = platform.clickhouse.model_copy(update={"database": f"sink_{unique}"})
        self.topics = {
            spec.name: dataclasses.replace(spec, name=f"{spec.name}.{unique}") for spec in SINK_TOPICS
        }
        create_topics(platform.kafka, list(self.topics.values()))
        self._kafka, self._codec, self._settings = platform.kafka, codec, settings
        self._registry_url = (
            (registry_url or platform.registry.url) if settings.decode_in_clickhouse else None
        )
        self.group = f"sink-{unique}"
        self._producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 5}))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> SinkThread:
        def target() -> None:
            try:
                run_sink(
                    self._kafka,
                    self._codec,
                    self.clickhouse,
                    self._settings,
                    self._stop,
                    topics=list(self.topics.values()),
                    group_id=self.group,
                    registry_url=self._registry_url,
                )
            except BaseException as err:
                self._error = err

        self._thread = threading.Thread(target=target, name="sink", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the sink did not stop"
        if self._error is not None:
            raise self._error

    def publish(self, spec: TopicSpec, records: Iterable[Record]) -> int:
        """Publish ``records`` on this test's copy of ``spec``; how many."""
        topic = self.topics[spec.name]
        count = 0
        for record in records:
            self._producer.produce(
                topic.name, key=record_key(topic, record), value=self._codec.encode(topic, record)
            )
            self._producer.poll(0)
            count += 1
        assert self._producer.flush(30) == 0
        return count

    def client(self):
        return get_client(self.clickhouse, database=self.clickhouse.database)

    def scalar(self, sql: str, parameters: dict | None = None):
        return self.client().query(sql, parameters=parameters).result_rows[0][0]

    def wait_rows(self, table: str, expected: int, where: str = "1", timeout: float = 30) -> None:
        """Wait until ``table`` holds ``expected`` rows (FINAL) matching ``where``."""
        wait_for(
            lambda: self._count(table, where) >= expected,
            timeout,
            f"{expected} rows in {table} where {where}",
        )

    def _count(self, table: str, where: str) -> int:
        try:
            return int(self.scalar(f"SELECT count() FROM {table} FINAL WHERE {where}"))
        except (ClickHouseError, DatabaseError):  # no database yet: the sink is still migrating
            return -1


def dead_letters(
    platform,
    codec: AvroCodec,
    topics: set[str],
    expected: int,
    *,
    consumer: str | None = None,
    timeout: float = 60,
) -> list[DeadLetter]:
    """The dead letters from ``topics`` (by ``consumer``, if given), read from the DLQ's start
    until ``expected`` are there."""
    create_topics(platform.kafka, [DLQ])  # else a subscription to it waits for a metadata refresh
    reader = Consumer(
        platform.kafka.librdkafka(
            **{"group.id": f"dlq-check-{time.monotonic_ns()}", "auto.offset.reset": "earliest"}
        )
    )
    reader.subscribe([DLQ.name])
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + timeout
    try:
        while len(letters) < expected and time.monotonic() < deadline:
            for message in reader.consume(1000, 0.5):
                if message.error() is None:
                    letter = codec.decode(DLQ, message.value())
                    if letter.source_topic in topics and consumer in (None, letter.consumer):
                        letters.append(letter)
    finally:
        reader.close()
    return letters


def sample_batches(cluster: str, count: int, *, first: int = 0) -> list[GpuSampleBatch]:
    template = example_events(cluster)[GPU_SAMPLES]
    sample = template.samples[0]
    samples = [sample.model_copy(update={"device_id": f"gpu-{i}", "index": i}) for i in range(GPUS)]
    start = datetime.now(UTC) - timedelta(hours=1)
    return [
        template.model_copy(
            update={
                "event_id": f"{cluster}-{n}",
                "node": f"node-{n % 64}",
                "event_time": start + timedelta(milliseconds=n),
                "samples": samples,
            }
        )
        for n in range(first, first + count)
    ]


def produce_batches(platform, codec: AvroCodec, topic: TopicSpec, records: list[GpuSampleBatch]) -> None:
    producer = Producer(
        platform.kafka.librdkafka(**{"linger.ms": 20, "queue.buffering.max.messages": 500_000})
    )
    template = records[0].model_dump()
    for record in records:
        values = {
            **template,
            "event_id": record.event_id,
            "node": record.node,
            "event_time": record.event_time,
        }
        producer.produce(topic.name, key=record_key(topic, record), value=codec.encode_dict(topic, values))
        producer.poll(0)
    assert producer.flush(60) == 0


def partitions_of(consumer: Consumer, topics: list[str]) -> list[TopicPartition]:
    metadata = consumer.list_topics(timeout=10).topics
    return [TopicPartition(t, p) for t in topics for p in metadata[t].partitions]


def commit_at_end(platform, group: str) -> None:
    """Start ``group`` at the current end of the sink's topics: it sees only what comes next."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group}))
    try:
        ends = [
            TopicPartition(tp.topic, tp.partition, consumer.get_watermark_offsets(tp, timeout=10)[1])
            for tp in partitions_of(consumer, [spec.name for spec in SINK_TOPICS])
        ]
        consumer.commit(offsets=ends, asynchronous=False)
    finally:
        consumer.close()


def committed_lag(platform, group: str, topic: str, shard: Shard = UNSHARDED) -> int:
    """Records of ``topic`` (the shard's partitions) not yet committed by ``group``."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group}))
    try:
        mine = [tp for tp in partitions_of(consumer, [topic]) if shard.owns(tp.partition)]
        committed = consumer.committed(mine, timeout=10)
        return sum(consumer.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0) for tp in committed)
    finally:
        consumer.close()


class SinkProcesses:
    """``gpulens sink`` processes of one group, writing GPU samples into one private database."""

    def __init__(self, platform, config_file: Path, spawned: list, *, group: str, database: str) -> None:
        self._config_file, self._spawned = config_file, spawned
        self.group, self.database = group, database
        self._platform, self._client = platform, get_client(platform.clickhouse)
        self._env = {**os.environ, "GPULENS_CLICKHOUSE__DATABASE": database}
        commit_at_end(platform, group)  # the group sees only what the test loads next

    def load(self, codec: AvroCodec, cluster: str, batches: int) -> int:
        """Publish ``batches`` GPU sample batches of ``cluster``; the sample rows they make."""
        produce_batches(self._platform, codec, GPU_SAMPLES, sample_batches(cluster, batches))
        return batches * GPUS

    def start(self, *options: str) -> subprocess.Popen[bytes]:
        """One more sink process with these command-line ``options``; stderr in a log of its own."""
        command = [sys.executable, "-m", "gpulens", "--config", str(self._config_file), "sink"]
        command += ["--group", self.group, *options]
        log = self._config_file.parent / f"sink-{self.group}-{len(self._spawned)}.log"
        with log.open("ab") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=self._env)
        self._spawned.append(process)
        return process

    def stored(self, final: str = "") -> int:
        """Rows in ``gpu_samples`` (0 while the sinks are still migrating)."""
        try:
            return int(self._client.command(f"SELECT count() FROM {self.database}.gpu_samples {final}"))
        except DatabaseError:
            return 0

    def distinct(self) -> list[tuple[int, int]]:
        """(rows, distinct (event_id, device_id)) after deduplication."""
        query = f"SELECT count(), uniqExact(event_id, device_id) FROM {self.database}.gpu_samples FINAL"
        return [tuple(row) for row in self._client.query(query).result_rows]  # type: ignore[misc]
