"""The sink loses and repeats nothing: across kill -9 mid-load, and across a ClickHouse outage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY
from sink_support import SinkThread, wait_for

from consumers.clickhouse.client import get_client
from consumers.clickhouse.rows import SINK_TOPICS
from gpulens.platform import service_specs
from schemas.codec import AvroCodec
from schemas.examples import example_events
from schemas.models import GpuSampleBatch
from schemas.topics import GPU_SAMPLES, TopicSpec, record_key

GPUS = 8
LOAD = 125_000
"""GpuSampleBatch records of 8 GPUs: 1,000,000 sample rows."""
"""GpuSampleBatch records of the kill test (x 8 GPUs = 160,000 sample rows)."""


def _batches(cluster: str, count: int, *, first: int = 0) -> list[GpuSampleBatch]:
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


def _produce(platform, codec: AvroCodec, topic: TopicSpec, records: list[GpuSampleBatch]) -> None:
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


def _partitions(consumer: Consumer, topics: list[str]) -> list[TopicPartition]:
    metadata = consumer.list_topics(timeout=10).topics
    return [TopicPartition(t, p) for t in topics for p in metadata[t].partitions]


def _commit_at_end(platform, group: str) -> None:
    """Start ``group`` at the current end of the sink's topics: it sees only what comes next."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group}))
    try:
        ends = [
            TopicPartition(tp.topic, tp.partition, consumer.get_watermark_offsets(tp, timeout=10)[1])
            for tp in _partitions(consumer, [spec.name for spec in SINK_TOPICS])
        ]
        consumer.commit(offsets=ends, asynchronous=False)
    finally:
        consumer.close()


def _lag(platform, group: str, topic: str) -> int:
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group}))
    try:
        committed = consumer.committed(_partitions(consumer, [topic]), timeout=10)
        return sum(consumer.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0) for tp in committed)
    finally:
        consumer.close()


def _lag_gauge(group: str, topic: str) -> float | None:
    return REGISTRY.get_sample_value("gpulens_consumer_lag_records", {"consumer": group, "topic": topic})


def test_a_sink_killed_mid_load_and_restarted_stores_every_sample_exactly_once(
    platform, codec, config_file, unique, spawned
) -> None:
    cluster, group, database = f"kill-{unique}", f"sink-{unique}", f"kill_{unique}"
    expected = LOAD * GPUS
    _commit_at_end(platform, group)
    _produce(platform, codec, GPU_SAMPLES, _batches(cluster, LOAD))
    env = {**os.environ, "GPULENS_CLICKHOUSE__DATABASE": database}
    command = [sys.executable, "-m", "gpulens", "--config", str(config_file), "sink", "--group", group]
    command += ["--batch-rows", "40000", "--batch-seconds", "1"]
    log = config_file.parent / f"sink-{unique}.log"

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        spawned.append(process)
        return process

    client = get_client(platform.clickhouse)

    def stored(final: str = "") -> int:
        try:
            return int(client.command(f"SELECT count() FROM {database}.gpu_samples {final}"))
        except DatabaseError:  # no table yet: the sink is still migrating
            return 0

    first = start()
    wait_for(lambda: stored() >= expected // 4, 180, "a quarter of the load in ClickHouse")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    at_kill = stored()
    assert at_kill < expected, "the kill should land in the middle of the load"

    start()
    wait_for(lambda: _lag(platform, group, GPU_SAMPLES.name) == 0, 300, "the restarted sink to catch up")
    counts = client.query(
        f"SELECT count(), uniqExact(event_id, device_id) FROM {database}.gpu_samples FINAL"
    ).result_rows
    assert counts == [(expected, expected)], f"{at_kill:,} rows stored at the kill"


def test_the_sink_waits_for_clickhouse_and_catches_up_with_nothing_lost(
    platform, codec, config_file, services, unique
) -> None:
    sink = SinkThread(platform, codec, unique).start()
    cluster = f"away-{unique}"
    topic = sink.topics[GPU_SAMPLES.name]
    spec = service_specs(platform, config_file)["clickhouse"]
    retries = {"operation": "insert gpu_samples"}
    try:
        _produce(platform, codec, topic, _batches(cluster, 500))
        sink.wait_rows("gpu_samples", 500 * GPUS)
        before = REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0.0
        services.stop("clickhouse")
        try:
            _produce(platform, codec, topic, _batches(cluster, 1500, first=500))
            wait_for(
                lambda: (REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0) >= before + 3,
                30,
                "the sink to retry while ClickHouse is away",
            )
            assert _lag(platform, sink.group, topic.name) > 0, "nothing may be committed while it is away"
            wait_for(lambda: (_lag_gauge(sink.group, topic.name) or 0) > 0, 30, "the lag metric to show it")
        finally:
            services.start(spec, timeout=platform.platform.start_timeout_s)
        sink.wait_rows("gpu_samples", 2000 * GPUS)
        wait_for(lambda: _lag(platform, sink.group, topic.name) == 0, 30, "the sink to commit")
        wait_for(lambda: _lag_gauge(sink.group, topic.name) == 0, 30, "the lag metric to go back to 0")
        assert (
            sink.scalar("SELECT count(), uniqExact(event_id, device_id) FROM gpu_samples FINAL")
            == 2000 * GPUS
        )
    finally:
        sink.stop()
