"""What each endpoint answers, as pydantic models: /openapi.json describes every field from them,
and FastAPI checks every answer against its model before it leaves (a column renamed in SQL
fails a test, not a client).

Fields are the columns of the statements in :mod:`gpulens.api.queries` (snake case, as in the
tables); the envelopes' own fields (``asOf``, ``pageNum``, ``pageSize``, ``groupBy``) are
spelled as the query parameters they echo. Times are RFC 3339 in UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

Row = TypeVar("Row", bound=BaseModel)

AS_OF = Field(default=None, description="The asOf asked (null: the newest state).")


class Listing(BaseModel, Generic[Row]):
    """A whole list."""

    asOf: datetime | None = AS_OF
    data: list[Row]


class Paged(Listing[Row], Generic[Row]):
    """One page of a list, and how many rows the list has in all."""

    total: int
    pageNum: int
    pageSize: int


class Series(BaseModel, Generic[Row]):
    """A time series over ``[start, end)`` in buckets of ``step`` seconds."""

    start: datetime
    end: datetime
    step: int
    data: list[Row]


class Cluster(BaseModel):
    name: str
    nodes: int = Field(description="Nodes not deleted.")
    gpu_capacity: float = Field(description="Allocatable GPUs of Ready, schedulable nodes.")
    newest_event: datetime = Field(description="Its newest node event.")


class OverviewWindow(BaseModel):
    """The newest cluster_overview window that ended by asOf."""

    window_start: datetime
    window_end: datetime
    nodes_total: int
    nodes_healthy: int
    nodes_not_ready: int
    nodes_cordoned: int
    nodes_fully_idle: int
    nodes_partially_idle: int
    nodes_busy: int
    gpu_capacity: float
    gpus_allocated_avg: float
    allocation_rate_avg: float | None
    gpu_utilization_avg: float | None
    gpu_samples: int


class AllocationWindow(BaseModel):
    """A cluster_gpu_allocation window."""

    window_start: datetime
    window_end: datetime
    gpu_capacity: float
    gpus_allocated_avg: float
    gpus_allocated_max: float
    gpus_allocated_end: float
    allocation_rate_avg: float | None
    pods_running_end: int
    pods_pending_end: int


class AllocationNow(BaseModel):
    """GPU allocation at the instant itself (TABLES.md's "as of" query)."""

    gpu_capacity: float
    gpus_allocated: float
    pods_running: int
    pods_pending: int
    allocation_rate: float | None


class FaultyNode(BaseModel):
    node: str
    reasons: list[str] = Field(description="NotReady, GpuLost.")
    gpus_lost: int


class Overview(BaseModel):
    cluster: str
    asOf: datetime | None = AS_OF
    nodes: OverviewWindow | None
    allocation: AllocationWindow | None
    now: AllocationNow
    faulty_nodes: list[FaultyNode]


class Consumer(BaseModel):
    uid: str
    kind: str
    name: str
    namespace: str
    window_start: datetime
    window_end: datetime
    gpus_held: float = Field(description="GPUs held at the end of its newest window.")
    gpus_allocated_avg: float
    utilization_avg: float | None
    utilization_max: float | None
    pods: int


class IdleWorkload(BaseModel):
    """A workload's GPU-hours held but idle (held x (1 - utilization), window by window)."""

    uid: str
    kind: str
    name: str
    namespace: str
    gpu_hours: float = Field(description="GPU-hours held over its windows in range.")
    measured_gpu_hours: float = Field(description="Of those, held in windows with GPU samples.")
    idle_gpu_hours: float = Field(description="Held x (1 - mean utilization), over measured windows.")
    utilization_avg: float | None = Field(description="Mean utilization of its samples, %.")
    samples: int
    windows: int
    last_window_end: datetime


class HeatmapCell(BaseModel):
    node: str
    gpu_index: int
    time: datetime = Field(description="Start of the bucket.")
    utilization: float | None
    samples: int


class Node(BaseModel):
    name: str
    ready: bool
    schedulable: bool
    gpu_model: str | None
    gpu_vendor: str | None
    gpus_allocatable: float
    gpus_allocated: float
    pods_running: int
    last_seen: datetime


class NodeDetail(BaseModel):
    """Every column of the node's newest observation (node_events), and what it holds then."""

    model_config = ConfigDict(extra="allow")

    asOf: datetime | None = AS_OF
    cluster: str
    node: str
    type: str
    ready: bool
    schedulable: bool
    gpus_allocatable: float
    gpu_model: str | None
    event_time: datetime
    gpus_allocated: float | None = None
    pods_running: int | None = None


class GpuDevice(BaseModel):
    device_id: str
    gpu_index: int
    vendor: str
    model: str
    uuid: str | None
    serial: str | None
    bdf: str | None
    vram_total_bytes: int | None
    driver_version: str | None
    gpu_partition: str | None
    pod_namespace: str | None = Field(description="The container holding it then (null: free).")
    pod_name: str | None
    container_name: str | None


class GpuHealth(BaseModel):
    device_id: str
    gpu_index: int
    vendor: str
    healthy: bool = Field(description="No critical condition holds (its newest health event by asOf).")
    conditions: list[str] = Field(description="Critical conditions holding: xid-79, ecc-uncorrectable, ...")
    cause: str = Field(description="What the newest event reported: xid, counters or cleared.")
    xid: int | None
    counters: dict[str, int] = Field(description="Error counters as NVML or amdsmi names them.")
    message: str
    last_seen: datetime = Field(description="Time of the newest health event.")


class GpuMetric(BaseModel):
    gpu_index: int
    device_id: str
    time: datetime
    utilization: float | None
    memory_used_bytes_avg: float | None
    power_watts_avg: float | None
    temperature_junction_c_avg: float | None
    samples: int


class UtilizationPoint(BaseModel):
    time: datetime
    utilization: float | None
    samples: int


class NodeWorkload(BaseModel):
    uid: str
    kind: str
    name: str
    namespace: str
    pods: int
    gpus: float


class HeldPeriod(BaseModel):
    """A pod that held GPUs of the node."""

    pod_uid: str
    namespace: str
    name: str
    workload_uid: str
    workload_kind: str
    workload_name: str
    gpu_amount: float
    held_from: datetime
    held_until: datetime | None = Field(description="Null: holding at the newest event.")


class NodeWindow(BaseModel):
    """A node_gpu_allocation window."""

    window_start: datetime
    window_end: datetime
    gpu_model: str | None
    gpu_capacity: float
    gpus_allocated_avg: float
    gpus_allocated_max: float
    gpus_allocated_end: float
    allocation_rate_avg: float | None
    pods_running_end: int


class Workload(BaseModel):
    uid: str
    kind: str
    name: str
    namespace: str
    status: str = Field(description="Running, Pending, Failed or Done (from its pods).")
    pods: int = Field(description="Pods not deleted.")
    pods_running: int
    gpus_held: float
    created: datetime
    last_seen: datetime


class WorkloadNow(Workload):
    asOf: datetime | None = AS_OF


class Pod(BaseModel):
    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    deleted: bool
    holds_gpus: bool
    gpu_amount: float
    creation_time: datetime
    unschedulable_reason: str | None
    last_seen: datetime


class Branch(BaseModel):
    """An object of a workload's tree: its child objects, and the pods it owns directly."""

    uid: str
    kind: str
    name: str
    children: list[Branch]
    pods: list[Pod]


class Hierarchy(Branch):
    asOf: datetime | None = AS_OF


class WorkloadWindow(BaseModel):
    """A workload_gpu_usage window."""

    window_start: datetime
    window_end: datetime
    gpus_allocated_avg: float
    gpus_allocated_max: float
    gpus_allocated_end: float
    utilization_avg: float | None
    utilization_max: float | None
    samples: int
    pods_active_end: int


class Alert(BaseModel):
    alert: str
    entity: str = Field(description="GPU id, pod uid or node name.")
    state: str = Field(description="OPENED or RESOLVED: its newest change by asOf.")
    event_time: datetime
    since: datetime
    node: str | None
    gpu_id: str | None
    pod_uid: str | None
    pod_namespace: str | None
    pod_name: str | None
    message: str
    labels: dict[str, str]


class PendingPod(BaseModel):
    uid: str
    namespace: str
    name: str
    workload_uid: str
    workload_kind: str
    workload_name: str
    gpus_requested: float
    created: datetime
    reason: str | None
    message: str | None
    age_s: float = Field(description="Seconds it has waited by asOf (or the cluster's newest event).")
    free_gpus: dict[str, float] | None = Field(description="Free GPUs by model when its alert opened.")
    max_free_on_one_node: dict[str, float] | None
    reason_class: str | None = Field(
        description="Why it waits: insufficient_gpus, fragmentation, taint_or_affinity, node_unavailable, "
        "quota, not_admitted or unknown (its newest verdict by asOf; null before its first window end)."
    )
    fits_after_consolidation: bool | None = Field(
        description="It fits now, or moving running pods off one node would make room for it."
    )
    judged_at: datetime | None = Field(description="The window end its verdict is from.")


class Pending(Listing[PendingPod]):
    now: datetime = Field(description="The instant ages count to.")


class HourlyRow(BaseModel):
    hour: datetime
    group_key: str = Field(description="The namespace, workload uid or label value.")
    group_label: str
    gpu_hours: float
    utilization_avg: float | None
    utilization_p50: float | None
    utilization_p95: float | None
    utilization_max: float | None
    samples: int
    workloads: int


class Hourly(BaseModel):
    groupBy: str
    data: list[HourlyRow]


class IdleByOwnerRow(BaseModel):
    """One owner's GPU-hours held in one hour, by kind (idle_gpu_hours)."""

    hour: datetime
    group_key: str = Field(description="The workload uid, namespace or label value.")
    group_label: str
    active_gpu_hours: float = Field(description="Held, utilization at or above the idle threshold.")
    idle_gpu_hours: float = Field(description="Held, utilization under the idle threshold.")
    memory_idle_gpu_hours: float = Field(description="Held, utilization near 0 with VRAM used.")
    unmeasured_gpu_hours: float = Field(description="Held with no valid sample of the GPU.")
    held_gpu_hours: float = Field(description="The four above together.")
    workloads: int


class UnallocatedHour(BaseModel):
    hour: datetime
    unallocated_gpu_hours: float = Field(description="GPU-hours of the reported GPUs nobody held.")


class IdleByOwner(BaseModel):
    cluster: str
    groupBy: str
    data: list[IdleByOwnerRow]
    unallocated: list[UnallocatedHour]


class Health(BaseModel):
    status: str


class Problem(BaseModel):
    """One refused parameter."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    name: str = Field(description="The parameter, as the request spells it (e.g. pageSize).")
    in_: str = Field(alias="in", description="query or path.")
    message: str


class BadParameters(BaseModel):
    """400: the parameters refused, each named."""

    error: str = Field(description="invalid parameter: NAME[, NAME ...]")
    parameters: list[Problem]


class Failure(BaseModel):
    """401, 404, 500, 503: what went wrong."""

    error: str


class StorageVolume(BaseModel):
    """A PersistentVolume as last observed (storage_volume_events)."""

    name: str = Field(description="PersistentVolume name.")
    storage_kind: str = Field(description="juicefs, nfs, lustre, hostpath, local, csi, ...")
    driver: str | None = Field(description="CSI driver or provisioner.")
    storage_class: str | None
    namespace: str | None = Field(description="Namespace of the bound claim.")
    claim: str | None = Field(description="The bound PersistentVolumeClaim; null while unbound.")
    node: str | None = Field(description="Node of a local or hostPath volume.")
    mount_point: str | None = Field(description="Directory of a local/hostPath volume; NFS server:/export.")
    capacity_bytes: int | None = Field(description="The claim's status.capacity, else the volume's.")
    used_bytes: int | None = Field(description="Used bytes the kubelet last measured; null: never mounted.")
    available_bytes: int | None = Field(description="Available bytes the kubelet last measured.")
    used_pct: float | None = Field(description="used / (used + available), %, as df reports it.")
    last_seen: datetime
