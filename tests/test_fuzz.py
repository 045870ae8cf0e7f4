"""Fuzz: 200,000 malformed records mixed with a valid replay on the input topics, while the
worker, the sink and the exporter run. Nothing exits or restarts, every bad record is
dead-lettered by every consumer reading its topic, with the reason it was made for, and the
valid cluster's rows equal the oracle's (computed from the CSV, as for a clean run)."""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from hostile_support import DeadLetterReader, metric, peak_rss_mb, start, wait
from trace_slices import head_of

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.prometheus import EXPORTED_TOPICS
from gpulens.platform import free_port
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.model.exceptions import DecodeFailure
from gpulens.schemas.model.models import Alert, AlertState, Event, GpuSampleBatch, NodeEvent, PodEvent
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    GPU_SAMPLES,
    NODES,
    PODS,
    TopicSpec,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

JUNK_TOPICS = (PODS, NODES, GPU_SAMPLES, ALERTS)
"""The worker's inputs, and one of the exporter's (it reads the worker's outputs, not samples)."""
GARBAGE_PER_TOPIC = 50_000
HOUR = 3600
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
VALID = "fuzz-valid"
JUNK = "fuzz-junk"
WORKER_READS = {PODS.name, NODES.name, GPU_SAMPLES.name}
"""Of the junk topics, those `gpulens worker --processors allocation` reads (its cluster
overview counts GPUs in use from the samples)."""
EXPORTER_READS = {t.name for t in EXPORTED_TOPICS} & {t.name for t in JUNK_TOPICS}
RSS_LIMIT_MB = 1024


def _template(spec: TopicSpec) -> Event:
    """A valid record of ``spec`` in the junk cluster (the examples have no alert)."""
    if spec is ALERTS:
        at = datetime(2026, 11, 1, 12, tzinfo=UTC)
        return Alert(
            event_id=f"{JUNK}/alert", cluster=JUNK, event_time=at, source="fuzz", alert="GpuIdle",
            state=AlertState.OPENED, entity="gpu-0", since=at, message="GpuIdle gpu-0",
        )  # fmt: skip
    return example_events(JUNK)[spec]


def _garbage(codec: AvroCodec, spec: TopicSpec, rnd: random.Random) -> list[tuple[bytes, str]]:
    """Undecodable values of every kind, each with the reason it must be dead-lettered with."""
    header = struct.pack(">bI", 0, codec.schema_id(spec))
    valid = codec.encode(spec, _template(spec))
    out: list[tuple[bytes, str]] = []
    for i in range(GARBAGE_PER_TOPIC):
        kind = i % 4
        if kind == 0:
            out.append(
                (bytes([rnd.randrange(1, 256)]) + rnd.randbytes(rnd.randrange(4, 60)), "bad-magic-byte")
            )
        elif kind == 1:
            out.append((rnd.randbytes(rnd.randrange(0, 5)), "truncated-header"))
        elif kind == 2:
            out.append((header + b"\xff\xfe garbage \x00\x01", "avro-decode-error"))
        else:  # a valid record cut short
            out.append((valid[: rnd.randrange(6, len(valid) - 1)], "avro-decode-error"))
    out.append((struct.pack(">bI", 0, 999_999) + b"\x00", DecodeFailure.UNKNOWN_SCHEMA_ID.value))
    out.append((b"\x07" + rnd.randbytes(999_000 - 1), "bad-magic-byte"))  # oversize
    return out


def _invalid(codec: AvroCodec, spec: TopicSpec) -> list[bytes]:
    """Valid Avro breaking the models' rules: NaN, infinity, out of range, far-off times."""
    template = _template(spec)
    far = [datetime(2200, 1, 1, tzinfo=UTC), datetime(1970, 1, 2, tzinfo=UTC)]
    if isinstance(template, PodEvent):
        bad = [template.model_copy(update={"gpu_amount": v}) for v in (-1.0, math.nan, math.inf)]
    elif isinstance(template, NodeEvent):
        resource = next(iter(template.gpu_capacity))
        bad = [template.model_copy(update={"gpu_capacity": {resource: v}}) for v in (-8.0, math.nan)]
    elif isinstance(template, Alert):
        bad = [template.model_copy(update={"since": at}) for at in far]
    else:
        assert isinstance(template, GpuSampleBatch)
        gpu = template.samples[0]
        bad = [
            template.model_copy(update={"samples": [gpu.model_copy(update={"utilization_pct": v})]})
            for v in (math.nan, math.inf, -1.0, 100.5)
        ]
    bad += [template.model_copy(update={"event_time": at}) for at in far]
    # model_copy does not validate: the bytes are what a buggy producer would write
    return [codec.encode(spec, record) for record in bad]


def _replay(config: Path, pods_csv: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "gpulens", "--config", str(config), "replay", "alibaba-v2023",
             "--pods", str(pods_csv)],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "GPULENS_CLUSTER": VALID},
        )  # fmt: skip


def _cluster_rows(settings, codec: AvroCodec) -> list:
    """The valid cluster's committed rows, read up to the partition's end (a read_committed
    consumer's end is the last stable offset: no wait for a quiet spell)."""
    consumer = Consumer(
        settings.kafka.librdkafka(
            **{"group.id": "fuzz-rows", "isolation.level": "read_committed", "enable.partition.eof": True}
        )
    )
    consumer.assign([TopicPartition(CLUSTER_ALLOCATION.name, 0, 0)])
    rows, at_end = [], False
    try:
        while not at_end:
            for m in consumer.consume(10_000, 1.0):
                if m.error() is not None:
                    at_end = at_end or m.error().code() == KafkaError._PARTITION_EOF
                elif m.key() == VALID.encode():
                    rows.append(codec.decode(CLUSTER_ALLOCATION, m.value() or b""))
    finally:
        consumer.close()
    return rows


@pytest.mark.timeout(900)
def test_junk_mixed_with_a_replay_is_dead_lettered_and_the_valid_rows_are_exact(
    own_platform, own_codec, tmp_path, spawned
) -> None:
    settings, config = own_platform
    codec = own_codec
    # 300 pods span the trace's 3,585 hourly windows, as all 8,152 do
    pods_csv = head_of(
        traces_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv", 300, tmp_path / "pods.csv"
    )

    port_worker, port_sink, port_exporter = free_port(), free_port(), free_port()
    worker = start(
        config, tmp_path / "worker.log", "worker", "--processors", "allocation", "--window", str(HOUR),
        "--no-nodes", "--group", "fuzz-worker", "--metrics-port", str(port_worker),
    )  # fmt: skip
    sink = start(
        config, tmp_path / "sink.log", "sink", "--group", "fuzz-sink", "--metrics-port", str(port_sink)
    )
    exporter = start(
        config,
        tmp_path / "exporter.log",
        "exporter",
        "--group",
        "fuzz-exporter",
        "--port",
        str(port_exporter),
    )
    processes = [worker, sink, exporter]
    spawned += processes
    # the exporter is up first: it reads the junk on the alerts from the start
    wait(lambda: metric(port_exporter, "gpulens_exporter_restored") == 1, 120, "the exporter", *processes)

    # junk first, the valid replay while the junk is read, more junk after it
    rnd = random.Random(2026)
    injected: Counter[tuple[str, str]] = Counter()
    producer = Producer(settings.kafka.librdkafka(**{"linger.ms": 20, "message.max.bytes": 1_000_000}))
    plan = []
    for spec in JUNK_TOPICS:
        plan += [(spec, value, reason) for value, reason in _garbage(codec, spec, rnd)]
        plan += [(spec, value, DecodeFailure.INVALID_RECORD.value) for value in _invalid(codec, spec)]
    rnd.shuffle(plan)
    # a producer bug: ten pod events whose ids come again with other content (the sink keeps
    # the first; the worker applies both, to the junk cluster)
    template = example_events(JUNK)[PODS]
    for n in range(10):
        first = template.model_copy(update={"event_id": f"dup-{n}", "uid": f"dup-{n}", "name": f"dup-{n}"})
        again = first.model_copy(update={"gpu_amount": first.gpu_amount + 1})
        producer.produce(PODS.name, key=record_key(PODS, first), value=codec.encode(PODS, first))
        plan.append((PODS, codec.encode(PODS, again), "conflicting-duplicate"))
    half = len(plan) // 2
    for spec, value, reason in plan[:half]:
        produce_with_backpressure(producer, spec.name, key=JUNK.encode(), value=value)
        injected[(spec.name, reason)] += 1
    assert producer.flush(120) == 0
    replay = _replay(config, pods_csv, tmp_path / "replay.log")
    for spec, value, reason in plan[half:]:
        produce_with_backpressure(producer, spec.name, key=JUNK.encode(), value=value)
        injected[(spec.name, reason)] += 1
    assert producer.flush(120) == 0
    assert replay.wait(300) == 0
    assert sum(injected.values()) >= 200_000

    expected: Counter[tuple[str, str]] = Counter()
    for (topic, reason), count in injected.items():
        expected[("fuzz-sink", reason)] += count
        if reason == "conflicting-duplicate":
            continue  # valid records to anyone but the sink
        if topic in WORKER_READS:
            expected[("fuzz-worker", reason)] += count
        if topic in EXPORTER_READS:
            expected[("fuzz-exporter", reason)] += count
    reader = DeadLetterReader(settings, codec, decode_every=10_000)
    try:
        wait(lambda: reader.read() >= sum(expected.values()), 600, "every dead letter", *processes)
        reader.read()  # more would be a record dead-lettered twice
    finally:
        reader.close()
    got = Counter((h["consumer"].decode(), h["reason"].decode()) for h in reader.headers)
    assert got == expected, "every bad record dead-lettered once by every consumer reading it, for its reason"

    oracle = expected_rows(pods_csv, HOUR)
    wait(
        lambda: len(_cluster_rows(settings, codec)) >= len(oracle),
        300,
        "the valid cluster's rows",
        *processes,
    )
    rows = _cluster_rows(settings, codec)
    assert [int((r.window_start - EPOCH).total_seconds()) for r in rows] == [e.window_start for e in oracle]
    for field in ("gpus_allocated_avg", "gpus_allocated_max", "gpus_allocated_end"):
        assert [getattr(r, field) for r in rows] == pytest.approx(
            [getattr(e, field) for e in oracle], abs=1e-6
        )

    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    published = sum(1 for _ in _pod_keys(settings))
    wait(
        lambda: (
            client.query(
                "SELECT count() FROM pod_events WHERE cluster = {c:String}", parameters={"c": VALID}
            ).result_rows[0][0]
            == published
        ),
        300,
        "every valid pod event stored",
        *processes,
    )
    assert metric(port_exporter, "gpulens_exporter_records_in_total") > 0, "the exporter answers scrapes"
    for process in processes:
        assert process.poll() is None, f"{process.args} stays up"
        assert peak_rss_mb(process.pid) < RSS_LIMIT_MB, (
            f"{process.args}: peak RSS {peak_rss_mb(process.pid):.0f} MB"
        )
    assert metric(port_worker, "gpulens_worker_records_in_total") > 0
    assert metric(port_sink, "gpulens_dead_letters_total") == sum(
        v for (c, _), v in expected.items() if c == "fuzz-sink"
    )


def _pod_keys(settings) -> Iterator[bytes]:
    """Keys of the valid cluster's pod events on the pods topic, read straight from the broker."""
    consumer = Consumer(settings.kafka.librdkafka(**{"group.id": "fuzz-pods", "enable.partition.eof": True}))
    consumer.assign([TopicPartition(PODS.name, p, 0) for p in range(PODS.partitions)])
    ends: set[int] = set()
    try:
        while len(ends) < PODS.partitions:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    ends.add(message.partition() or 0)
                elif (message.key() or b"").startswith(f"{VALID}/".encode()):
                    yield message.key() or b""
    finally:
        consumer.close()
