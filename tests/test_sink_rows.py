"""Every record type lands in its tables with its values; a record delivered twice is stored once;
the "as of" queries answer what the published events say."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from sink_support import SinkThread, wait_for

import gpulens.consumers.clickhouse
from gpulens.consumers.clickhouse import queries
from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.consumers.clickhouse.rows import GPU_SAMPLES
from gpulens.consumers.clickhouse.writing import TableWriter
from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.pipeline.device_changes import diff
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ClusterGpuAllocation,
    DeadLetter,
    IdleGpuHours,
    NodeEvent,
    NodeGpuAllocation,
    PodEvent,
    ReclaimDecision,
    ReclaimVerdict,
    WorkloadGpuUsage,
)
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    DEVICE_CHANGELOG,
    DEVICE_INVENTORY,
    DLQ,
    IDLE_GPU_HOURS,
    NODE_ALLOCATION,
    NODES,
    PODS,
    RECLAIM_AUDIT,
    STORAGE,
    WORKLOAD_USAGE,
)
from gpulens.testing.examples import JOB_UID, NODE, POD_UID, example_events

TABLES_MD = Path(gpulens.consumers.clickhouse.__file__).parent / "TABLES.md"


@pytest.fixture
def sink(platform, codec, unique):
    running = SinkThread(platform, codec, unique).start()
    yield running
    running.stop()


def _examples(cluster: str, at: datetime):
    """One record of every type the sink stores."""
    events = {spec: e for spec, e in example_events(cluster, at=at).items() if spec is not STORAGE}
    window = {"window_start": at - timedelta(seconds=30), "window_end": at}
    metrics = {
        "gpu_capacity": 8.0,
        "gpus_allocated_avg": 6.5,
        "gpus_allocated_max": 8.0,
        "gpus_allocated_end": 8.0,
        "allocation_rate_avg": 6.5 / 8,
        "pods_running_end": 1,
    }
    events[CLUSTER_ALLOCATION] = ClusterGpuAllocation(
        event_id=event_id(cluster, "w"), cluster=cluster, pods_pending_end=2, **window, **metrics
    )
    events[NODE_ALLOCATION] = NodeGpuAllocation(
        event_id=event_id(cluster, NODE, "w"), cluster=cluster, node=NODE, gpu_model=None, **window, **metrics
    )
    events[DLQ] = DeadLetter(
        event_id=event_id("dlq", cluster),
        failed_at=at,
        source_topic=f"gpulens.pods.v1.{cluster}",
        source_partition=2,
        source_offset=41,
        key=b"k\x00\xff",
        value=b"\x01garbage",
        reason="avro-decode-error",
        detail="schema id 7: EOFError",
        consumer="sink-test",
    )
    return events


def _publish_all(sink: SinkThread, events) -> None:
    for spec, event in events.items():
        sink.publish(spec, [event])


def _caught_up(platform, sink: SinkThread) -> bool:
    """The sink's group has committed every record of its topics."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": sink.group}))
    try:
        names = [t.name for t in sink.topics.values()]
        metadata = consumer.list_topics(timeout=10).topics
        partitions = [TopicPartition(n, p) for n in names for p in metadata[n].partitions]
        committed = consumer.committed(partitions, timeout=10)
        return all(
            tp.offset == consumer.get_watermark_offsets(tp, timeout=10)[1]
            or (tp.offset < 0 and consumer.get_watermark_offsets(tp, timeout=10)[1] == 0)
            for tp in committed
        )
    finally:
        consumer.close()


def test_every_record_type_lands_in_its_tables_with_its_values(sink, unique) -> None:
    cluster, at = f"rows-{unique}", datetime.now(UTC).replace(microsecond=123_000)
    stored_at = at.replace(tzinfo=None)  # clickhouse-connect answers UTC columns with naive UTC datetimes
    _publish_all(sink, _examples(cluster, at))
    sink.wait_rows("dead_letters", 1)
    # A record's tables are inserted one after another: wait for every table read below.
    for table in (
        *("nodes", "node_events", "pods", "pod_events", "workloads", "workload_events"),
        *(
            "gpu_devices",
            "rdma_devices",
            "gpu_samples",
            "containers",
            "container_events",
            "container_devices",
        ),
    ):
        sink.wait_rows(table, 1)
    sink.wait_rows("cluster_gpu_allocation", 1)
    sink.wait_rows("node_gpu_allocation", 1)
    client = sink.client()

    def rows(sql: str) -> list[tuple]:
        return client.query(sql, parameters={"c": cluster}).result_rows

    assert rows(
        "SELECT node, ready, gpus_allocatable, gpu_model, taints, labels, event_time FROM nodes FINAL "
        "WHERE cluster = {c:String}"
    ) == [
        (
            NODE,
            True,
            8.0,
            "AMD Instinct MI300X",
            [{"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}],
            {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
            stored_at,
        )
    ]
    pod = rows(
        "SELECT uid, node, phase, holds_gpus, gpu_amount, workload_uid, containers[1].name, "
        "owners[1].kind, scheduled_time FROM pods FINAL WHERE cluster = {c:String}"
    )
    assert pod == [
        (
            POD_UID,
            NODE,
            "Running",
            True,
            8.0,
            JOB_UID,
            "pytorch",
            "PyTorchJob",
            stored_at - timedelta(seconds=40),
        )
    ]
    assert rows(
        "SELECT kind, api_group, api_version, status, gpu_request, replicas, admitted FROM workloads FINAL "
        "WHERE cluster = {c:String}"
    ) == [("PyTorchJob", "kubeflow.org", "v1", "Running", 16.0, 2, None)]
    assert rows(
        "SELECT gpu_index, model, vram_total_bytes FROM gpu_devices FINAL WHERE cluster = {c:String} "
        "ORDER BY gpu_index"
    ) == [(0, "AMD Instinct MI300X", 192 * 1024**3), (1, "AMD Instinct MI300X", 192 * 1024**3)]
    assert rows("SELECT name, port, state, rate FROM rdma_devices FINAL WHERE cluster = {c:String}") == [
        ("mlx5_0", 1, "ACTIVE", "400 Gb/sec (4X NDR)")
    ]
    assert rows(
        "SELECT gpu_index, utilization_pct, temperature_edge_c, energy_joules, event_time FROM gpu_samples "
        "FINAL WHERE cluster = {c:String} ORDER BY gpu_index"
    ) == [(0, 97.0, None, 15_811_204.2, stored_at), (1, 96.0, None, 15_811_204.2, stored_at)]
    assert rows(
        "SELECT length(devices), type, state, exit_code, oom_killed FROM containers FINAL "
        "WHERE cluster = {c:String}"
    ) == [(3, "ADDED", "RUNNING", None, False)]
    assert rows(
        "SELECT kind, count() FROM container_devices FINAL WHERE cluster = {c:String} "
        "GROUP BY kind ORDER BY kind"
    ) == [("GPU", 2), ("RDMA", 1)]
    for history in ("node_events", "pod_events", "workload_events", "container_events"):
        assert rows(f"SELECT count() FROM {history} FINAL WHERE cluster = {{c:String}}") == [(1,)]
    assert rows(
        "SELECT gpu_capacity, gpus_allocated_avg, allocation_rate_avg, pods_running_end, pods_pending_end, "
        "window_end FROM cluster_gpu_allocation FINAL WHERE cluster = {c:String}"
    ) == [(8.0, 6.5, 6.5 / 8, 1, 2, stored_at)]
    assert rows(
        "SELECT node, gpu_model, gpus_allocated_max FROM node_gpu_allocation FINAL WHERE cluster = {c:String}"
    ) == [(NODE, None, 8.0)]
    assert client.query(
        "SELECT source_offset, key, reason FROM dead_letters FINAL WHERE consumer = 'sink-test' "
        "AND source_topic = {t:String}",
        parameters={"t": f"gpulens.pods.v1.{cluster}"},
        column_formats={"key": "bytes"},
    ).result_rows == [(41, b"k\x00\xff", "avro-decode-error")]


def test_a_record_delivered_twice_is_stored_once(platform, sink, unique) -> None:
    cluster, at = f"twice-{unique}", datetime.now(UTC)
    events = _examples(cluster, at)
    _publish_all(sink, events)
    sink.wait_rows("gpu_samples", 2, f"cluster = '{cluster}'")
    _publish_all(sink, events)  # the same records again, at later offsets
    wait_for(lambda: _caught_up(platform, sink), 30, "the sink to commit the second delivery")

    expected = {
        "nodes": 1, "node_events": 1, "pods": 1, "pod_events": 1, "workload_pods": 1, "workloads": 1,
        "workload_events": 1,
        "containers": 1, "container_events": 1, "container_devices": 3, "gpu_devices": 2,
        "rdma_devices": 1, "gpu_samples": 2, "cluster_gpu_allocation": 1, "node_gpu_allocation": 1,
    }  # fmt: skip
    stored = {
        table: sink.scalar(f"SELECT count() FROM {table} FINAL WHERE cluster = {{c:String}}", {"c": cluster})
        for table in expected
    }
    assert stored == expected
    assert sink.scalar("SELECT count() FROM dead_letters FINAL WHERE consumer = 'sink-test'") == 1


def test_workload_pods_holds_each_pod_of_a_workload_once_in_its_newest_state(sink, unique) -> None:
    cluster, at = f"wp-{unique}", datetime.now(UTC).replace(microsecond=0)
    pod = _examples(cluster, at)[PODS]
    assert isinstance(pod, PodEvent) and pod.owners
    later = pod.model_copy(
        update={
            "event_id": f"{pod.event_id}-later",
            "event_time": at + timedelta(minutes=5),
            "phase": "Succeeded",
        }
    )
    deleted = later.model_copy(
        update={
            "event_id": f"{pod.event_id}-deleted",
            "event_time": at + timedelta(minutes=6),
            "type": ChangeType.DELETED,
        }
    )
    sibling = pod.model_copy(update={"event_id": f"{pod.event_id}-sibling", "uid": "sibling", "name": "w-1"})
    sink.publish(PODS, [pod, later, pod, sibling, deleted])
    sink.wait_rows("pod_events", 4, f"cluster = '{cluster}'")
    rows = (
        sink.client()
        .query(
            "SELECT workload_uid, workload_kind, workload_name, pod_uid, phase, deleted, last_seen "
            "FROM workload_pods FINAL WHERE cluster = {c:String} ORDER BY pod_uid",
            parameters={"c": cluster},
        )
        .result_rows
    )
    top = pod.owners[-1]
    assert [tuple(r) for r in rows] == [
        (
            top.uid,
            top.kind,
            top.name,
            pod.uid,
            "Succeeded",
            True,
            (at + timedelta(minutes=6)).replace(tzinfo=None),
        ),
        (top.uid, top.kind, top.name, "sibling", pod.phase, False, at.replace(tzinfo=None)),
    ]


def test_the_engine_honours_insert_deduplication_tokens(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"tok_{unique}"})
    migrate(settings, samples_ttl_days=30)
    writer = TableWriter(
        get_client(settings, database=settings.database), backoff=(0.1,), stop=threading.Event()
    )
    at = datetime.now(UTC)
    row = ("c", "n", "gpu-0", 0, at, *([None] * 13), "e1", "test")
    other = ("c", "n", "gpu-1", 1, at, *([None] * 13), "e1", "test")

    writer.write(GPU_SAMPLES, [row], token="batch-1")
    writer.write(GPU_SAMPLES, [row], token="batch-1")  # a retry of an insert that had landed
    writer.write(GPU_SAMPLES, [other], token="batch-2")

    client = get_client(settings, database=settings.database)
    assert client.command("SELECT count() FROM gpu_samples") == 2, "without FINAL: the retry was dropped"


def test_as_of_queries_give_the_pods_running_and_the_allocation_at_an_instant(sink, unique) -> None:
    cluster = f"asof-{unique}"
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    template = example_events(cluster, at=t0)[PODS]
    node_template = example_events(cluster, at=t0)[NODES]

    def node(name: str, at: datetime, *, ready: bool) -> NodeEvent:
        return node_template.model_copy(
            update={"event_id": event_id(cluster, name, at), "node": name, "event_time": at, "ready": ready}
        )

    def pod(i: int, at: datetime, phase: str, kind: ChangeType, bound: bool) -> PodEvent:
        return template.model_copy(
            update={
                "event_id": event_id(cluster, i, at, phase, kind),
                "uid": f"pod-{i}",
                "name": f"job-{i}",
                "event_time": at,
                "type": kind,
                "phase": phase,
                "node": f"n{i % 2}" if bound else None,
                "gpu_amount": 1.0 + i % 4,
            }
        )

    nodes = [
        node("n0", t0, ready=True),
        node("n1", t0, ready=True),
        node("n1", t0 + timedelta(minutes=7), ready=False),
    ]
    pods: list[PodEvent] = []
    for i in range(12):
        created = t0 + timedelta(minutes=i)
        pods.append(pod(i, created, "Pending", ChangeType.ADDED, False))
        if i % 5 != 4:  # every fifth pod never gets bound
            pods.append(pod(i, created + timedelta(seconds=30), "Running", ChangeType.MODIFIED, True))
        if i % 3 == 0:
            pods.append(pod(i, created + timedelta(minutes=4), "Succeeded", ChangeType.MODIFIED, True))
            pods.append(pod(i, created + timedelta(minutes=5), "Succeeded", ChangeType.DELETED, True))
    sink.publish(NODES, nodes)
    sink.publish(PODS, pods)
    sink.wait_rows("pod_events", len(pods), f"cluster = '{cluster}'")
    sink.wait_rows("node_events", len(nodes), f"cluster = '{cluster}'")

    client = sink.client()
    for at in (t0 + timedelta(minutes=6, seconds=10), t0 + timedelta(minutes=7), t0 + timedelta(minutes=11)):
        state = {p.uid: p for p in sorted(pods, key=lambda p: p.event_time) if p.event_time <= at}
        running = sorted(uid for uid, p in state.items() if p.holds_gpus)
        params = {"cluster": cluster, "at": at}
        answer = client.query(queries.PODS_RUNNING_AS_OF, parameters=params).result_rows
        assert [r[0] for r in answer] == running, at
        assert running, "the instant should have pods running"
        capacity = sum(
            n.gpus_allocatable
            for n in {n.node: n for n in nodes if n.event_time <= at}.values()
            if n.ready and n.schedulable
        )
        allocation = client.query(queries.GPU_ALLOCATION_AS_OF, parameters=params).result_rows
        assert allocation == [
            (
                capacity,
                sum(state[uid].gpu_amount for uid in running),
                len(running),
                sum(1 for p in state.values() if p.node is None and p.phase == "Pending"),
            )
        ], at


def test_tables_md_shows_the_as_of_queries_as_the_code_runs_them() -> None:
    text = TABLES_MD.read_text()
    assert queries.PODS_RUNNING_AS_OF in text
    assert queries.GPU_ALLOCATION_AS_OF in text


def test_derived_records_land_in_their_tables(sink, unique) -> None:
    cluster, at = f"derived-{unique}", datetime(2026, 5, 1, 12, tzinfo=UTC)
    inventory = example_events(cluster, at=at)[DEVICE_INVENTORY]
    changed = inventory.model_copy(
        update={"gpus": [inventory.gpus[0].model_copy(update={"serial": "NEW"})], "event_id": "2"}
    )
    changes = list(diff(inventory, changed))  # one GPU changed serial, one removed
    detector = AlertDetector(AlertRules())
    detector.process(inventory)
    alerts = detector.process(changed)  # GpuLost for the removed GPU
    usage = WorkloadGpuUsage(
        event_id=event_id(cluster, "u"), cluster=cluster, workload_uid="w1", workload_kind="PyTorchJob",
        workload_name="llama", namespace="ml", window_start=at, window_end=at + timedelta(hours=1),
        gpus_allocated_avg=7.5, gpus_allocated_max=8.0, gpus_allocated_end=8.0, utilization_avg=61.25,
        utilization_max=99.0, samples=720, pods_active_end=1,
    )  # fmt: skip
    idle = IdleGpuHours(
        event_id=event_id(cluster, "i"), cluster=cluster, window_start=at, window_end=at + timedelta(hours=1),
        node="n1", device_id="gpu-0", workload_uid="w1", workload_kind="PyTorchJob", workload_name="llama",
        namespace="ml", owner_labels={"team": "vision"}, active_gpu_hours=0.25, idle_gpu_hours=0.125,
        memory_idle_gpu_hours=0.0625, unmeasured_gpu_hours=0.0625, unallocated_gpu_hours=0.5,
    )  # fmt: skip
    sink.publish(DEVICE_CHANGELOG, changes)
    sink.publish(ALERTS, alerts)
    sink.publish(WORKLOAD_USAGE, [usage])
    decision = ReclaimDecision(
        event_id=event_id(cluster, "r"), cluster=cluster, event_time=at, source="gpulens-reclaim",
        run_id="run-1", policy="sandbox", dry_run=True, verdict=ReclaimVerdict.WOULD_ACT, reason="idle",
        action="delete", workload_uid="w1", workload_kind="Job", workload_name="llama", namespace="ml",
        targets=["Job/ml/llama", "Service/ml/llama"], checks=5, idle_checks=5, utilization_max=0.5,
        idle_until=at,
    )  # fmt: skip
    sink.publish(IDLE_GPU_HOURS, [idle])
    sink.publish(RECLAIM_AUDIT, [decision])
    sink.wait_rows("reclaim_decisions", 1)
    sink.wait_rows("device_changelog", 2)
    sink.wait_rows("alerts", 1)
    sink.wait_rows("workload_gpu_usage", 1)
    sink.wait_rows("idle_gpu_hours", 1)
    client = sink.client()

    def rows(sql: str) -> list[tuple]:
        return client.query(sql, parameters={"c": cluster}).result_rows

    assert rows(
        "SELECT change, device_kind, changed, after FROM device_changelog FINAL WHERE cluster = {c:String} "
        "ORDER BY change"
    ) == [("DELETED", "GPU", [], {}), ("MODIFIED", "GPU", ["serial"], {"serial": "NEW"})]
    assert rows("SELECT alert, state, gpu_id FROM alerts FINAL WHERE cluster = {c:String}") == [
        ("GpuLost", "OPENED", inventory.gpus[1].device_id)
    ]
    assert rows(
        "SELECT workload_kind, gpus_allocated_avg, utilization_avg, samples FROM workload_gpu_usage FINAL "
        "WHERE cluster = {c:String}"
    ) == [("PyTorchJob", 7.5, 61.25, 720)]
    assert rows(
        "SELECT owner_labels['team'], active_gpu_hours + idle_gpu_hours + memory_idle_gpu_hours "
        "+ unmeasured_gpu_hours + unallocated_gpu_hours FROM idle_gpu_hours FINAL WHERE cluster = {c:String}"
    ) == [("vision", 1.0)]
    assert rows(
        "SELECT dry_run, verdict, action, targets, idle_checks, cpu_millicores_max FROM reclaim_decisions "
        "FINAL WHERE cluster = {c:String}"
    ) == [(True, "WOULD_ACT", "delete", ["Job/ml/llama", "Service/ml/llama"], 5, None)]
