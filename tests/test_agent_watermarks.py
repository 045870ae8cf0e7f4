"""`gpulens agent` vouches for its progress with watermarks, and only for what the broker has.

The agent runs as a process (bench.agent_with_fakes: the real entry point with the fake amdsmi)
pointed at a broker address where nothing listens yet; a broker is then started there. What it
published is read back from that broker with each record's produce time: the agent's own
clock (the wall clock) stamps both its records and its watermarks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from hostile_support import metric, wait

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import GpuSampleBatch, Watermark
from gpulens.schemas.model.topics import DEVICE_INVENTORY, GPU_HEALTH, GPU_SAMPLES, WATERMARKS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

ROOT = Path(__file__).resolve().parent.parent
INTERVAL_S = 0.2


class Log:
    """Everything of one cluster on some topics of a broker, with produce times (ms)."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec, cluster: str, topics: tuple[TopicSpec, ...]):
        self._codec, self._cluster = codec, cluster
        self._specs = {spec.name: spec for spec in topics}
        self._consumer = Consumer(
            kafka.librdkafka(**{"group.id": "agent-watermarks", "enable.auto.commit": False})
        )
        metadata = self._consumer.list_topics(timeout=10).topics
        self._consumer.assign([TopicPartition(t, p, 0) for t in self._specs for p in metadata[t].partitions])
        self.records: list[tuple[int, Any]] = []

    def read(self) -> list[tuple[int, Any]]:
        for message in self._consumer.consume(1000, timeout=0.2):
            if message.error() is None:
                record = self._codec.decode(self._specs[message.topic()], message.value())
                if record.cluster == self._cluster:
                    self.records.append((message.timestamp()[1], record))
        return self.records

    def read_to_end(self, timeout: float = 30) -> list[tuple[int, Any]]:
        """Everything up to the partitions' end offsets now (two topics fill apart: a short read
        can hold a round's watermark and not yet its samples)."""
        assigned = self._consumer.assignment()
        ends = {
            (tp.topic, tp.partition): self._consumer.get_watermark_offsets(tp, timeout=10)[1]
            for tp in assigned
        }
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(assigned)}
            if all(at[where] >= end for where, end in ends.items() if end > 0):
                return self.records
            self.read()
        raise AssertionError(f"not read to the end offsets {ends} within {timeout} s")

    def marks(self) -> list[tuple[int, Watermark]]:
        return [(at, r) for at, r in self.read() if isinstance(r, Watermark)]

    def close(self) -> None:
        self._consumer.close()


def test_the_agent_vouches_only_for_records_the_broker_acknowledged(
    config_file, codec, unique, tmp_path, spawned
) -> None:
    cluster, node, port, metrics_port = f"agent-wm-{unique}", f"node-{unique}", free_port(), free_port()
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}")
    env = {
        **os.environ,
        "GPULENS_CONFIG": str(config_file),
        "GPULENS_CLUSTER": cluster,
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "NODE_NAME": node,
        "GPULENS_AGENT__COLLECTORS": json.dumps(["amd"]),
        "GPULENS_AGENT__SAMPLE_INTERVAL_S": str(INTERVAL_S),
        "GPULENS_AGENT__WATERMARK_INTERVAL_S": "0.3",
        "GPULENS_AGENT__DELIVERY_TIMEOUT_S": "1",
        "GPULENS_AGENT__SPOOL_DIR": str(tmp_path / "spool"),
        "GPULENS_AGENT__METRICS_PORT": str(metrics_port),
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "bench.agent_with_fakes", "amd", "agent"], env=env, cwd=ROOT
    )
    spawned.append(agent)
    # the broker is away: rounds time out into the spool
    wait(
        lambda: metric(metrics_port, "gpulens_agent_spool_records") >= 8,
        30,
        "rounds spooled while the broker is away",
        agent,
    )
    back = datetime.now(UTC)
    services = ServiceManager(tmp_path / "broker")
    services.start(
        ServiceSpec("kafka", noida_argv("127.0.0.1", port, tmp_path / "broker" / "data"), "127.0.0.1", port)
    )
    try:
        create_topics(kafka)
        log = Log(kafka, codec, cluster, (GPU_SAMPLES, DEVICE_INVENTORY, GPU_HEALTH, WATERMARKS))
        wait(lambda: len(log.marks()) >= 4, 30, "four watermarks once the broker is there", agent)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
        records = log.read_to_end()
        log.close()
    finally:
        services.stop("kafka")

    marks = [(at, m) for at, m in records if isinstance(m, Watermark)]
    data = [(at, r) for at, r in records if not isinstance(r, Watermark)]
    assert {m.source for _, m in marks} == {f"node-agent/{node}"}
    assert {r.source for _, r in data} == {f"node-agent/{node}"}, "records and watermarks: one source"
    made_away = [r for _, r in data if r.event_time < back]
    assert len(made_away) >= 5, "rounds were made while the broker was away"
    times = [m.event_time for _, m in marks]
    assert times == sorted(set(times)), "each watermark vouches for a later instant"
    assert min(times) >= back - timedelta(seconds=INTERVAL_S), "nothing vouched for while the broker was away"
    samples = {r.event_time for _, r in data if isinstance(r, GpuSampleBatch)}
    assert set(times) <= samples, "each watermark is the time of a round it sent"
    for produced, mark in marks:
        below = [at for at, r in data if r.event_time < mark.event_time]
        assert max(below) <= produced, f"a record below {mark.event_time} was produced after it"
