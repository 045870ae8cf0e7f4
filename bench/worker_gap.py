"""A large cluster whose data resumes after a long gap: the worker's peak RSS, rate, and SIGTERM.

    python -m bench.worker_gap [--nodes 1250] [--gap-hours 24] [--term-after 60]

On a private platform: ``--nodes`` nodes of 8 GPUs, each full with one pod, then, ``--gap-hours``
later, one pod deleted and the source's final watermark. ``gpulens worker --window 30
--processors allocation`` (node and overview rows) must then write every window of the gap:
2,880 windows x 1,250 node rows = 3.6 M rows for a day. With ``--term-after S`` the worker gets
SIGTERM S seconds into the gap, the time to exit is measured, and a second worker of the same
group finishes the gap. Prints the worker's peak RSS (VmHWM), rows/s, the time to exit, and
the committed rows counted by content (a window written twice would count twice). Never asserts.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.platform import private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import ChangeType, NodeEvent, PodEvent, Watermark
from gpulens.schemas.model.topics import (
    CLUSTER_ALLOCATION,
    CLUSTER_OVERVIEW,
    NODE_ALLOCATION,
    NODES,
    PODS,
    WATERMARKS,
    entity_key,
)
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

START = datetime(2024, 3, 1, tzinfo=UTC)
CLUSTER = "gap"


def publish(settings: GPULensSettings, codec: AvroCodec, nodes: int, gap: timedelta) -> None:
    producer = Producer(settings.kafka.librdkafka(**{"linger.ms": 20}))
    base = example_events(CLUSTER, source="gap", at=START)
    node_base, pod_base = base[NODES], base[PODS]
    assert isinstance(node_base, NodeEvent) and isinstance(pod_base, PodEvent)
    records = [
        (NODES, node_base.model_copy(update={"event_id": f"n{n}", "node": f"n{n:05d}"})) for n in range(nodes)
    ] + [
        (PODS, pod_base.model_copy(update={"event_id": f"p{n}", "uid": f"p{n}", "node": f"n{n:05d}"}))
        for n in range(nodes)
    ]
    end = START + gap
    records.append(
        (PODS, pod_base.model_copy(update={"event_id": "gone", "uid": "p0", "node": "n00000",
                                           "type": ChangeType.DELETED, "event_time": end}))
    )  # fmt: skip
    for spec, record in records:
        entity = record.node if isinstance(record, NodeEvent) else record.uid
        producer.produce(spec.name, key=entity_key(CLUSTER, entity), value=codec.encode(spec, record))
    final = Watermark(
        event_id=event_id(CLUSTER, "final"), cluster=CLUSTER, event_time=end, source="gap", final=True
    )
    producer.produce(WATERMARKS.name, key=CLUSTER.encode(), value=codec.encode(WATERMARKS, final))
    assert producer.flush(60) == 0


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(config: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gpulens", "--config", str(config), "worker", "--group", "gap",
               "--window", "30", "--processors", "allocation", "--source-timeout", "1"]  # fmt: skip
    with log.open("ab") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


class Counting:
    """Committed output rows, counted, and distinct by content."""

    def __init__(self, settings: GPULensSettings) -> None:
        self._consumer = Consumer(
            settings.kafka.librdkafka(**{"group.id": "gap-count", "isolation.level": "read_committed"})
        )
        specs = (CLUSTER_ALLOCATION, NODE_ALLOCATION, CLUSTER_OVERVIEW)
        self._consumer.assign([TopicPartition(s.name, p, 0) for s in specs for p in range(s.partitions)])
        self.rows = 0
        self.distinct: set[int] = set()

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for message in self._consumer.consume(50_000, 0.2):
                if message.error() is None:
                    self.rows += 1
                    self.distinct.add(hash(message.value()))

    def close(self) -> None:
        self._consumer.close()


def watch(
    process: subprocess.Popen[bytes], counting: Counting, expected: int, until_s: float | None
) -> float:
    """Count rows while ``process`` runs, until every row came or ``until_s`` passed; peak RSS."""
    began, peak = time.monotonic(), 0.0
    while process.poll() is None and len(counting.distinct) < expected:
        counting.poll(1.0)
        peak = max(peak, vm_hwm_mb(process.pid))
        if until_s is not None and time.monotonic() - began >= until_s:
            break
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--gap-hours", type=float, default=24.0)
    parser.add_argument("--term-after", type=float, default=None, help="SIGTERM this many s into the gap.")
    args = parser.parse_args()
    gap = timedelta(hours=args.gap_hours, seconds=10)
    windows = int(gap.total_seconds() // 30) + 1
    expected = windows * (args.nodes + 2)  # node rows, cluster row and overview row per window
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        publish(settings, AvroCodec(registry_client(settings.registry.url)), args.nodes, gap)
        config, log = Path(tmp) / "gpulens.toml", Path(tmp) / "worker.log"
        counting = Counting(settings)
        began = time.monotonic()
        first = worker(config, log)
        peak = watch(first, counting, expected, args.term_after)
        if first.poll() is None and len(counting.distinct) < expected:
            asked = time.monotonic()
            first.send_signal(signal.SIGTERM)
            first.wait(120)
            print(f"SIGTERM after {asked - began:.0f} s, {counting.rows:,} rows committed: "
                  f"exited ({first.returncode}) in {time.monotonic() - asked:.2f} s", flush=True)  # fmt: skip
            second = worker(config, log)
            peak = max(peak, watch(second, counting, expected, None))
            second.terminate()
            second.wait(60)
        else:
            first.terminate()
            first.wait(60)
        took = time.monotonic() - began
        counting.poll(3.0)  # a row written twice would still come
        counting.close()
        print(f"{args.nodes} nodes, {windows:,} windows: {counting.rows:,} rows committed "
              f"({len(counting.distinct):,} distinct, {expected:,} expected) in {took:.0f} s "
              f"({counting.rows / took:,.0f} rows/s); worker peak RSS (VmHWM) {peak:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
