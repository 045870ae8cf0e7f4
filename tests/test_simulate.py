"""The scale simulator: what it publishes, and that the cluster it makes up is consistent.

Pure behaviour (lifecycles, determinism, lost GPUs, telemetry, pacing) is checked on the
simulation in-process; what `gpulens simulate` puts on the broker is read back from it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import groupby
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from gpulens.cli import cli
from gpulens.config import GPULensSettings
from gpulens.producers.publishing import BasePublisher
from gpulens.producers.simulate import (
    ChurnRates,
    ClusterSimulation,
    SimulationError,
    SimulationSpec,
    publish_simulation,
)
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    Event,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
    Watermark,
    WorkloadEvent,
)
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    WORKLOADS,
    TopicSpec,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec

START = datetime(2025, 1, 1, tzinfo=UTC)
TOPICS = (NODES, PODS, WORKLOADS, DEVICE_INVENTORY, GPU_SAMPLES, CONTAINERS, WATERMARKS)
NO_CHURN = ChurnRates(not_ready=0, removed=0, gpu_lost=0)


def make_spec(**overrides: object) -> SimulationSpec:
    values: dict[str, object] = {
        "nodes": 4,
        "gpus_per_node": 4,
        "interval_s": 10.0,
        "start": START,
        "duration_s": 1800.0,
        "cluster": "sim-test",
        "seed": 1,
    }
    return SimulationSpec(**{**values, **overrides})  # type: ignore[arg-type]


def records_of(spec: SimulationSpec) -> list[Event]:
    return [event for _, event in ClusterSimulation(spec).events()]


def simulate(config_file: Path, cluster: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpulens", "--config", str(config_file), "simulate", "--cluster", cluster,
         "--start", "2025-01-01T00:00:00Z", "--speed", "0", *options],
        check=True, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120,
    )  # fmt: skip


def read_cluster(
    platform: GPULensSettings, codec: AvroCodec, cluster: str, topics: Iterable[TopicSpec] = TOPICS
) -> list[tuple[TopicSpec, int, bytes, Event]]:
    """(topic, partition, key, record) of ``cluster`` on ``topics``, every partition read to its end."""
    specs = {t.name: t for t in topics}
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": f"read-{cluster}-{time.monotonic_ns()}"}))
    try:
        ends = {}
        for name in specs:
            for partition in consumer.list_topics(name, timeout=10).topics[name].partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
                if high:
                    ends[(name, partition)] = high
        consumer.assign([TopicPartition(name, partition, 0) for name, partition in ends])
        found = []
        deadline = time.monotonic() + 60
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                if message.error() is not None:
                    continue
                where = (message.topic(), message.partition())
                if message.offset() + 1 >= ends.get(where, 0):
                    ends.pop(where, None)
                key = message.key() or b""
                if key.startswith(f"{cluster}/".encode()):
                    spec = specs[message.topic()]
                    found.append((spec, message.partition(), key, codec.decode(spec, message.value())))
        assert not ends, f"partitions not read to their end: {ends}"
        return found
    finally:
        consumer.close()


def by_instant(records: list[Event]) -> Iterable[tuple[datetime, list[Event]]]:
    """Records grouped by event time; the sort is stable, so each partition keeps its order."""
    ordered = sorted(records, key=lambda r: r.event_time)
    for at, group in groupby(ordered, key=lambda r: r.event_time):
        yield at, list(group)


class RecordingPublisher(BasePublisher):
    """Keeps what would be published, in order; sets ``stop`` once it holds ``stop_after`` records."""

    def __init__(self, *, stop: threading.Event | None = None, stop_after: int = 0) -> None:
        super().__init__(codec=None)  # type: ignore[arg-type]  # never encodes: keeps the events
        self.records: list[tuple[TopicSpec, Event]] = []
        self.stop, self.stop_after = stop, stop_after

    def publish(self, topic: TopicSpec, event: Event) -> None:
        self.records.append((topic, event))
        if self.stop is not None and len(self.records) == self.stop_after:
            self.stop.set()

    def produce(self, topic, key, value, *, on_delivery=None) -> None:
        raise AssertionError("records are published as events here")

    def poll(self, timeout: float = 0.0) -> None:
        time.sleep(timeout)

    def purge(self) -> None:
        pass

    def flush(self, timeout: float = 60.0) -> None:
        pass


# --- through the broker --------------------------------------------------------------------------


def test_a_run_publishes_each_nodes_inventory_and_one_batch_per_interval(
    platform, codec, config_file, unique
) -> None:
    cluster = f"sim-{unique}"
    simulate(config_file, cluster, "--nodes", "3", "--gpus-per-node", "4", "--interval", "1",
             "--duration", "6", "--churn", "0", "--seed", "7")  # fmt: skip
    records = read_cluster(platform, codec, cluster)

    assert all(key == record_key(topic, record) for topic, _, key, record in records)
    nodes = [r for _, _, _, r in records if isinstance(r, NodeEvent)]
    assert sorted(n.node for n in nodes) == ["gpu-node-00000", "gpu-node-00001", "gpu-node-00002"]
    assert all(n.type == ChangeType.ADDED and n.gpus_allocatable == 4 for n in nodes)
    inventories = {r.node: r for _, _, _, r in records if isinstance(r, DeviceInventory)}
    assert len([r for _, _, _, r in records if isinstance(r, DeviceInventory)]) == 3
    batches = [r for _, _, _, r in records if isinstance(r, GpuSampleBatch)]
    per_node = Counter(b.node for b in batches)
    assert per_node == {n.node: 6 for n in nodes}
    for batch in batches:
        assert [s.device_id for s in batch.samples] == [g.device_id for g in inventories[batch.node].gpus]
    assert sorted({b.event_time for b in batches}) == [START + timedelta(seconds=s) for s in range(6)]
    watermarks = [r for _, _, _, r in records if isinstance(r, Watermark)]
    assert watermarks[0].event_time == START, "the source is announced before its first record"
    assert [w.final for w in watermarks] == [False] * (len(watermarks) - 1) + [True]
    assert watermarks[-1].event_time == START + timedelta(seconds=6)
    times = [w.event_time for w in watermarks]
    assert times == sorted(times), "progress only moves forward"


def test_the_published_cluster_is_consistent_at_every_instant(platform, codec, config_file, unique) -> None:
    cluster = f"sim-{unique}"
    simulate(config_file, cluster, "--nodes", "4", "--gpus-per-node", "4", "--interval", "10",
             "--duration", "1800", "--load", "1.5", "--pod-duration", "120", "--churn", "300",
             "--seed", "3")  # fmt: skip
    records = [r for _, _, _, r in read_cluster(platform, codec, cluster)]

    nodes: dict[str, NodeEvent] = {}
    inventory: dict[str, set[str]] = {}
    pods: dict[str, PodEvent] = {}
    containers: dict[tuple[str, str, str, str], ContainerEvent] = {}
    seen: Counter[str] = Counter()
    for _at, instant in by_instant(records):
        for record in instant:  # events of one instant are applied together (DESIGN.md)
            if isinstance(record, NodeEvent):
                nodes[record.node] = record
                seen[f"node {record.type.value}"] += 1
                seen["node not ready"] += not record.ready
            elif isinstance(record, DeviceInventory):
                if record.node in inventory and len(record.gpus) < len(inventory[record.node]):
                    seen["gpu lost"] += 1
                inventory[record.node] = {g.device_id for g in record.gpus}
            elif isinstance(record, PodEvent):
                pods[record.uid] = record
                seen[f"pod {record.phase}" + (" unschedulable" if record.unschedulable_reason else "")] += 1
            elif isinstance(record, ContainerEvent):
                key = (record.node, record.pod_namespace, record.pod_name, record.container_name)
                containers[key] = record
        present = {name for name, n in nodes.items() if n.type != ChangeType.DELETED}
        held: dict[str, float] = defaultdict(float)
        for pod in pods.values():
            if pod.holds_gpus:
                assert pod.node in present, f"{pod.name} runs on {pod.node}, which does not exist"
                held[pod.node] += pod.gpu_amount
        for name, amount in held.items():
            assert amount <= nodes[name].gpus_allocatable, f"{name} holds {amount} GPUs"
        holders: dict[str, str] = {}
        for key, container in containers.items():
            if container.type == ChangeType.DELETED:
                continue
            pod = pods[container.pod_uid or ""]
            assert pod.holds_gpus and pod.node == container.node
            assert len(container.devices) == pod.gpu_amount
            for device in container.devices:
                assert device.device_id in inventory[container.node], f"{device.device_id} not on the node"
                holder = holders.setdefault(device.device_id, key[2])
                assert holder == key[2], f"{device.device_id} held by {holder} and {key[2]}"
    # Not vacuous: every case the checks guard happened.
    assert seen["pod Running"] > 50 and seen["pod Succeeded"] > 50
    assert seen["pod Pending unschedulable"] > 0
    assert seen["node not ready"] > 0 and seen["node DELETED"] > 0
    assert seen["gpu lost"] > 0


def test_ctrl_c_ends_the_run_with_a_final_watermark(platform, codec, config_file, unique) -> None:
    cluster = f"sim-{unique}"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "--config", str(config_file), "simulate", "--cluster", cluster,
         "--nodes", "2", "--interval", "0.5", "--speed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:  # the first log line comes once the simulation is set up
            if "expect" in line:
                break
        time.sleep(2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert "published" in out
    records = [r for _, _, _, r in read_cluster(platform, codec, cluster)]
    watermarks = [r for r in records if isinstance(r, Watermark)]
    assert [w.final for w in watermarks] == [False] * (len(watermarks) - 1) + [True]
    assert sum(isinstance(r, GpuSampleBatch) for r in records) >= 2
    assert watermarks[-1].event_time >= max(r.event_time for r in records)


# --- in-process ----------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_records() -> None:
    spec = make_spec(churn=300.0, load=1.2, pod_duration_s=300.0)
    first, second = records_of(spec), records_of(spec)
    assert first == second
    assert records_of(replace(spec, seed=2)) != first


def test_records_come_in_event_time_order_and_end_with_a_final_watermark() -> None:
    records = records_of(make_spec(churn=300.0, duration_s=900.0))
    assert [r.event_time for r in records] == sorted(r.event_time for r in records)
    last = records[-1]
    assert isinstance(last, Watermark) and last.final
    assert last.event_time == START + timedelta(seconds=900)
    assert sum(isinstance(r, Watermark) for r in records) == 1


def test_a_pod_goes_pending_bound_running_succeeded_deleted() -> None:
    spec = make_spec(load=0.5, pod_duration_s=120.0, churn_rates=NO_CHURN, profiles=make_spec().profiles[:1])
    records = records_of(spec)
    lives: dict[str, list[PodEvent]] = defaultdict(list)
    for record in records:
        if isinstance(record, PodEvent):
            lives[record.uid].append(record)
    arrived = [life for life in lives.values() if life[0].event_time > START]
    complete = [life for life in arrived if life[-1].type == ChangeType.DELETED]
    assert len(complete) > 20
    for life in complete:
        life = [p for p in life if p.unschedulable_reason is None]  # fragmentation may make one wait
        steps = [(p.type, p.phase, p.node is not None) for p in life]
        assert steps in (
            [
                (ChangeType.ADDED, "Pending", False),
                (ChangeType.MODIFIED, "Pending", True),
                (ChangeType.MODIFIED, "Running", True),
                (ChangeType.MODIFIED, phase, True),
                (ChangeType.DELETED, phase, True),
            ]
            for phase in ("Succeeded", "Failed")
        )
        assert life[0].creation_time < life[2].start_time < life[3].termination_time
        assert life[-1].deletion_time == life[-1].event_time
        assert [o.kind for o in life[0].owners] == ["Job"]
    jobs = Counter((r.uid, r.type, r.status.value) for r in records if isinstance(r, WorkloadEvent))
    assert all(jobs[(life[0].owners[0].uid, ChangeType.DELETED, "Deleted")] == 1 for life in complete)


def test_a_running_pods_container_holds_its_gpus_from_its_nodes_inventory() -> None:
    records = records_of(make_spec(pod_duration_s=300.0, churn_rates=NO_CHURN))
    inventory = {r.node: {g.device_id for g in r.gpus} for r in records if isinstance(r, DeviceInventory)}
    running = {r.uid: r for r in records if isinstance(r, PodEvent) and r.phase == "Running"}
    added = [r for r in records if isinstance(r, ContainerEvent) and r.type == ChangeType.ADDED]
    assert {c.pod_uid for c in added} == set(running)
    for container in added:
        pod = running[container.pod_uid or ""]
        assert container.node == pod.node and container.event_time == pod.event_time
        assert len(container.devices) == pod.gpu_amount
        assert {d.device_id for d in container.devices} <= inventory[container.node]
        assert {d.resource_name for d in container.devices} == set(pod.gpu_resources)


def test_pods_that_fit_nowhere_wait_unschedulable_then_run_when_gpus_free() -> None:
    records = records_of(make_spec(load=2.0, pod_duration_s=120.0, churn_rates=NO_CHURN))
    waiting = [r for r in records if isinstance(r, PodEvent) and r.unschedulable_reason == "Unschedulable"]
    assert waiting
    assert all(p.node is None and p.phase == "Pending" for p in waiting)
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert all(p.unschedulable_message == message for p in waiting)
    assert all(p.conditions[0].type == "PodScheduled" and p.conditions[0].status == "False" for p in waiting)
    later = {r.uid for r in records if isinstance(r, PodEvent) and r.phase == "Running"}
    assert {p.uid for p in waiting} & later, "a waiting pod never got GPUs"


def test_a_lost_gpu_leaves_the_inventory_and_its_samples_stop_until_it_returns() -> None:
    spec = make_spec(
        nodes=2, interval_s=5.0, duration_s=3600.0, churn=1.0,
        churn_rates=ChurnRates(not_ready=0, removed=0, gpu_lost=3.0, gpu_back_after_s=(300, 600)),
    )  # fmt: skip
    records = records_of(spec)
    last_inventory: dict[str, set[str]] = {}
    allocatable: dict[str, float] = {}
    lost: dict[str, set[str]] = defaultdict(set)
    checked = returned = 0
    for record in records:
        if isinstance(record, DeviceInventory):
            now = {g.device_id for g in record.gpus}
            assert len(now) == allocatable[record.node]
            before = last_inventory.get(record.node, now)
            lost[record.node] |= before - now
            returned += len(lost[record.node] & now)
            lost[record.node] -= now
            last_inventory[record.node] = now
        elif isinstance(record, GpuSampleBatch):
            sampled = {s.device_id for s in record.samples}
            assert sampled == last_inventory[record.node]
            checked += bool(lost[record.node])
        elif isinstance(record, NodeEvent):  # published with each inventory change, just before it
            allocatable[record.node] = record.gpus_allocatable
        elif isinstance(record, ContainerEvent):
            assert not {d.device_id for d in record.devices} & lost[record.node]
    assert checked > 10, "no batch was taken while a GPU was lost"
    assert returned > 0, "no lost GPU came back"


def test_busy_gpus_report_high_utilization_and_free_ones_about_zero() -> None:
    records = records_of(make_spec(pod_duration_s=600.0, churn_rates=NO_CHURN))
    held: dict[str, str] = {}
    busy, free = [], []
    for record in records:
        if isinstance(record, ContainerEvent):
            for key in [gpu for gpu, pod in held.items() if pod == record.pod_uid]:
                del held[key]
            held.update({d.device_id: record.pod_uid or "" for d in record.devices})
        elif isinstance(record, GpuSampleBatch):
            for sample in record.samples:
                (busy if sample.device_id in held else free).append(sample)
    assert busy and free
    assert max(s.utilization_pct or 0 for s in free) <= 1
    assert sorted(s.utilization_pct or 0 for s in busy)[len(busy) // 2] > 50
    assert sum((s.utilization_pct or 0) <= 1 for s in busy) > 0, "no pod ever idled"
    assert min(s.power_watts or 0 for s in busy if (s.utilization_pct or 0) > 80) > max(
        s.power_watts or 0 for s in free
    )
    assert all(0 < (s.memory_used_bytes or 0) < (s.memory_total_bytes or 0) for s in busy + free)
    assert all(25 < (s.temperature_edge_c or 0) < 90 for s in busy + free)


def test_speed_one_keeps_simulated_time_at_the_wall_clocks_pace() -> None:
    publisher = RecordingPublisher()
    began = time.monotonic()
    publish_simulation(ClusterSimulation(make_spec(interval_s=0.5, duration_s=2.0)), publisher, speed=1.0)
    assert time.monotonic() - began >= 1.9  # the final watermark is due 2 s after the start
    assert isinstance(publisher.records[-1][1], Watermark)


def test_a_stopped_run_ends_with_a_final_watermark_at_the_instant_reached() -> None:
    stop = threading.Event()
    publisher = RecordingPublisher(stop=stop, stop_after=200)
    final = publish_simulation(ClusterSimulation(make_spec(duration_s=None)), publisher, speed=0, stop=stop)
    *published, (topic, last) = publisher.records
    assert topic == WATERMARKS and isinstance(last, Watermark) and last.final
    data = [event for topic, event in published if topic != WATERMARKS]  # progress marks aside
    assert final.records == len(data) + 1
    assert last.event_time >= max(e.event_time for _, e in published)
    assert final.simulated == last.event_time


def test_help_states_the_rate_formula() -> None:
    result = CliRunner().invoke(cli, ["simulate", "--help"])
    assert result.exit_code == 0
    assert "N/S sample batches" in result.output
    assert "625 batches/s (5,000 GPU samples/s)" in result.output


def test_an_impossible_spec_names_what_is_wrong() -> None:
    with pytest.raises(SimulationError, match=r"nodes must be at least 1.*unknown gpu_model 'v100'"):
        make_spec(nodes=0, gpu_model="v100")


def test_an_amd_cluster_uses_amds_resource_and_reports_every_temperature() -> None:
    records = records_of(make_spec(gpu_model="mi300x", duration_s=60.0, churn_rates=NO_CHURN))
    node = next(r for r in records if isinstance(r, NodeEvent))
    assert node.gpu_vendor == "AMD" and node.gpu_allocatable == {"amd.com/gpu": 4.0}
    inventory = next(r for r in records if isinstance(r, DeviceInventory))
    assert {g.model for g in inventory.gpus} == {"AMD Instinct MI300X"}
    pods = [r for r in records if isinstance(r, PodEvent)]
    assert pods and all(set(p.gpu_resources) == {"amd.com/gpu"} for p in pods)
    sample = next(r for r in records if isinstance(r, GpuSampleBatch)).samples[0]
    assert None not in (sample.temperature_edge_c, sample.temperature_junction_c, sample.temperature_memory_c)


def test_the_package_exports_its_public_surface() -> None:
    import gpulens.producers.simulate as package

    assert sorted(package.__all__) == sorted(
        ["GPU_MODELS", "SOURCE", "Census", "ChurnRates", "ClusterSimulation", "GpuModel", "Progress",
         "SimulationError", "SimulationSpec", "WorkloadProfile", "publish_simulation"]
    )  # fmt: skip
    assert all(hasattr(package, name) for name in package.__all__)
