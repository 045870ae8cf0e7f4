"""`gpulens tables` (faust) throughput on pod events, beside a bare consumer baseline.

    python -m bench.tables_throughput [--events 20000] [--pods 2000]

Starts a private platform (noida-db broker on the same cores), publishes ``--events`` pod
events over ``--pods`` pods, each owned by a ReplicaSet of a Deployment (so every event also
goes through the workload path: forwarded by owner, two workload states), then runs
`gpulens tables` as a subprocess from an empty group and times it until the pods state topic
holds one committed row per event (read_committed). Wall time counts from the process start
(startup and recovery of empty stores included, a few seconds); CPU is the process's own
(/proc/PID/stat, all its threads). The baseline is a plain confluent-kafka consumer decoding
the same events in this process. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.e2e_probes import usage
from gpulens.config import GPULensSettings
from gpulens.platform import private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import OwnerReference, PodEvent
from gpulens.schemas.model.topics import PODS, STATE_PODS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

PHASES = ("Pending", "Running", "Running", "Succeeded")


def pod_events(count: int, pods: int) -> list[PodEvent]:
    """``count`` pod events over ``pods`` pods of 20 Deployments, each pod walking its phases."""
    template = example_events("bench-tables")[PODS]
    assert isinstance(template, PodEvent)
    start = datetime.now(UTC) - timedelta(hours=1)
    events = []
    for n in range(count):
        uid, deployment = f"pod-{n % pods}", n % pods % 20
        owners = [
            OwnerReference(
                kind="ReplicaSet", api_version="apps/v1", name=f"rs-{deployment}", uid=f"rs-{deployment}"
            ),
            OwnerReference(
                kind="Deployment", api_version="apps/v1", name=f"d-{deployment}", uid=f"d-{deployment}"
            ),
        ]
        phase = PHASES[min(n // pods, len(PHASES) - 1)]
        events.append(
            template.model_copy(
                update={
                    "event_id": f"e{n}",
                    "event_time": start + timedelta(milliseconds=n),
                    "uid": uid,
                    "name": uid,
                    "phase": phase,
                    "node": None if phase == "Pending" else "node-a",
                    "owners": owners,
                }
            )
        )
    return events


def committed_rows(spec: TopicSpec, consumer: Consumer) -> int:
    """Records of ``spec`` a read_committed reader sees now (each call reads from offset 0)."""
    consumer.assign([TopicPartition(spec.name, p, 0) for p in range(spec.partitions)])
    ends: set[int] = set()
    rows = 0
    while len(ends) < spec.partitions:
        for message in consumer.consume(10_000, 1.0):
            error = message.error()
            if error is None:
                rows += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                partition = message.partition()
                assert partition is not None, "a partition EOF names its partition"
                ends.add(partition)
    consumer.unassign()
    return rows


def baseline(settings: GPULensSettings, codec: AvroCodec, expected: int) -> tuple[float, float]:
    """(wall s, CPU s) of a plain consumer decoding the pod events."""
    consumer = Consumer(
        settings.kafka.librdkafka(**{"group.id": "bench-baseline", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(PODS.name, p, 0) for p in range(PODS.partitions)])
    seen = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while seen < expected:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                codec.decode(PODS, message.value() or b"", PodEvent)
                seen += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    consumer.close()
    return wall, cpu


def row(name: str, events: int, wall: float, cpu: float) -> str:
    return f"{name:<38} {events:>8,} {wall:>8.2f} {cpu:>8.2f} {events / wall:>10,.0f} {events / cpu:>10,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--pods", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, private_platform(Path(directory)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        events = pod_events(args.events, args.pods)
        publisher = EventPublisher(settings.kafka, codec)
        for event in events:
            publisher.publish(PODS, event)
        publisher.flush()
        config = settings.platform.state_dir.parent / "gpulens.toml"
        command = [sys.executable, "-m", "gpulens", "--config", str(config), "tables", "--group", "bench"]
        command += ["--data-dir", str(Path(directory) / "stores"), "--web-port", "16166"]
        reader = Consumer(
            settings.kafka.librdkafka(
                **{
                    "group.id": "bench-reader",
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                }
            )
        )
        with (Path(directory) / "tables.log").open("wb") as log:
            started = time.perf_counter()
            process = subprocess.Popen(command, stdout=log, stderr=log)
            try:
                while (rows := committed_rows(STATE_PODS, reader)) < len(events):
                    if process.poll() is not None:
                        raise SystemExit(f"gpulens tables stopped: {log.name}")
                    print(f"  {time.perf_counter() - started:6.1f} s  {rows:>7,} rows", flush=True)
                    time.sleep(2)
                wall = time.perf_counter() - started
                cpu = getattr(usage([process.pid]), "cpu_s", float("nan"))
            finally:
                process.terminate()
                process.wait(120)
        reader.close()
        base_wall, base_cpu = baseline(settings, codec, len(events))
        print(f"{'':<38} {'events':>8} {'wall s':>8} {'CPU s':>8} {'events/s':>10} {'per CPU-s':>10}")
        print(row("gpulens tables (faust, exactly_once)", len(events), wall, cpu))
        print(row("baseline: consume + decode", len(events), base_wall, base_cpu))


if __name__ == "__main__":
    main()
