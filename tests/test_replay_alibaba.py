"""The Alibaba v2023 replay: published records match the CSV, counted independently."""

from __future__ import annotations

import bisect
import csv
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from gpulens.producers.replay import alibaba_v2023
from gpulens.producers.replay.binding import BestFitBinder
from gpulens.producers.replay.exceptions import TraceError
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import ChangeType, NodeEvent, PodEvent
from gpulens.schemas.model.topics import NODES, PODS
from gpulens.schemas.wire.codec import AvroCodec

TRACE = traces_dir() / "alibaba-gpu-v2023"
NODES_CSV = TRACE / "openb_node_list_gpu_node.csv"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)


def held_from_csv(path: Path) -> dict[int, float]:
    """GPUs held after each instant, straight from the CSV (DESIGN.md: bound until deleted)."""
    changes: dict[int, float] = defaultdict(float)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        gpus = int(row["num_gpu"])
        amount = int(row["gpu_milli"]) / 1000 if gpus == 1 else float(gpus)
        if gpus == 0 or not row["scheduled_time"]:
            continue
        changes[int(row["scheduled_time"])] += amount
        changes[int(row["deletion_time"])] -= amount
    held, total = {}, 0.0
    for instant in sorted(changes):
        total += changes[instant]
        held[instant] = total
    return held


def held_from_records(pods: list[PodEvent]) -> dict[int, float]:
    """GPUs held after each instant, replaying the published records' states."""
    holding: dict[str, float] = {}
    held: dict[int, float] = {}
    total = 0.0
    for pod in pods:
        total -= holding.pop(pod.uid, 0.0)
        if pod.holds_gpus:
            holding[pod.uid] = pod.gpu_amount
            total += pod.gpu_amount
        held[int((pod.event_time - EPOCH).total_seconds())] = total
    return held


def value_at(held: dict[int, float], instant: int) -> float:
    """The step function ``held`` at ``instant`` (0 before its first change)."""
    keys = sorted(held)
    index = bisect.bisect_right(keys, instant)
    return held[keys[index - 1]] if index else 0.0


def consume(platform, codec: AvroCodec, cluster: str, expected: int) -> list[tuple[int, int, object]]:
    """(partition, offset, record) of this cluster's pod and node records, in partition order."""
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"read-{cluster}", "enable.auto.commit": False})
    )
    partitions = [TopicPartition(PODS.name, p, 0) for p in range(PODS.partitions)]
    partitions += [TopicPartition(NODES.name, p, 0) for p in range(NODES.partitions)]
    consumer.assign(partitions)
    found: list[tuple[int, int, object]] = []
    idle = 0
    try:
        while len(found) < expected and idle < 20:
            batch = consumer.consume(10_000, 0.5)
            idle = 0 if batch else idle + 1
            for message in batch:
                if message.error() is None and message.key().startswith(f"{cluster}/".encode()):
                    spec = PODS if message.topic() == PODS.name else NODES
                    found.append((message.partition(), message.offset(), codec.decode(spec, message.value())))
    finally:
        consumer.close()
    return found


@pytest.mark.parametrize("pods_csv", ["openb_pod_list_default.csv", "openb_pod_list_gpushare100.csv"])
def test_replay_publishes_the_trace_exactly(platform, codec, config_file, unique, pods_csv) -> None:
    cluster = f"alibaba-{unique}"
    path = TRACE / pods_csv
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    gpu_rows = [r for r in rows if int(r["num_gpu"]) > 0]
    scheduled = [r for r in gpu_rows if r["scheduled_time"]]
    expected = 1213 + 2 * len(gpu_rows) + len(scheduled)

    subprocess.run(
        [sys.executable, "-m", "gpulens", "--config", str(config_file), "replay", "alibaba-v2023",
         "--pods", str(path), "--nodes", str(NODES_CSV)],
        check=True, capture_output=True, env={"GPULENS_CLUSTER": cluster, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    records = consume(platform, codec, cluster, expected)

    nodes = [r for _, _, r in records if isinstance(r, NodeEvent)]
    pods = [r for _, _, r in records if isinstance(r, PodEvent)]
    assert len(nodes) == 1213
    assert sum(n.gpus_allocatable for n in nodes) == 6212
    kinds = Counter((p.name, p.type) for p in pods)
    assert {name for name, kind in kinds if kind == ChangeType.ADDED} == {r["name"] for r in gpu_rows}
    assert all(kinds[(r["name"], ChangeType.ADDED)] == 1 for r in gpu_rows)
    assert all(kinds[(r["name"], ChangeType.DELETED)] == 1 for r in gpu_rows)
    schedules = [p for p in pods if p.type == ChangeType.MODIFIED]
    assert sorted(p.name for p in schedules) == sorted(r["name"] for r in scheduled)
    assert all(p.node is not None and p.phase == "Running" for p in schedules)

    # Keyed by pod: one partition sees one pod, in non-decreasing event time.
    partition_of: dict[str, set[int]] = defaultdict(set)
    last_time: dict[int, datetime] = {}
    for partition, _offset, record in records:
        if isinstance(record, PodEvent):
            partition_of[record.uid].add(partition)
            assert record.event_time >= last_time.get(partition, EPOCH)
            last_time[partition] = record.event_time
    assert all(len(p) == 1 for p in partition_of.values())

    in_time_order = sorted(pods, key=lambda p: p.event_time)  # stable: keeps each pod's own order
    published, expected_held = held_from_records(in_time_order), held_from_csv(path)
    instants = sorted(published.keys() | expected_held.keys())
    assert [value_at(published, t) for t in instants] == pytest.approx(
        [value_at(expected_held, t) for t in instants], abs=1e-6
    )


def test_replays_into_two_clusters_do_not_merge(platform, codec, config_file, unique) -> None:
    """``--cluster`` names the cluster of every record, over the configured one."""
    configured, clusters = f"configured-{unique}", [f"first-{unique}", f"second-{unique}"]
    for cluster in clusters:
        subprocess.run(
            [sys.executable, "-m", "gpulens", "--config", str(config_file), "replay", "alibaba-v2023",
             "--part", "nodes", "--cluster", cluster],
            check=True, capture_output=True, env={"GPULENS_CLUSTER": configured, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    for cluster in clusters:
        nodes = [r for _, _, r in consume(platform, codec, cluster, 1213)]
        assert len(nodes) == 1213
        assert {n.cluster for n in nodes} == {cluster}
        assert sum(n.gpus_allocatable for n in nodes) == 6212


def test_final_phase_and_times_come_from_the_trace(platform) -> None:
    pods = alibaba_v2023.read_pods(TRACE / "openb_pod_list_default.csv")
    events = list(alibaba_v2023.plan(alibaba_v2023.read_nodes(NODES_CSV), pods, cluster="c", epoch=EPOCH))
    failed = next(p for p in pods if p.phase == "Failed" and p.num_gpu > 0)
    last = [e for _, e in events if isinstance(e, PodEvent) and e.name == failed.name][-1]
    assert last.type == ChangeType.DELETED
    assert last.phase == "Failed"
    assert (
        last.deletion_time
        == last.termination_time
        == EPOCH.replace()
        + (datetime.fromtimestamp(failed.deletion or 0, UTC) - datetime.fromtimestamp(0, UTC))
    )
    pending = next(p for p in pods if p.scheduled is None and p.num_gpu > 0)
    states = [e for _, e in events if isinstance(e, PodEvent) and e.name == pending.name]
    assert [s.type for s in states] == [ChangeType.ADDED, ChangeType.DELETED]
    assert all(s.node is None and s.unschedulable_reason == "Unschedulable" for s in states)


def test_binding_is_deterministic_and_prefers_the_tightest_node() -> None:
    binder = BestFitBinder()
    binder.add_node("big", "V100", 8)
    binder.add_node("small", "V100", 2)
    binder.add_node("t4", "T4", 1)
    assert binder.bind("a", 2, 1000, ["V100"]) == "small"
    assert binder.bind("b", 1, 500, []) == "t4"
    assert binder.bind("c", 1, 500, []) == "t4"
    assert binder.bind("d", 1, 1000, ["V100"]) == "big"
    binder.release("a")
    assert binder.bind("e", 2, 1000, ["V100"]) == "small"
    assert binder.overcommitted == 0


def test_a_pod_that_fits_nowhere_is_still_bound_and_counted() -> None:
    binder = BestFitBinder()
    binder.add_node("only", "A10", 1)
    assert binder.bind("a", 1, 1000, []) == "only"
    assert binder.bind("b", 1, 1000, []) == "only"
    assert binder.overcommitted == 1


def test_a_bad_row_names_the_file_and_line(tmp_path: Path) -> None:
    broken = tmp_path / "pods.csv"
    header = (TRACE / "openb_pod_list_default.csv").read_text().splitlines()[0]
    broken.write_text(
        f"{header}\np0,1000,1024,1,1000,,LS,Running,0,10,0\np1,1000,1024,1,1000,,LS,Running,zero,10,0\n"
    )
    with pytest.raises(TraceError, match=rf"{broken}:3: creation_time must be a number, got 'zero'"):
        alibaba_v2023.read_pods(broken)


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "nodes.csv"
    broken.write_text("sn,cpu_milli,gpu,model\nn1,1000,1,T4\n")
    with pytest.raises(TraceError, match="missing columns memory_mib"):
        alibaba_v2023.read_nodes(broken)
