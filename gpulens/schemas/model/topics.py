"""The topic catalog: every topic GPULens writes, its record type, key and retention.

Topic names are public contracts (DESIGN.md). Keys are UTF-8 ``cluster/entity`` strings so
that one partition sees one entity in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.schemas.model.models import (
    Alert,
    ClusterGpuAllocation,
    ClusterOverview,
    ContainerEvent,
    DeadLetter,
    DeviceChange,
    DeviceInventory,
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
    Watermark,
    WorkloadEvent,
    WorkloadGpuUsage,
    WorkloadState,
)

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic of the catalog."""

    name: str
    record: type[Record]
    key_field: str
    """The record field that names the entity; the key is ``cluster/<that field>``."""
    partitions: int
    cleanup_policy: str = "delete"
    retention_ms: int = 30 * DAY_MS
    doc: str = ""

    @property
    def compacted(self) -> bool:
        """Whether the broker keeps the newest record per key (``compact``, or ``compact,delete``)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def subject(self) -> str:
        """Schema-registry subject of the values (TopicNameStrategy)."""
        return f"{self.name}-value"

    def config(self) -> dict[str, str]:
        """Topic configuration for the admin API."""
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}


NODES = TopicSpec("gpulens.nodes.v1", NodeEvent, "node", 3, doc="Node states as observed.")
PODS = TopicSpec("gpulens.pods.v1", PodEvent, "uid", 6, doc="GPU pod states as observed.")
WORKLOADS = TopicSpec("gpulens.workloads.v1", WorkloadEvent, "uid", 3, doc="Workloads and their hierarchy.")
DEVICE_INVENTORY = TopicSpec(
    "gpulens.devices.inventory.v1", DeviceInventory, "node", 3, doc="GPUs and RDMA ports per node."
)
GPU_SAMPLES = TopicSpec(
    "gpulens.gpu.samples.v1",
    GpuSampleBatch,
    "node",
    6,
    retention_ms=7 * DAY_MS,
    doc="One record per node per interval with every GPU's sample.",
)
CONTAINERS = TopicSpec(
    "gpulens.containers.v1", ContainerEvent, "node", 3, doc="Containers and the devices they hold."
)
GPU_HEALTH = TopicSpec(
    "gpulens.gpu.health.v1",
    GpuHealthEvent,
    "node",
    3,
    retention_ms=90 * DAY_MS,
    doc="GPU health per node: XID errors, ECC and RAS counters, retired or remapped pages, as they change.",
)
STORAGE = TopicSpec("gpulens.storage.v1", StorageEvent, "name", 1, doc="Volume capacity and usage.")
DLQ = TopicSpec(
    "gpulens.dlq.v1",
    DeadLetter,
    "source_topic",
    1,
    retention_ms=90 * DAY_MS,
    doc="Records that could not be processed, with the original bytes and the reason.",
)

WATERMARKS = TopicSpec(
    "gpulens.watermarks.v1", Watermark, "source", 1, doc="Event-time progress; a final one ends a replay."
)
CLUSTER_ALLOCATION = TopicSpec(
    "gpulens.agg.cluster-gpu-allocation.v1",
    ClusterGpuAllocation,
    "cluster",
    1,
    doc="cluster_gpu_allocation: one row per cluster and window.",
)
NODE_ALLOCATION = TopicSpec(
    "gpulens.agg.node-gpu-allocation.v1",
    NodeGpuAllocation,
    "node",
    3,
    doc="node_gpu_allocation: one row per node and window.",
)

CLUSTER_OVERVIEW = TopicSpec(
    "gpulens.agg.cluster-overview.v1",
    ClusterOverview,
    "cluster",
    1,
    doc="cluster_overview: node health and idleness, allocation and utilization per window.",
)
WORKLOAD_USAGE = TopicSpec(
    "gpulens.agg.workload-gpu-usage.v1",
    WorkloadGpuUsage,
    "workload_uid",
    3,
    doc="workload_gpu_usage: GPUs held and their utilization per workload and window.",
)
IDLE_GPU_HOURS = TopicSpec(
    "gpulens.agg.idle-gpu-hours.v1",
    IdleGpuHours,
    "node",
    3,
    doc="idle_gpu_hours: per window, GPU and owner, GPU-hours active, idle, memory-idle, unmeasured "
    "and unallocated.",
)
PENDING_PODS = TopicSpec(
    "gpulens.agg.pending-gpu-pods.v1",
    PendingGpuPod,
    "uid",
    3,
    doc="pending_gpu_pods: why each GPU pod waits, written at a window's end when its verdict changes.",
)
DEVICE_CHANGELOG = TopicSpec(
    "gpulens.changelog.devices.v1",
    DeviceChange,
    "node",
    3,
    retention_ms=365 * DAY_MS,
    doc="GPU and RDMA devices added, removed or changed per node.",
)
ALERTS = TopicSpec(
    "gpulens.alerts.v1", Alert, "entity", 3, retention_ms=90 * DAY_MS, doc="Alerts opened and resolved."
)
RECLAIM_AUDIT = TopicSpec(
    "gpulens.reclaim.audit.v1",
    ReclaimDecision,
    "workload_uid",
    1,
    retention_ms=365 * DAY_MS,
    doc="Every decision of `gpulens reclaim`: skipped and why, would act (dry run), acted, failed.",
)

STATE_DOC = "Compacted: the newest {what}, then a tombstone when it is gone; read it whole to start."
COMPACTED = "compact,delete"
"""The state topics' policy: compacted, and ``delete`` only so that their writer may cut behind
its own rewrites where the broker never compacts (DeleteRecords is refused on a topic that is
only ``compact``); with no time or size retention (:data:`FOREVER`) nothing else is deleted
(:mod:`gpulens.pipeline.compaction`)."""
FOREVER = -1
"""``retention.ms`` of a topic whose records no time deletes."""
CUTTABLE_COMPACTED = {"cleanup.policy": COMPACTED, "retention.ms": str(FOREVER), "retention.bytes": "-1"}
"""Configuration of a compacted topic its writer cuts: neither time nor size deletes anything."""
STATE_PODS = TopicSpec(
    "gpulens.state.pods.v1",
    PodEvent,
    "uid",
    6,
    COMPACTED,
    FOREVER,
    doc=STATE_DOC.format(what="state of every pod"),
)
STATE_NODES = TopicSpec(
    "gpulens.state.nodes.v1",
    NodeEvent,
    "node",
    3,
    COMPACTED,
    FOREVER,
    doc=STATE_DOC.format(what="state of every node"),
)
STATE_INVENTORY = TopicSpec(
    "gpulens.state.devices.v1",
    DeviceInventory,
    "node",
    3,
    COMPACTED,
    FOREVER,
    doc=STATE_DOC.format(what="device inventory of every node"),
)
STATE_CONTAINERS = TopicSpec(
    "gpulens.state.containers.v1",
    ContainerEvent,
    "container_key",
    3,
    COMPACTED,
    FOREVER,
    doc=STATE_DOC.format(what="devices of every container"),
)
STATE_WORKLOADS = TopicSpec(
    "gpulens.state.workloads.v1",
    WorkloadState,
    "uid",
    3,
    COMPACTED,
    FOREVER,
    doc=STATE_DOC.format(what="state of every workload (hierarchy, active pods, GPUs, status)"),
)
STATE_GPU_SAMPLES = TopicSpec(
    "gpulens.state.gpu-samples.v1",
    GpuSampleBatch,
    "node",
    3,
    COMPACTED,
    FOREVER,
    doc="Compacted: each node's newest GPU sample batch, at most one per node per interval "
    "(the worker's `latest` processor); the exporter's per-GPU mode reads it, never the sample stream.",
)
STATE_TOPICS = (
    *(STATE_PODS, STATE_NODES, STATE_INVENTORY, STATE_CONTAINERS, STATE_WORKLOADS),
    STATE_GPU_SAMPLES,
)
"""Compacted topics holding the newest of each entity: they repeat records of the event topics."""

CATALOG: tuple[TopicSpec, ...] = (
    *(NODES, PODS, WORKLOADS, DEVICE_INVENTORY, GPU_SAMPLES, CONTAINERS, STORAGE, WATERMARKS),
    GPU_HEALTH,
    *(CLUSTER_ALLOCATION, NODE_ALLOCATION, CLUSTER_OVERVIEW, WORKLOAD_USAGE, DEVICE_CHANGELOG, ALERTS, DLQ),
    IDLE_GPU_HOURS,
    PENDING_PODS,
    RECLAIM_AUDIT,
    *STATE_TOPICS,
)


def entity_key(cluster: str, entity: str) -> bytes:
    """The record key of an entity: ``cluster/entity``."""
    return f"{cluster}/{entity}".encode()


def record_key(topic: TopicSpec, record: object) -> bytes:
    """The key ``record`` is published with on ``topic``: ``cluster/entity``, or just the cluster
    for per-cluster rows, or the source topic for dead letters. ``record`` is a :data:`Record`, or
    anything holding the same fields (a GPU sample batch read by column)."""
    entity = str(getattr(record, topic.key_field))
    cluster = getattr(record, "cluster", None)
    if cluster is None or topic.key_field == "cluster":
        return entity.encode()
    return entity_key(cluster, entity)
