"""From decoded records to rows of the ClickHouse tables: pure functions, no I/O.

Each record type has one mapper that returns ``(table, row)`` pairs; a row is a tuple in
the order of its table's ``columns`` (the migrations define the same columns). State and
history tables of one entity share their columns, so one row goes to both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpulens.schemas.kafka.consuming import Decoded
from gpulens.schemas.model.models import (
    Alert,
    ClusterGpuAllocation,
    ClusterOverview,
    ContainerEvent,
    DeadLetter,
    DeviceChange,
    DeviceInventory,
    Event,
    GpuSampleBatch,
    NodeEvent,
    NodeGpuAllocation,
    PodEvent,
    Record,
    WorkloadEvent,
    WorkloadGpuUsage,
)
from gpulens.schemas.model.topics import CATALOG, STATE_TOPICS, TopicSpec

__all__ = [
    "DECODED_BY_CLICKHOUSE",
    "INTAKE_TABLES",
    "MAPPERS",
    "SINK_TOPICS",
    "TABLES",
    "Row",
    "Table",
    "rows_of",
    "version",
]

Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A table the sink writes: its name and the columns of its rows, in order."""

    name: str
    columns: tuple[str, ...]


_EVENT = ("event_id", "event_time", "source", "version")

NODE_COLUMNS = (
    *("cluster", "node", "uid", "type", "ready", "schedulable", "taints", "addresses", "labels"),
    *("cpu_capacity_milli", "cpu_allocatable_milli", "memory_capacity_bytes", "memory_allocatable_bytes"),
    *("gpu_capacity", "gpu_allocatable", "gpus_allocatable", "gpu_model", "gpu_vendor", "kubelet_version"),
    *("container_runtime_version", "kernel_version", "os_image", "resource_version", *_EVENT),
)
POD_COLUMNS = (
    *("cluster", "uid", "namespace", "name", "node", "type", "phase", "holds_gpus", "gpu_resources"),
    *("gpu_amount", "gpu_models", "qos", "cpu_request_milli", "memory_request_bytes", "conditions"),
    *("unschedulable_reason", "unschedulable_message", "containers", "creation_time", "scheduled_time"),
    *("start_time", "termination_time", "deletion_time", "labels", "ip", "owners", "workload_uid"),
    *("resource_version", *_EVENT),
)
WORKLOAD_COLUMNS = (
    *("cluster", "uid", "namespace", "name", "kind", "api_group", "api_version", "parent_uid", "type"),
    *("status", "gpu_request", "replicas", "labels", "creation_time", "resource_version", *_EVENT),
)
CONTAINER_COLUMNS = (
    *("cluster", "node", "pod_namespace", "pod_name", "container_name", "pod_uid", "container_id"),
    *("type", "devices", *_EVENT),
)
CONTAINER_DEVICE_COLUMNS = (
    *("cluster", "node", "resource_name", "device_id", "kind", "pod_namespace", "pod_name"),
    *("container_name", "pod_uid", "container_id", "type", *_EVENT),
)
GPU_DEVICE_COLUMNS = (
    *("cluster", "node", "device_id", "gpu_index", "vendor", "model", "uuid", "serial", "pci_vendor_id"),
    *("pci_device_id", "bdf", "numa_node", "vram_total_bytes", "vbios_version", "driver_version"),
    *("firmware_version", "parent_device_id", "gpu_partition", *_EVENT),
)
RDMA_DEVICE_COLUMNS = (
    *("cluster", "node", "name", "port", "state", "physical_state", "link_layer", "rate", "node_guid"),
    *("firmware_version", "netdev", *_EVENT),
)
GPU_SAMPLE_METRICS = (
    *("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_edge_c"),
    *("temperature_junction_c", "temperature_memory_c", "power_watts", "energy_joules", "sm_clock_mhz"),
    *("memory_clock_mhz", "pcie_bandwidth_mbps", "ecc_correctable", "ecc_uncorrectable"),
)
GPU_SAMPLE_COLUMNS = (
    *("cluster", "node", "device_id", "gpu_index", "event_time", *GPU_SAMPLE_METRICS, "event_id", "source"),
)
ALLOCATION_METRICS = (
    *("window_start", "window_end", "gpu_capacity", "gpus_allocated_avg", "gpus_allocated_max"),
    *("gpus_allocated_end", "allocation_rate_avg", "pods_running_end", "pods_pending_end"),
)
DEAD_LETTER_COLUMNS = (
    *("event_id", "failed_at", "source_topic", "source_partition", "source_offset", "key", "value"),
    *("value_length", "value_sha256", "value_truncated", "reason", "detail", "consumer"),
)

NODES = Table("nodes", NODE_COLUMNS)
NODE_EVENTS = Table("node_events", NODE_COLUMNS)
PODS = Table("pods", POD_COLUMNS)
POD_EVENTS = Table("pod_events", POD_COLUMNS)
WORKLOADS = Table("workloads", WORKLOAD_COLUMNS)
WORKLOAD_EVENTS = Table("workload_events", WORKLOAD_COLUMNS)
CONTAINERS = Table("containers", CONTAINER_COLUMNS)
CONTAINER_EVENTS = Table("container_events", CONTAINER_COLUMNS)
CONTAINER_DEVICES = Table("container_devices", CONTAINER_DEVICE_COLUMNS)
GPU_DEVICES = Table("gpu_devices", GPU_DEVICE_COLUMNS)
RDMA_DEVICES = Table("rdma_devices", RDMA_DEVICE_COLUMNS)
GPU_SAMPLES = Table("gpu_samples", GPU_SAMPLE_COLUMNS)
CLUSTER_GPU_ALLOCATION = Table("cluster_gpu_allocation", ("cluster", *ALLOCATION_METRICS))
NODE_GPU_ALLOCATION = Table("node_gpu_allocation", ("cluster", "node", "gpu_model", *ALLOCATION_METRICS))
DEAD_LETTERS = Table("dead_letters", DEAD_LETTER_COLUMNS)

# Derived records are flat: one column per field, in the model's order.
WORKLOAD_GPU_USAGE = Table("workload_gpu_usage", tuple(WorkloadGpuUsage.model_fields))
CLUSTER_OVERVIEW = Table("cluster_overview", tuple(ClusterOverview.model_fields))
ALERTS = Table("alerts", tuple(Alert.model_fields))
DEVICE_CHANGELOG = Table("device_changelog", tuple(DeviceChange.model_fields))

TABLES: tuple[Table, ...] = (
    *(NODES, NODE_EVENTS, PODS, POD_EVENTS, WORKLOADS, WORKLOAD_EVENTS, CONTAINERS, CONTAINER_EVENTS),
    *(CONTAINER_DEVICES, GPU_DEVICES, RDMA_DEVICES, GPU_SAMPLES, CLUSTER_GPU_ALLOCATION),
    *(NODE_GPU_ALLOCATION, DEAD_LETTERS, WORKLOAD_GPU_USAGE, CLUSTER_OVERVIEW, ALERTS, DEVICE_CHANGELOG),
)
"""Every table the sink writes."""


def version(event_time: datetime, offset: int) -> int:
    """The ReplacingMergeTree version of a state row: event time in ms, then the Kafka offset."""
    return (int(event_time.timestamp() * 1000) << 64) | offset


def _event(item: Decoded, record: Event) -> Row:
    return (record.event_id, record.event_time, record.source, version(record.event_time, item.offset))


def _node(item: Decoded) -> list[tuple[Table, Row]]:
    n: NodeEvent = item.record  # type: ignore[assignment]
    row = (
        *(n.cluster, n.node, n.uid, n.type.value, n.ready, n.schedulable),
        [(t.key, t.value, t.effect) for t in n.taints],
        [(a.type, a.address) for a in n.addresses],
        *(n.labels, n.cpu_capacity_milli, n.cpu_allocatable_milli, n.memory_capacity_bytes),
        *(n.memory_allocatable_bytes, n.gpu_capacity, n.gpu_allocatable, n.gpus_allocatable, n.gpu_model),
        *(n.gpu_vendor, n.kubelet_version, n.container_runtime_version, n.kernel_version, n.os_image),
        *(n.resource_version, *_event(item, n)),
    )
    return [(NODES, row), (NODE_EVENTS, row)]


def _pod(item: Decoded) -> list[tuple[Table, Row]]:
    p: PodEvent = item.record  # type: ignore[assignment]
    row = (
        *(p.cluster, p.uid, p.namespace, p.name, p.node, p.type.value, p.phase, p.holds_gpus),
        *(p.gpu_resources, p.gpu_amount, p.gpu_models, p.qos, p.cpu_request_milli, p.memory_request_bytes),
        [(c.type, c.status, c.reason, c.message, c.last_transition_time) for c in p.conditions],
        *(p.unschedulable_reason, p.unschedulable_message),
        [
            (c.name, c.image, c.gpu_amount, c.state, c.reason, c.restart_count, c.exit_code)
            for c in p.containers
        ],
        *(p.creation_time, p.scheduled_time, p.start_time, p.termination_time, p.deletion_time),
        *(p.labels, p.ip, [(o.kind, o.api_version, o.name, o.uid) for o in p.owners]),
        *(p.owners[-1].uid if p.owners else None, p.resource_version, *_event(item, p)),
    )
    return [(PODS, row), (POD_EVENTS, row)]


def _workload(item: Decoded) -> list[tuple[Table, Row]]:
    w: WorkloadEvent = item.record  # type: ignore[assignment]
    row = (
        *(w.cluster, w.uid, w.namespace, w.name, w.kind, w.group, w.version, w.parent_uid, w.type.value),
        *(w.status.value, w.gpu_request, w.replicas, w.labels, w.creation_time, w.resource_version),
        *_event(item, w),
    )
    return [(WORKLOADS, row), (WORKLOAD_EVENTS, row)]


def _container(item: Decoded) -> list[tuple[Table, Row]]:
    c: ContainerEvent = item.record  # type: ignore[assignment]
    where = (c.cluster, c.node)
    who = (c.pod_namespace, c.pod_name, c.container_name)
    event = _event(item, c)
    held_as = (c.pod_uid, c.container_id, c.type.value)
    devices = [(d.resource_name, d.device_id, d.kind.value) for d in c.devices]
    row = (*where, *who, *held_as, devices, *event)
    held = [(CONTAINER_DEVICES, (*where, *device, *who, *held_as, *event)) for device in devices]
    return [(CONTAINERS, row), (CONTAINER_EVENTS, row), *held]


def _inventory(item: Decoded) -> list[tuple[Table, Row]]:
    inv: DeviceInventory = item.record  # type: ignore[assignment]
    event = _event(item, inv)
    gpus = [
        (
            GPU_DEVICES,
            (
                *(inv.cluster, inv.node, g.device_id, g.index, g.vendor, g.model, g.uuid, g.serial),
                *(g.pci_vendor_id, g.pci_device_id, g.bdf, g.numa_node, g.vram_total_bytes, g.vbios_version),
                *(g.driver_version, g.firmware_version, g.parent_device_id, g.partition, *event),
            ),
        )
        for g in inv.gpus
    ]
    ports = [
        (
            RDMA_DEVICES,
            (
                *(inv.cluster, inv.node, r.name, r.port, r.state, r.physical_state, r.link_layer, r.rate),
                *(r.node_guid, r.firmware_version, r.netdev, *event),
            ),
        )
        for r in inv.rdma_devices
    ]
    return [*gpus, *ports]


def _samples(item: Decoded) -> list[tuple[Table, Row]]:
    b: GpuSampleBatch = item.record  # type: ignore[assignment]
    return [
        (
            GPU_SAMPLES,
            (
                *(b.cluster, b.node, s.device_id, s.index, b.event_time, s.utilization_pct),
                *(s.memory_used_bytes, s.memory_total_bytes, s.temperature_edge_c, s.temperature_junction_c),
                *(s.temperature_memory_c, s.power_watts, s.energy_joules, s.sm_clock_mhz, s.memory_clock_mhz),
                *(s.pcie_bandwidth_mbps, s.ecc_correctable, s.ecc_uncorrectable, b.event_id, b.source),
            ),
        )
        for s in b.samples
    ]


def _allocation_metrics(a: ClusterGpuAllocation | NodeGpuAllocation) -> Row:
    return (
        *(a.window_start, a.window_end, a.gpu_capacity, a.gpus_allocated_avg, a.gpus_allocated_max),
        *(a.gpus_allocated_end, a.allocation_rate_avg, a.pods_running_end, a.pods_pending_end),
    )


def _cluster_allocation(item: Decoded) -> list[tuple[Table, Row]]:
    a: ClusterGpuAllocation = item.record  # type: ignore[assignment]
    return [(CLUSTER_GPU_ALLOCATION, (a.cluster, *_allocation_metrics(a)))]


def _node_allocation(item: Decoded) -> list[tuple[Table, Row]]:
    a: NodeGpuAllocation = item.record  # type: ignore[assignment]
    return [(NODE_GPU_ALLOCATION, (a.cluster, a.node, a.gpu_model, *_allocation_metrics(a)))]


def _dead_letter(item: Decoded) -> list[tuple[Table, Row]]:
    d: DeadLetter = item.record  # type: ignore[assignment]
    row = (
        *(d.event_id, d.failed_at, d.source_topic, d.source_partition, d.source_offset, d.key, d.value),
        *(d.value_length, d.value_sha256, d.value_truncated, d.reason, d.detail, d.consumer),
    )
    return [(DEAD_LETTERS, row)]


Mapper = Callable[[Decoded], list[tuple[Table, Row]]]


def _flat(table: Table) -> Mapper:
    def mapper(item: Decoded) -> list[tuple[Table, Row]]:
        return [(table, tuple(getattr(item.record, column) for column in table.columns))]

    return mapper


MAPPERS: dict[type[Record], Mapper] = {
    NodeEvent: _node,
    PodEvent: _pod,
    WorkloadEvent: _workload,
    ContainerEvent: _container,
    DeviceInventory: _inventory,
    GpuSampleBatch: _samples,
    ClusterGpuAllocation: _cluster_allocation,
    NodeGpuAllocation: _node_allocation,
    DeadLetter: _dead_letter,
    WorkloadGpuUsage: _flat(WORKLOAD_GPU_USAGE),
    ClusterOverview: _flat(CLUSTER_OVERVIEW),
    Alert: _flat(ALERTS),
    DeviceChange: _flat(DEVICE_CHANGELOG),
}
"""The mapper of every record type the sink stores (storage events and watermarks: none yet)."""

SINK_TOPICS: tuple[TopicSpec, ...] = tuple(
    spec for spec in CATALOG if spec.record in MAPPERS and spec not in STATE_TOPICS
)
"""The catalog topics the sink reads: event and derived topics (the state topics repeat the
events the sink already stores)."""


@dataclass(frozen=True, slots=True)
class Intake:
    """Where ClickHouse takes a record type's Kafka values as they are (``FORMAT AvroConfluent``)."""

    table: str
    """The table the values go into."""
    into: str
    """The table their rows land in (its materialized view's target)."""
    rows_after: str
    """The fields before the array whose items are the rows (``s`` string, ``l`` long): how
    many rows a value becomes is read there (:func:`~gpulens.consumers.clickhouse.peeking.array_length`)."""


DECODED_BY_CLICKHOUSE: dict[type[Record], Intake] = {
    GpuSampleBatch: Intake("gpu_sample_batches", GPU_SAMPLES.name, "sslss")
}
"""Record types the sink hands to ClickHouse undecoded: migration 0011's materialized view
turns them into the rows their mapper above makes. Only where that view is a plain projection
of the record."""

INTAKE_TABLES = ("gpu_sample_batches", "gpu_samples_from_batches")
"""What migration 0011 creates for them: the Null table the values go into, and its view."""


def rows_of(item: Decoded) -> list[tuple[Table, Row]]:
    """The rows ``item`` becomes, with their tables."""
    return MAPPERS[type(item.record)](item)
