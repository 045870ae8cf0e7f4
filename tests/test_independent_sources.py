"""Nodes, pods and samples from separate producer processes with random delays: same rows as the CSVs.

Each part of a replayed trace runs as a process of its own (as a cluster's node watcher, pod
watcher and node agents publish independently), started 0-5 s apart at random. The worker's
event time comes from the parts' watermarks, so the windows and alerts must equal the
oracles computed straight from the CSVs every time, with a CPU hog beside it, and no
state record may be dead-lettered as late.
"""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alert_oracle import SAMPLES, idle_alerts_from_csv
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, TopicPartition
from trace_slices import head_of

from gpulens.producers.replay import genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import Alert, ClusterGpuAllocation, DeadLetter
from gpulens.schemas.model.topics import ALERTS, CLUSTER_ALLOCATION, DLQ, GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec

PODS_CSV = traces_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
HOUR = 3600
LAUNCHER = Path(__file__).with_name("delayed_gpulens.py")
SOURCE_TIMEOUT_S = 30
"""Longer than the producers' start skew: 0-5 s of delay plus reading the trace on a busy machine
(at 15 s, a node part that spoke 15 s after its cluster's first source under a load of 10 was
judged absent, and every window of its cluster closed with no capacity)."""


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def delayed(
    config: Path, args: list[str], delay_s: float, log: Path, cluster: str
) -> subprocess.Popen[bytes]:
    """A ``gpulens`` process that runs ``args`` ``delay_s`` after it is told to go (a line on stdin)."""
    command = [sys.executable, str(LAUNCHER), f"{delay_s:.3f}", "--config", str(config), *args]
    with log.open("ab") as stderr:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "GPULENS_CLUSTER": cluster},
        )


class Outputs:
    """Committed allocation rows and alerts by cluster, and this worker's dead letters."""

    def __init__(self, platform, codec: AvroCodec, group: str) -> None:
        self._consumer = Consumer(
            platform.kafka.librdkafka(**{"group.id": f"read-{group}", "isolation.level": "read_committed"})
        )
        self._consumer.assign(
            [
                TopicPartition(spec.name, p, 0)
                for spec in (CLUSTER_ALLOCATION, ALERTS, DLQ)
                for p in range(spec.partitions)
            ]
        )
        self._codec, self._group = codec, group
        self.rows: dict[str, list[ClusterGpuAllocation]] = defaultdict(list)
        self.alerts: dict[str, list[Alert]] = defaultdict(list)
        self.letters: list[DeadLetter] = []

    def read_until(self, done, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while not done() and time.monotonic() < deadline:
            for message in self._consumer.consume(10_000, 0.5):
                if message.error() is not None:
                    continue
                if message.topic() == CLUSTER_ALLOCATION.name:
                    row = self._codec.decode(CLUSTER_ALLOCATION, message.value())
                    self.rows[row.cluster].append(row)
                elif message.topic() == ALERTS.name:
                    alert = self._codec.decode(ALERTS, message.value())
                    self.alerts[alert.cluster].append(alert)
                else:
                    letter = self._codec.decode(DLQ, message.value())
                    if letter.consumer == self._group:
                        self.letters.append(letter)

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    """600 pods span the trace's 3,585 hourly windows, as all 8,152 do; 4,000 duty-cycle rows
    hold 134 idle alerts, opened and resolved."""
    return head_of(PODS_CSV, 600, tmp_path / "pods.csv"), head_of(SAMPLES, 4_000, tmp_path / "duty.csv")


def run_independent_replays(platform, codec, config: Path, unique: str, spawned, runs: int, traces) -> None:
    pods_csv, duty_csv = traces
    group = f"indep-{unique}"
    worker = gpulens(
        config, "worker", "--processors", "allocation,alerts", "--window", str(HOUR), "--no-nodes",
        "--no-overview", "--group", group, "--source-timeout", str(SOURCE_TIMEOUT_S),
    )  # fmt: skip
    with (config.parent / f"worker-{group}.log").open("ab") as stderr:
        spawned.append(subprocess.Popen(worker, stdout=subprocess.DEVNULL, stderr=stderr))
    rng = random.Random()
    allocation, idle = {}, {}
    for run in range(runs):
        allocation[f"ali{run}-{unique}"] = ("alibaba-v2023", "--pods", str(pods_csv)), ("nodes", "pods")
        idle[f"gen{run}-{unique}"] = ("genai-duty", "--samples", str(duty_csv)), ("nodes", "pods", "samples")
    producers = []
    for cluster, (replay, parts) in {**allocation, **idle}.items():
        for part in parts:
            log = config.parent / f"replay-{cluster}-{part}.log"
            producers.append(
                delayed(config, ["replay", *replay, "--part", part], rng.uniform(0, 5), log, cluster)
            )
    spawned.extend(producers)
    for producer in producers:  # every one loaded and waiting ...
        assert producer.stdout is not None and producer.stdout.readline() == b"ready\n"
        producer.stdout.close()
    for producer in producers:  # ... then all at once, each with its own delay
        assert producer.stdin is not None
        producer.stdin.write(b"go\n")
        producer.stdin.close()

    expected_rows_ = expected_rows(pods_csv, HOUR)
    expected_alerts = idle_alerts_from_csv(5.0, 600.0, duty_csv)
    assert expected_alerts, "the slice has idle stretches"
    outputs = Outputs(platform, codec, group)

    def done() -> bool:
        return all(len(outputs.rows[c]) >= len(expected_rows_) for c in allocation) and all(
            len([a for a in outputs.alerts[c] if a.alert == "GpuIdle"]) >= len(expected_alerts) for c in idle
        )

    try:
        outputs.read_until(done, 240)
        outputs.read_until(lambda: False, 2)  # anything more would be a duplicate: look for it
    finally:
        outputs.close()

    for cluster in allocation:
        rows = outputs.rows[cluster]
        assert [int((r.window_start - EPOCH).total_seconds()) for r in rows] == [
            e.window_start for e in expected_rows_
        ], cluster
        for field in ("gpus_allocated_avg", "gpus_allocated_max", "gpus_allocated_end"):
            assert [getattr(r, field) for r in rows] == pytest.approx(
                [getattr(e, field) for e in expected_rows_], abs=1e-6
            ), (cluster, field)
        assert [(r.pods_running_end, r.pods_pending_end) for r in rows] == [
            (e.pods_running_end, e.pods_pending_end) for e in expected_rows_
        ], cluster
        assert {r.gpu_capacity for r in rows} == {6212.0}, cluster
    with duty_csv.open() as handle:
        pod_of_gpu = {
            genai_duty.gpu_id(row["container_ip"]): row["container_ip"] for row in csv.DictReader(handle)
        }
    for cluster in idle:
        alerts = [a for a in outputs.alerts[cluster] if a.alert == "GpuIdle"]
        published = {(pod_of_gpu[a.gpu_id], a.state.value, a.event_time.timestamp()) for a in alerts}
        assert published == expected_alerts, cluster
        assert len(alerts) == len(published), cluster
    late = [
        (letter.source_topic, letter.detail) for letter in outputs.letters if letter.reason == "late-event"
    ]
    assert [topic for topic, _ in late if topic != GPU_SAMPLES.name] == [], "a state record was dead-lettered"
    assert late == [], "with every source's watermark, nothing should be late at all"


# On a platform of their own: the replays publish tens of thousands of records that every later
# worker of a new group on the session's platform would otherwise read first.


def test_five_independent_replays_beside_a_cpu_hog_give_the_oracles_rows(
    own_platform, own_codec, unique, spawned, traces
):
    """Five replays of each trace (25 producer processes, ten clusters), their starts skewed at
    random, and a process spinning on one of the two cores: the windows and alerts are still the
    oracles', for every cluster."""
    spawned.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    settings, config = own_platform
    run_independent_replays(settings, own_codec, config, unique, spawned, 5, traces)
