"""Knowing when work is done: lag in records (transaction markers excluded) and `gpulens status`.

A topic written in transactions holds a marker after each transaction's records: an offset no
consumer receives. A group that consumed everything commits the offset after its last record,
before the marker; its lag must read 0 all the same, and `gpulens status` must say drained.
"""

from __future__ import annotations

import logging
import operator
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from alert_oracle import SAMPLES
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from module_platform_fixtures import module_platform_fixtures
from trace_slices import head_of

from gpulens.cli import LAG_UNKNOWN, NOT_DRAINED
from gpulens.config import GPULensSettings
from gpulens.draining import pipeline_groups, wait_drained
from gpulens.platform import BROKER, manager
from gpulens.schemas.kafka.consuming import LagMonitor
from gpulens.schemas.kafka.lag import RecordLag
from gpulens.schemas.model.topics import CLUSTER_ALLOCATION, PODS, WORKLOAD_USAGE
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

PARTITIONS = 2


platform, config_file = module_platform_fixtures()


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def offsets(kafka_config: dict[str, object], group: str, partitions: list[TopicPartition]) -> dict:
    """(committed, end) per partition, read directly from the broker."""
    consumer = Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed(partitions, timeout=10)
        return {
            (tp.topic, tp.partition): (tp.offset, consumer.get_watermark_offsets(tp, timeout=10)[1])
            for tp in committed
        }
    finally:
        consumer.close()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.5)


def records_after(kafka_config: dict[str, object], start: dict[tuple[str, int], int]) -> int:
    """Records a read_committed consumer gets from ``start`` to the partitions' ends."""
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": "test-drained-reader",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
    left, records = set(start), 0
    deadline = time.monotonic() + 30
    try:
        while left and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                error = message.error()
                if error is None:
                    records += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    left.discard((message.topic() or "", message.partition() or 0))
        assert not left, f"not read to the end: {left}"
        return records
    finally:
        consumer.close()


def consume_all(kafka_config: dict[str, object], group: str, topic: str) -> int:
    """Read ``topic`` to its end as ``group`` (read_committed) and commit after each last record."""
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    left, read = set(range(PARTITIONS)), 0
    deadline = time.monotonic() + 30
    try:
        while left and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                if message.error() is None:
                    read += 1
                    consumer.commit(message=message, asynchronous=False)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(message.partition() or 0)
        assert not left
        return read
    finally:
        consumer.close()


def test_transaction_markers_are_not_lag(platform: GPULensSettings, unique: str) -> None:
    kafka = platform.kafka.librdkafka()
    topic, group = f"txn-{unique}", f"txn-reader-{unique}"
    admin = AdminClient(kafka)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer({**kafka, "transactional.id": f"txn-{unique}"})
    producer.init_transactions(30)
    for transaction, commit in ((0, True), (1, True), (2, False), (3, True), (4, False)):
        producer.begin_transaction()
        for n in range(5):
            producer.produce(topic, f"{transaction}-{n}".encode(), partition=n % PARTITIONS)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    partitions = [(topic, p) for p in range(PARTITIONS)]
    lag = RecordLag(platform.kafka)
    try:
        before = lag.measure(group, partitions)
        assert all(before.values()), f"nothing consumed yet, every partition has records: {before}"
        assert consume_all(kafka, group, topic) == 15, "three committed transactions of five records"
        raw = offsets(kafka, group, [TopicPartition(t, p) for t, p in partitions])
        assert all(end > committed for committed, end in raw.values()), (
            f"markers and aborted records follow the last record of each partition: {raw}"
        )
        assert lag.measure(group, partitions) == {where: 0 for where in partitions}
        monitor = LagMonitor(platform.kafka, group, [TopicPartition(t, p) for t, p in partitions])
        try:
            assert monitor.measure() == {topic: 0}
        finally:
            monitor.stop()
        producer.begin_transaction()
        producer.produce(topic, b"one more", partition=1)
        producer.commit_transaction(30)
        assert lag.measure(group, partitions)[(topic, 1)] > 0, "a record after the markers is lag"
    finally:
        lag.close()


def test_status_before_the_pipeline_ran_says_not_drained(config_file: Path) -> None:
    status = subprocess.run(gpulens(config_file, "status"), capture_output=True, text=True, timeout=120)
    assert status.returncode == NOT_DRAINED, status.stdout + status.stderr
    assert "not started" in status.stdout and "pipeline: not drained" in status.stdout


def test_status_without_a_broker_says_the_lag_is_unknown(tmp_path: Path) -> None:
    config = tmp_path / "gpulens.toml"
    config.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:9"\n[platform]\nstate_dir = "state"\n')
    status = subprocess.run(
        gpulens(config, "status"), capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert status.returncode == LAG_UNKNOWN, status.stdout + status.stderr
    assert "lag unknown" in status.stdout


def test_the_pipeline_drains_past_the_workers_markers_and_status_says_so(
    platform: GPULensSettings, config_file: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Replay a trace, run worker, sink and exporter: `gpulens status` exits 0 (drained) and the
    sink's committed offsets reach the ends of the worker's outputs, past their markers."""
    logs = config_file.parent
    samples = head_of(SAMPLES, 5_000, logs / "duty.csv")  # hours of windows, many transactions
    replay = subprocess.run(
        gpulens(config_file, "replay", "genai-duty", "--samples", str(samples)),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    for name, *args in (
        ("worker", "--window", "3600", "--no-nodes"),
        ("sink",),
        ("exporter",),
    ):
        with (logs / f"{name}.log").open("ab") as log:
            spawned.append(
                subprocess.Popen(gpulens(config_file, name, *args), stdout=subprocess.DEVNULL, stderr=log)
            )
    deadline = time.monotonic() + 300
    while True:
        status = subprocess.run(gpulens(config_file, "status"), capture_output=True, text=True, timeout=120)
        if status.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    for group in pipeline_groups(platform):
        assert any(line.split()[:1] == [group] and line.endswith(" drained") for line in lines), group
    assert "pipeline: drained" in lines
    kafka = platform.kafka.librdkafka()
    outputs = [
        TopicPartition(t.name, p) for t in (CLUSTER_ALLOCATION, WORKLOAD_USAGE) for p in range(t.partitions)
    ]
    raw = offsets(kafka, platform.sink.group_id, outputs)
    assert (
        records_after(kafka, {where: committed for where, (committed, _) in raw.items() if committed >= 0})
        == 0
    )
    deadline = time.monotonic() + 30  # the sink commits past the markers at its next poll
    while any(committed != end for committed, end in raw.values()):
        assert time.monotonic() < deadline, f"the sink's committed offsets stop before the ends: {raw}"
        time.sleep(0.2)
        raw = offsets(kafka, platform.sink.group_id, outputs)


def test_a_sink_commits_past_the_marker_of_a_transaction_it_read_to_the_end(
    platform: GPULensSettings, config_file: Path, unique: str, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Once the sink has written what came before, a transaction of one record that does not
    decode: the sink dead-letters it (and stores the dead letter, its batch) and commits past the
    record and the transaction's marker, so its committed offsets reach the end."""
    kafka = platform.kafka.librdkafka()
    group, where = f"sink-{unique}", TopicPartition(PODS.name, 0)
    codec = AvroCodec(registry_client(platform.registry.url))
    plain = Producer(kafka)
    plain.produce(where.topic, codec.encode(PODS, example_events()[PODS]), partition=where.partition)
    plain.flush(30)
    with (config_file.parent / f"{group}.log").open("ab") as log:
        spawned.append(
            subprocess.Popen(
                gpulens(config_file, "sink"),
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "GPULENS_SINK__GROUP_ID": group},
            )
        )

    def committed_and_end() -> tuple[int, int]:
        return offsets(kafka, group, [where])[(where.topic, where.partition)]

    wait_until(lambda: operator.eq(*committed_and_end()), 120, f"{group} past the pod event")
    before = committed_and_end()[1]
    producer = Producer({**kafka, "transactional.id": group})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(where.topic, b"not avro", partition=where.partition)
    producer.commit_transaction(30)
    assert committed_and_end()[1] == before + 2, "the record and the transaction's marker"
    wait_until(lambda: operator.eq(*committed_and_end()), 60, f"{group} past the transaction")


def test_a_broker_that_does_not_answer_for_a_while_does_not_end_the_wait(
    platform: GPULensSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """`gpulens up` waits for the pipeline to drain: a broker busy past the lag's 10-s timeout
    (a save on a loaded machine) is asked again, not the end of `gpulens up`."""
    broker = manager(platform).status(BROKER).pid
    assert broker is not None
    os.killpg(broker, signal.SIGSTOP)
    resume = threading.Timer(12, os.killpg, (broker, signal.SIGCONT))
    resume.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gpulens.draining"):
            wait_drained(platform, timeout_s=20)
    finally:
        resume.cancel()
        os.killpg(broker, signal.SIGCONT)
    assert "the pipeline's lag is unknown for now, asking again" in caplog.text
