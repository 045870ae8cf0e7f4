"""The tables the sink writes, each described once, and the rows a decoded record becomes.

Each :class:`~gpulens.consumers.clickhouse.layouts.Layout` below lists a table's columns in
the order of the migration that creates it and says where each value is taken; its column
tuple and its row function derive from that list. State and history tables of one entity
share their columns, so one row goes to both. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulens.consumers.clickhouse.layouts import VERSION, Column, Layout, Row, Table, items
from gpulens.schemas.model.models import (
    EVENT_TYPES,
    Alert,
    ClusterGpuAllocation,
    ClusterOverview,
    ContainerEvent,
    DeadLetter,
    DeviceChange,
    DeviceInventory,
    Event,
    GpuHealthEvent,
    GpuSampleBatch,
    IdleGpuHours,
    NodeEvent,
    NodeGpuAllocation,
    PendingGpuPod,
    PodEvent,
    ReclaimDecision,
    Record,
    StorageEvent,
    WorkloadEvent,
    WorkloadGpuUsage,
)
from gpulens.schemas.model.topics import CATALOG, STATE_TOPICS, TopicSpec

if TYPE_CHECKING:
    from gpulens.schemas.kafka.consuming import Decoded

__all__ = [
    "DECODED_BY_CLICKHOUSE",
    "GPU_SAMPLES",
    "INTAKE_TABLES",
    "LAYOUTS",
    "SINK_TOPICS",
    "TABLES",
    "Intake",
    "Row",
    "Table",
    "rows_of",
]

EVENT: tuple[Column[Event], ...] = ("event_id", "event_time", "source", VERSION)
"""The last columns of entity tables."""

NODES = Layout(
    NodeEvent,
    ("nodes", "node_events"),
    *("cluster", "node", "uid", ("type", "type.value"), "ready", "schedulable"),
    ("taints", lambda n: [(t.key, t.value, t.effect) for t in n.taints]),
    ("addresses", lambda n: [(a.type, a.address) for a in n.addresses]),
    *("labels", "cpu_capacity_milli", "cpu_allocatable_milli", "memory_capacity_bytes"),
    *("memory_allocatable_bytes", "gpu_capacity", "gpu_allocatable", "gpus_allocatable", "gpu_model"),
    *("gpu_vendor", "kubelet_version", "container_runtime_version", "kernel_version", "os_image"),
    *("resource_version", *EVENT),
)
PODS = Layout(
    PodEvent,
    ("pods", "pod_events"),
    *("cluster", "uid", "namespace", "name", "node", ("type", "type.value"), "phase", "holds_gpus"),
    *("gpu_resources", "gpu_amount", "gpu_models", "qos", "cpu_request_milli", "memory_request_bytes"),
    (
        "conditions",
        lambda p: [(c.type, c.status, c.reason, c.message, c.last_transition_time) for c in p.conditions],
    ),
    *("unschedulable_reason", "unschedulable_message"),
    (
        "containers",
        lambda p: [
            (c.name, c.image, c.gpu_amount, c.state, c.reason, c.restart_count, c.exit_code)
            for c in p.containers
        ],
    ),
    *("creation_time", "scheduled_time", "start_time", "termination_time", "deletion_time", "labels", "ip"),
    ("owners", lambda p: [(o.kind, o.api_version, o.name, o.uid) for o in p.owners]),
    ("workload_uid", lambda p: p.owners[-1].uid if p.owners else None),
    *("resource_version", *EVENT),
)
WORKLOADS = Layout(
    WorkloadEvent,
    ("workloads", "workload_events"),
    *("cluster", "uid", "namespace", "name", "kind", ("api_group", "group"), ("api_version", "version")),
    *("parent_uid", ("type", "type.value"), ("status", "status.value"), "gpu_request", "replicas"),
    *("admitted", "admission_message", "labels", "creation_time", "resource_version", *EVENT),
)
CONTAINERS = Layout(
    ContainerEvent,
    ("containers", "container_events"),
    *("cluster", "node", "pod_namespace", "pod_name", "container_name", "pod_uid", "container_id"),
    ("type", "type.value"),
    ("devices", lambda c: [(d.resource_name, d.device_id, d.kind.value) for d in c.devices]),
    ("state", lambda c: c.state.value if c.state is not None else None),
    *("exit_code", "exited_at", "oom_killed"),
    *EVENT,
)
CONTAINER_DEVICES = Layout(
    ContainerEvent,
    "container_devices",
    *("cluster", "node"),
    *items("resource_name", "device_id", ("kind", "kind.value")),
    *("pod_namespace", "pod_name", "container_name", "pod_uid", "container_id", ("type", "type.value")),
    *EVENT,
    each=lambda c: c.devices,
)
"""One row per device a container holds."""
GPU_DEVICES = Layout(
    DeviceInventory,
    "gpu_devices",
    *("cluster", "node"),
    *items("device_id", ("gpu_index", "index"), "vendor", "model", "uuid", "serial", "pci_vendor_id"),
    *items("pci_device_id", "bdf", "numa_node", "vram_total_bytes", "vbios_version", "driver_version"),
    *items("firmware_version", "parent_device_id", ("gpu_partition", "partition")),
    *EVENT,
    each=lambda inventory: inventory.gpus,
)
RDMA_DEVICES = Layout(
    DeviceInventory,
    "rdma_devices",
    *("cluster", "node"),
    *items("name", "port", "state", "physical_state", "link_layer", "rate", "node_guid", "firmware_version"),
    *items("netdev"),
    *EVENT,
    each=lambda inventory: inventory.rdma_devices,
)
SAMPLES = Layout(
    GpuSampleBatch,
    "gpu_samples",
    *("cluster", "node"),
    *items("device_id", ("gpu_index", "index")),
    "event_time",
    *items("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_edge_c"),
    *items("temperature_junction_c", "temperature_memory_c", "power_watts", "energy_joules", "sm_clock_mhz"),
    *items("memory_clock_mhz", "pcie_bandwidth_mbps", "ecc_correctable", "ecc_uncorrectable"),
    *("event_id", "source"),
    each=lambda batch: batch.samples,
)
"""One row per GPU of a batch: what migration 0011's view makes of the batches ClickHouse decodes."""

GPU_HEALTH = Layout(
    GpuHealthEvent,
    "gpu_health",
    *("event_id", "cluster", "event_time", "source", "node", "device_id", ("gpu_index", "index"), "vendor"),
    *("healthy", "conditions", "cause", "xid", "counters", "message"),
)
"""One row per health event (migration 0014)."""

STORAGE_VOLUMES = Layout(
    StorageEvent,
    ("storage_volumes", "storage_volume_events"),
    *("cluster", "name", ("type", "type.value"), "storage_kind", "driver", "storage_class", "namespace"),
    *("claim", "node", "mount_point", "capacity_bytes", "used_bytes", "available_bytes", "labels", *EVENT),
)
"""One row per volume observation (migration 0015)."""

ALLOCATION_METRICS = (
    *("window_start", "window_end", "gpu_capacity", "gpus_allocated_avg", "gpus_allocated_max"),
    *("gpus_allocated_end", "allocation_rate_avg", "pods_running_end", "pods_pending_end"),
)
CLUSTER_GPU_ALLOCATION = Layout(
    ClusterGpuAllocation, "cluster_gpu_allocation", "cluster", *ALLOCATION_METRICS
)
NODE_GPU_ALLOCATION = Layout(
    NodeGpuAllocation, "node_gpu_allocation", "cluster", "node", "gpu_model", *ALLOCATION_METRICS
)
DEAD_LETTERS = Layout(
    DeadLetter,
    "dead_letters",
    *("event_id", "failed_at", "source_topic", "source_partition", "source_offset", "key", "value"),
    *("value_length", "value_sha256", "value_truncated", "reason", "detail", "consumer"),
)

# Derived records are flat: one column per field, in the model's order.
WORKLOAD_GPU_USAGE = Layout(WorkloadGpuUsage, "workload_gpu_usage", *WorkloadGpuUsage.model_fields)
CLUSTER_OVERVIEW = Layout(ClusterOverview, "cluster_overview", *ClusterOverview.model_fields)
ALERTS = Layout(Alert, "alerts", *Alert.model_fields)
DEVICE_CHANGELOG = Layout(DeviceChange, "device_changelog", *DeviceChange.model_fields)
IDLE_GPU_HOURS = Layout(IdleGpuHours, "idle_gpu_hours", *IdleGpuHours.model_fields)
PENDING_GPU_PODS = Layout(PendingGpuPod, "pending_gpu_pods", *PendingGpuPod.model_fields)
RECLAIM_DECISIONS = Layout(ReclaimDecision, "reclaim_decisions", *ReclaimDecision.model_fields)

LAYOUTS: tuple[Layout[Any], ...] = (
    *(NODES, PODS, WORKLOADS, CONTAINERS, CONTAINER_DEVICES, GPU_DEVICES, RDMA_DEVICES, SAMPLES),
    *(CLUSTER_GPU_ALLOCATION, NODE_GPU_ALLOCATION, DEAD_LETTERS, WORKLOAD_GPU_USAGE, CLUSTER_OVERVIEW),
    *(ALERTS, DEVICE_CHANGELOG, GPU_HEALTH, IDLE_GPU_HOURS, PENDING_GPU_PODS, STORAGE_VOLUMES),
    RECLAIM_DECISIONS,
)
"""Every table the sink writes, described (watermarks: none)."""

TABLES: tuple[Table, ...] = tuple(table for layout in LAYOUTS for table in layout.tables)
"""Every table the sink writes."""

GPU_SAMPLES: Table = SAMPLES.tables[0]


def _joined(
    layouts: list[Layout[Any]],
) -> Callable[[Any, int], list[tuple[Table, Row]]]:
    """The rows of every layout of one record type, in order."""
    if len(layouts) == 1:
        return layouts[0].pairs
    first, *rest = (layout.pairs for layout in layouts)

    def pairs(record: Any, offset: int) -> list[tuple[Table, Row]]:
        made = first(record, offset)
        for part in rest:
            made += part(record, offset)
        return made

    return pairs


_PAIRS_OF: dict[type[Record], Callable[[Any, int], list[tuple[Table, Row]]]] = {
    record: _joined([layout for layout in LAYOUTS if layout.record is record])
    for record in dict.fromkeys(layout.record for layout in LAYOUTS)
}
"""The rows of a record of each stored type (a function of records of that type)."""

SINK_TOPICS: tuple[TopicSpec, ...] = tuple(
    spec for spec in CATALOG if spec.record in _PAIRS_OF and spec not in STATE_TOPICS
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
    rows_after: str | None = None
    """The fields before the array whose items are the rows (``s`` string, ``l`` long): how
    many rows a value becomes is read there (:func:`~gpulens.consumers.clickhouse.peeking.array_length`).
    None: one row per value."""
    checked: bool = False
    """Its records are producers' events: one repeating an event id with other content is a
    conflicting duplicate (:mod:`~gpulens.consumers.clickhouse.duplicates`), checked before
    ClickHouse sees it. The pipeline's own outputs replace rows on purpose."""


DECODED_BY_CLICKHOUSE: dict[type[Record], Intake] = {
    record: Intake(table, layout.tables[0].name, rows_after, checked=record in EVENT_TYPES)
    for record, table, layout, rows_after in (
        (GpuSampleBatch, "gpu_sample_batches", SAMPLES, "sslss"),
        (DeviceChange, "device_changes", DEVICE_CHANGELOG, None),
    )
}
"""Record types the sink hands to ClickHouse undecoded: the materialized views of migrations
0011 and 0019 turn them into the rows their layouts above make. Only where that view is a plain
projection of the record."""

INTAKE_TABLES = (
    "gpu_sample_batches",
    "gpu_samples_from_batches",
    "device_changes",
    "device_changelog_from_changes",
)
"""What those migrations create for them: the Null tables the values go into, and their views."""


def rows_of(item: Decoded) -> list[tuple[Table, Row]]:
    """The rows ``item`` becomes, with their tables."""
    return _PAIRS_OF[type(item.record)](item.record, item.offset)
