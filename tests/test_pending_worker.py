"""The `pending` processor as a process: killed mid-stream and restarted, it writes every verdict once.

A paced replay of the Alibaba pod list onto its first 20 nodes (all three reason classes occur
there, tests/test_pending_waits.py) runs into a `gpulens worker --processors pending` with
5-minute windows; the worker is killed (SIGKILL) while the replay still publishes, and a new one
of the same group goes on from its checkpoint. The committed rows of gpulens.agg.pending-gpu-pods.v1
must be the rows of the same events run through the processor in one go (whose verdicts
test_pending_waits checks against the CSV), each once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from trace_slices import head_of
from worker_support import EPOCH, PODS_CSV, TRACE, gpulens, replay, spawn, wait_reading, worker_metrics

from gpulens.config import GPULensSettings
from gpulens.pipeline.pending_waits import PendingWaits
from gpulens.pipeline.windows import TumblingWindows
from gpulens.platform import free_port
from gpulens.producers.replay import alibaba_v2023
from gpulens.schemas.model.models import PendingGpuPod
from gpulens.schemas.model.topics import PENDING_PODS
from gpulens.schemas.wire.codec import AvroCodec

WINDOW_S = 300
PACED_SPEED = "250000"
"""Trace seconds per wall second: the trace's 3,585 hours take 52 s. At 26 s the replay was once
over (full suite, busy machine) before the worker had written the 100 verdicts the kill waits for."""


def in_one_go(nodes: Path, cluster: str) -> list[PendingGpuPod]:
    events = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(nodes), alibaba_v2023.read_pods(PODS_CSV), cluster=cluster, epoch=EPOCH
    )
    waits, rows = PendingWaits(TumblingWindows(WINDOW_S * 1000)), []
    for _, event in events:
        rows += waits.process(event)
    return rows


def read_until(
    consumer: Consumer, codec: AvroCodec, rows: list[PendingGpuPod], count: int, deadline_s: float
) -> None:
    """Committed rows into ``rows`` until there are ``count`` or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while len(rows) < count and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                rows.append(codec.decode(PENDING_PODS, message.value()))


def test_a_pending_worker_killed_mid_stream_and_restarted_writes_each_verdict_once(
    own_platform: tuple[GPULensSettings, Path], own_codec: AvroCodec, tmp_path: Path
) -> None:
    platform, config = own_platform
    nodes = head_of(TRACE / "openb_node_list_gpu_node.csv", 20, tmp_path / "nodes.csv")
    expected = in_one_go(nodes, "pending-kill")
    assert len(expected) > 1000
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": "rows", "isolation.level": "read_committed"})
    )
    consumer.assign([TopicPartition(PENDING_PODS.name, p, 0) for p in range(PENDING_PODS.partitions)])
    worker = [
        *gpulens(config, "worker", "--window", str(WINDOW_S), "--processors", "pending", "--group", "g"),
        *("--idle-ms", "3000", "--source-timeout", "1"),
    ]
    started = []
    try:
        first = spawn(worker, tmp_path / "worker-1.log")
        started.append(first)
        wait_reading(first, tmp_path / "worker-1.log")
        replaying = replay(config, "pending-kill", "--nodes", str(nodes), "--speed", PACED_SPEED)
        started.append(replaying)
        rows: list[PendingGpuPod] = []
        read_until(consumer, own_codec, rows, 20, 120)  # early: the replay once ended before a 100th
        assert len(rows) >= 20, "the worker wrote verdicts before the kill"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        assert replaying.poll() is None, "the kill came mid-stream: the replay was still publishing"
        port = free_port()
        started.append(spawn([*worker, "--metrics-port", str(port)], tmp_path / "worker-2.log"))
        read_until(consumer, own_codec, rows, len(expected), 180)
        read_until(consumer, own_codec, rows, len(expected) + 1, 3)  # one more would be a duplicate
        # the ended waits the second worker processed (their figures: test_pending_waits)
        waits = worker_metrics(port)["gpulens_gpu_pod_wait_seconds_count"]
    finally:
        consumer.close()
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert len({r.event_id for r in rows}) == len(rows), "a verdict was published twice"
    gpu_pods = sum(1 for pod in alibaba_v2023.read_pods(PODS_CSV) if pod.gpu_amount > 0)
    assert 0 < waits <= gpu_pods, "each GPU pod's wait ends once"
    assert sorted(rows, key=lambda r: r.event_id) == sorted(expected, key=lambda r: r.event_id)
