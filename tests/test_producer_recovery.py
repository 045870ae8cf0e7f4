"""A producer survives its broker's SIGKILL: librdkafka's fatal error ends nothing, nothing is missing.

The embedded broker loses what it acknowledged since its last save when killed; the
idempotent producer then fails for good on the sequence gap. `gpulens simulate` must carry
on with a new producer and resend what the broker does not hold.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.infra.launching import State
from gpulens.platform import BROKER, manager, private_platform, service_specs
from gpulens.producers.simulate.simulating import ClusterSimulation
from gpulens.producers.simulate.specs import SimulationSpec
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import CATALOG, GPU_SAMPLES, WATERMARKS

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def own_platform(tmp_path: Path) -> Iterator[GPULensSettings]:
    """A private platform: its broker is killed here, never the session's."""
    with private_platform(tmp_path) as settings:
        create_topics(settings.kafka)
        yield settings


def on_broker(settings: GPULensSettings) -> Counter[str]:
    """Per catalog topic (watermarks aside): its distinct values, and the copies beyond them."""
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "recovery-test"})
    counts: Counter[str] = Counter()
    try:
        for spec in CATALOG:
            if spec is WATERMARKS:
                continue
            values = []
            for partition in range(spec.partitions):
                tp = TopicPartition(spec.name, partition)
                end = consumer.get_watermark_offsets(tp, timeout=10)[1]
                if end == 0:
                    continue
                consumer.assign([TopicPartition(spec.name, partition, OFFSET_BEGINNING)])
                while True:
                    message = consumer.poll(10)
                    assert message is not None, f"{spec.name}[{partition}] stopped before {end}"
                    if message.error() is None:
                        values.append(message.value())
                        if message.offset() + 1 >= end:
                            break
            counts[f"{spec.name} distinct"] = len(set(values))
            counts[f"{spec.name} duplicates"] = len(values) - len(set(values))
    finally:
        consumer.close()
    return counts


def test_simulate_survives_a_broker_sigkill_and_misses_nothing(own_platform: GPULensSettings) -> None:
    settings, cluster = own_platform, "recovery"
    spec = SimulationSpec(
        nodes=2, gpus_per_node=8, interval_s=0.5, start=START, duration_s=60, cluster=cluster
    )
    expected = Counter(f"{topic.name} distinct" for topic, _ in ClusterSimulation(spec).events())
    del expected[f"{WATERMARKS.name} distinct"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    config = settings.platform.state_dir.parent / "gpulens.toml"
    simulate = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "--config", str(config), "simulate", "--nodes", "2", "--interval",
         "0.5", "--duration", "60", "--speed", "5", "--start", "2026-01-01", "--cluster", cluster],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        services = manager(settings)
        samples = [TopicPartition(GPU_SAMPLES.name, p) for p in range(GPU_SAMPLES.partitions)]
        probe = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "probe"})
        deadline = time.monotonic() + 60
        while sum(probe.get_watermark_offsets(tp, timeout=10)[1] for tp in samples) < 10:
            assert time.monotonic() < deadline and simulate.poll() is None, "simulate published nothing"
        probe.close()
        pid = services.status(BROKER).pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while services.status(BROKER).state is State.RUNNING:
            assert time.monotonic() < deadline, "the broker outlived SIGKILL"
        services.reap(BROKER)
        services.start(service_specs(settings)[BROKER])
        out, err = simulate.communicate(timeout=180)
    finally:
        if simulate.poll() is None:
            simulate.kill()
            simulate.communicate()
    assert simulate.returncode == 0, err[-3000:]
    assert re.search(r"published [\d,]+ records", out)
    stored = on_broker(settings)
    distinct = Counter({k: v for k, v in stored.items() if k.endswith("distinct")})
    assert distinct == expected, "every record the simulation made is on the broker"
    assert "producer failed for good" in err, "the kill cost the producer its sequence: the case under test"
    resent = sum(
        int(a) + int(b) for a, b in re.findall(r"resending (\d+) unacknowledged records and (\d+)", err)
    )
    duplicates = sum(v for k, v in stored.items() if k.endswith("duplicates"))
    assert duplicates <= resent, "duplicates only among the records resent after the fatal error"
