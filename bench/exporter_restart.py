"""How fast a restarted exporter answers and catches up (printed, never asserted).

    python -m bench.exporter_restart [--nodes N] [--rounds R] [--backlog-rounds B]

Starts a private platform. Publishes R rounds of a fleet of N nodes (8 GPUs each): per round
one cluster row, one node row and one sample batch per node, and a workload row per 4 nodes.
Then:

1. a new exporter (`gpulens exporter`, its own group) reads it and checkpoints;
2. it is killed with SIGKILL, B rounds of samples pile up (the backlog of a downtime under
   load), and it is started again: time to the first answered scrape, to
   ``gpulens_exporter_restored`` = 1 and to no lag, the state log's restore, the records read;
3. for comparison, the former start (every topic from the beginning, samples included): a
   new group with a sample tail longer than the topic.

Times are from spawning the process; its interpreter start (imports) is part of them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer
from prometheus_client.parser import text_string_to_metric_families

from gpulens.consumers.prometheus import EXPORTED_TOPICS
from gpulens.consumers.prometheus.checkpointing import state_log_topic
from gpulens.platform import free_port, private_platform
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.state_log import StateLog
from gpulens.schemas.kafka.topic_admin import create_topics, topic_partitions
from gpulens.schemas.model.models import (
    ClusterGpuAllocation,
    GpuSample,
    GpuSampleBatch,
    NodeGpuAllocation,
    WorkloadGpuUsage,
)
from gpulens.schemas.model.topics import (
    CLUSTER_ALLOCATION,
    GPU_SAMPLES,
    NODE_ALLOCATION,
    WORKLOAD_USAGE,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec, registry_client

T0 = datetime(2024, 5, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=30)
CLUSTER = "bench"


def fleet_round(
    codec: AvroCodec, nodes: int, r: int, *, samples_only: bool = False
) -> list[tuple[str, bytes, bytes]]:
    """One round as (topic, key, value)."""
    start, out = T0 + r * WINDOW, []
    batches = [
        GpuSampleBatch(
            event_id=f"s/{n}/{r}",
            cluster=CLUSTER,
            event_time=start,
            source="bench",
            node=f"node-{n}",
            samples=[
                GpuSample(
                    device_id=f"gpu-{n}-{i}",
                    index=i,
                    utilization_pct=float((n + i + r) % 100),
                    power_watts=300.0,
                    memory_used_bytes=1 << 30,
                )
                for i in range(8)
            ],
        )
        for n in range(nodes)
    ]
    out += [(GPU_SAMPLES.name, record_key(GPU_SAMPLES, b), codec.encode(GPU_SAMPLES, b)) for b in batches]
    if samples_only:
        return out
    window_end = start + WINDOW
    cluster = ClusterGpuAllocation(
        event_id=f"c/{r}",
        cluster=CLUSTER,
        window_start=start,
        window_end=window_end,
        gpu_capacity=8.0 * nodes,
        gpus_allocated_avg=4.0 * nodes,
        gpus_allocated_max=4.0 * nodes,
        gpus_allocated_end=4.0 * nodes,
        allocation_rate_avg=0.5,
        pods_running_end=nodes,
        pods_pending_end=0,
    )
    out.append(
        (
            CLUSTER_ALLOCATION.name,
            record_key(CLUSTER_ALLOCATION, cluster),
            codec.encode(CLUSTER_ALLOCATION, cluster),
        )
    )
    for n in range(nodes):
        node = NodeGpuAllocation(
            event_id=f"n/{n}/{r}",
            cluster=CLUSTER,
            node=f"node-{n}",
            window_start=start,
            window_end=window_end,
            gpu_capacity=8.0,
            gpus_allocated_avg=4.0,
            gpus_allocated_max=8.0,
            gpus_allocated_end=4.0,
            allocation_rate_avg=0.5,
            pods_running_end=1,
        )
        out.append(
            (NODE_ALLOCATION.name, record_key(NODE_ALLOCATION, node), codec.encode(NODE_ALLOCATION, node))
        )
    for w in range(nodes // 4):
        usage = WorkloadGpuUsage(
            event_id=f"w/{w}/{r}",
            cluster=CLUSTER,
            workload_uid=f"w{w}",
            workload_kind="Job",
            workload_name=f"w{w}",
            namespace="ml",
            window_start=start,
            window_end=window_end,
            gpus_allocated_avg=4.0,
            gpus_allocated_max=4.0,
            gpus_allocated_end=4.0,
            utilization_avg=50.0,
            utilization_max=60.0,
            samples=10,
            pods_active_end=1,
        )
        out.append(
            (WORKLOAD_USAGE.name, record_key(WORKLOAD_USAGE, usage), codec.encode(WORKLOAD_USAGE, usage))
        )
    return out


def produce(producer: Producer, records: list[tuple[str, bytes, bytes]]) -> None:
    for topic, key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def metrics(port: int) -> tuple[float, dict[str, float]] | None:
    """Seconds the scrape took to answer, and every sample summed by name; None while nothing answers."""
    asked = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            text = response.read().decode()
    except OSError:
        return None
    answered = time.monotonic() - asked
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return answered, totals


def wait_checkpointed(kafka: KafkaSettings, group: str) -> None:
    """Until the exporter's state log holds the end offset of every partition it reads."""
    probe = Consumer(kafka.librdkafka(**{"group.id": "bench-probe"}))
    ends = {
        (tp.topic, tp.partition): probe.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        for tp in topic_partitions(kafka, EXPORTED_TOPICS, offset=0)
    }
    probe.close()
    while True:
        entries = StateLog(kafka, state_log_topic(group)).restore().entries
        offsets = {tuple(json.loads(k))[1:]: int(v) for k, v in entries.items() if k.startswith(b'["offset"')}
        if all(offsets.get(p, 0) >= end for p, end in ends.items()):
            return
        time.sleep(0.5)


def run(config: Path, group: str, env: dict[str, str], label: str) -> subprocess.Popen[bytes]:
    """Start an exporter, print its start figures once it has caught up; the running process."""
    port = free_port()
    spawned = time.monotonic()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens",
            "--config",
            str(config),
            "exporter",
            "--port",
            str(port),
            "--group",
            group,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    first = restored = None
    slowest = 0.0
    deadline = spawned + 600
    while True:
        assert time.monotonic() < deadline, f"{label}: not caught up within 600 s"
        got = metrics(port)
        now = time.monotonic() - spawned
        if got is not None:
            answered, m = got
            slowest = max(slowest, answered)
            first = first if first is not None else now
            if restored is None and m.get("gpulens_exporter_restored") == 1:
                restored = now
            if restored is not None and m.get("gpulens_consumer_lag_records", 1) == 0:
                break
        time.sleep(0.05)
    print(
        f"{label}: first scrape answered {first:.2f} s after spawn, restored {restored:.2f} s, caught up "
        f"{now:.2f} s; slowest scrape {slowest:.3f} s; state log: "
        f"{m['gpulens_exporter_restored_series']:.0f} series in "
        f"{m['gpulens_exporter_restore_seconds']:.2f} s; records read after it "
        f"{m.get('gpulens_exporter_records_in_total', 0):.0f}, sample records skipped "
        f"{m['gpulens_exporter_sample_records_skipped']:.0f}"
    )
    return process


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backlog-rounds", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        config = Path(tmp) / "gpulens.toml"
        codec = AvroCodec(registry_client(settings.registry.url))
        producer = Producer(settings.kafka.librdkafka(**{"linger.ms": 20}))
        for r in range(args.rounds):
            produce(producer, fleet_round(codec, args.nodes, r))
        history = args.rounds * (args.nodes * 2 + args.nodes // 4 + 1)
        print(f"history: {history} records ({args.nodes} nodes x 8 GPUs, {args.rounds} rounds)")
        env = {"GPULENS_EXPORTER__CHECKPOINT_INTERVAL_S": "1", "GPULENS_EXPORTER__LAG_INTERVAL_S": "0.5"}

        first = run(config, "bench-exporter", env, "new group")
        wait_checkpointed(settings.kafka, "bench-exporter")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        last = fleet_round(codec, args.nodes, args.rounds, samples_only=True)
        produce(producer, last * args.backlog_rounds)
        print(f"downtime backlog: {len(last) * args.backlog_rounds} sample records")
        restarted = run(config, "bench-exporter", env, "restart after SIGKILL")
        replay = run(
            config,
            "bench-exporter-replay",
            {**env, "GPULENS_EXPORTER__SAMPLE_TAIL_RECORDS": str(10**9)},
            "former start (every topic from offset 0)",
        )
        for process in (restarted, replay):
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
