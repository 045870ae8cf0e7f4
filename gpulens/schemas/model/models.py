"""The event model: every record GPULens publishes, as pydantic models.

These classes are the single source of the Avro schemas in ``gpulens/schemas/model/avro/*.avsc``
(``gpulens schemas export`` writes them; a test fails when the two drift). Changing a
model is changing a public contract: only add fields with defaults.

Conventions: times are UTC ``datetime`` (Avro ``timestamp-millis``); amounts of GPUs are
floats because a shared GPU counts as its fraction; every event carries ``cluster``, a
deterministic ``event_id`` (see :func:`gpulens.schemas.model.ids.event_id`), its ``event_time`` and the
``source`` that observed it.

Semantic rules (DESIGN.md, "Ranges every record obeys"): no number is NaN or infinite; amounts,
sizes, counts and readings are never negative; utilization is a percentage (0 to 100); every
time lies in [:data:`EARLIEST`, :data:`LATEST`). A record breaking one is refused wherever it
enters (the gateway answers INVALID_ARGUMENT, consumers dead-letter it as ``invalid-record``).
The time bound is a sanity bound of the model; the worker enforces a tighter one relative to
each cluster's event time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum, StrEnum
from typing import Annotated, ClassVar

from annotated_types import Ge, Lt
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

__all__ = [
    "AVRO_ENUM_DEFAULTS",
    "EARLIEST",
    "EVENT_TYPES",
    "LATEST",
    "Address",
    "Alert",
    "AlertState",
    "ChangeType",
    "ClusterGpuAllocation",
    "ClusterOverview",
    "ContainerEvent",
    "ContainerRuntimeState",
    "ContainerState",
    "DeadLetter",
    "DeviceAssignment",
    "DeviceChange",
    "DeviceInventory",
    "DeviceKind",
    "Event",
    "GpuDevice",
    "GpuHealthEvent",
    "GpuSample",
    "GpuSampleBatch",
    "IdleGpuHours",
    "NodeEvent",
    "NodeGpuAllocation",
    "NonNegative",
    "OwnerReference",
    "PendingGpuPod",
    "PodCondition",
    "PodEvent",
    "RdmaDevice",
    "ReclaimDecision",
    "ReclaimVerdict",
    "Record",
    "StorageEvent",
    "Taint",
    "Timestamp",
    "Watermark",
    "WorkloadEvent",
    "WorkloadGpuUsage",
    "WorkloadStatus",
]


def _utc_millis(value: datetime) -> datetime:
    # Avro timestamp-millis keeps milliseconds: normalising here makes round trips exact.
    if value.tzinfo is UTC and not value.microsecond % 1000:
        return value  # already normal, as every time the worker builds: no copies
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
"""No time a record carries is earlier: a 1970 time is an unset clock or a zero, not an event."""
LATEST = datetime(2100, 1, 1, tzinfo=UTC)
"""Every time a record carries is earlier: later ones are corrupt, and would make the worker
build windows up to them."""

Timestamp = Annotated[AwareDatetime, Ge(EARLIEST), Lt(LATEST), AfterValidator(_utc_millis)]
"""A UTC instant with millisecond precision (Avro ``timestamp-millis``) in [EARLIEST, LATEST)."""

NonNegative = Annotated[float, Ge(0)]
"""An amount that cannot be below zero (GPUs per resource name)."""


class Record(BaseModel):
    """Base of every Avro record: frozen, strict about unknown fields, every number finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)
    avro_namespace: ClassVar[str] = "io.gpulens.v1"


class ChangeType(StrEnum):
    """What happened to the entity, as a Kubernetes watch says it."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Event(Record):
    """Fields every event carries."""

    event_id: str = Field(description="Deterministic id of this observation; sinks dedup on it.")
    cluster: str = Field(min_length=1, description="Name of the cluster the entity belongs to.")
    event_time: Timestamp = Field(description="When the change happened (event time, UTC).")
    source: str = Field(
        min_length=1, description="What observed it: k8s-watcher, node-agent, replay:alibaba-v2023, ..."
    )


# --- nodes -----------------------------------------------------------------------------------


class Taint(Record):
    """A node taint."""

    key: str = Field(description="Taint key.")
    value: str | None = Field(default=None, description="Taint value, if any.")
    effect: str = Field(description="NoSchedule, PreferNoSchedule or NoExecute.")


class Address(Record):
    """A node address."""

    type: str = Field(description="InternalIP, ExternalIP, Hostname, ...")
    address: str = Field(description="The address.")


class NodeEvent(Event):
    """A Kubernetes node as observed at ``event_time`` (full state, not a diff)."""

    type: ChangeType = Field(description="ADDED, MODIFIED or DELETED.")
    node: str = Field(min_length=1, description="Node name.")
    uid: str | None = Field(default=None, description="Node object uid.")
    ready: bool = Field(description="The Ready condition is True.")
    schedulable: bool = Field(description="Not cordoned (spec.unschedulable is not set).")
    taints: list[Taint] = Field(default_factory=list, description="Node taints.")
    addresses: list[Address] = Field(default_factory=list, description="Node addresses.")
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")
    cpu_capacity_milli: int | None = Field(default=None, ge=0, description="CPU capacity, millicores.")
    cpu_allocatable_milli: int | None = Field(default=None, ge=0, description="Allocatable CPU, millicores.")
    memory_capacity_bytes: int | None = Field(default=None, ge=0, description="Memory capacity, bytes.")
    memory_allocatable_bytes: int | None = Field(default=None, ge=0, description="Allocatable memory, bytes.")
    gpu_capacity: dict[str, NonNegative] = Field(
        default_factory=dict, description="Capacity per configured GPU resource name (amd.com/gpu, ...)."
    )
    gpu_allocatable: dict[str, NonNegative] = Field(
        default_factory=dict, description="Allocatable amount per configured GPU resource name."
    )
    gpu_model: str | None = Field(default=None, description="GPU model from the node's labels.")
    gpu_vendor: str | None = Field(default=None, description="AMD or NVIDIA, from the resource names.")
    kubelet_version: str | None = Field(default=None, description="Kubelet version.")
    container_runtime_version: str | None = Field(default=None, description="e.g. containerd://1.7.2.")
    kernel_version: str | None = Field(default=None, description="Kernel version.")
    os_image: str | None = Field(default=None, description="OS image.")
    resource_version: str | None = Field(default=None, description="Kubernetes resourceVersion seen.")

    @property
    def gpus_allocatable(self) -> float:
        """GPUs this node offers to pods (sum over the configured GPU resources)."""
        return sum(self.gpu_allocatable.values())


# --- pods and workloads ----------------------------------------------------------------------


class OwnerReference(Record):
    """One link of a pod's owner chain."""

    kind: str = Field(description="Owner kind: ReplicaSet, Deployment, Job, CronJob, PyTorchJob, ...")
    api_version: str = Field(description="Owner apiVersion, e.g. apps/v1.")
    name: str = Field(description="Owner name.")
    uid: str = Field(description="Owner uid.")


class PodCondition(Record):
    """A pod condition (PodScheduled, Initialized, ContainersReady, Ready, ...)."""

    type: str = Field(description="Condition type.")
    status: str = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="Machine-readable reason.")
    message: str | None = Field(default=None, description="Human-readable message.")
    last_transition_time: Timestamp | None = Field(default=None, description="Last transition.")


class ContainerState(Record):
    """A container of a pod: its GPU amount and its current state."""

    name: str = Field(description="Container name.")
    image: str | None = Field(default=None, description="Image reference.")
    gpu_amount: float = Field(default=0.0, ge=0, description="GPUs this container asks for.")
    state: str | None = Field(default=None, description="waiting, running or terminated.")
    reason: str | None = Field(default=None, description="Reason of the state (CrashLoopBackOff, ...).")
    restart_count: int = Field(default=0, ge=0, description="Restarts so far.")
    exit_code: int | None = Field(default=None, description="Exit code when terminated.")


class PodEvent(Event):
    """A GPU pod as observed at ``event_time`` (full state, not a diff)."""

    type: ChangeType = Field(description="ADDED, MODIFIED or DELETED.")
    uid: str = Field(min_length=1, description="Pod uid: the entity key.")
    namespace: str = Field(description="Namespace.")
    name: str = Field(description="Pod name.")
    node: str | None = Field(default=None, description="Node the pod is bound to; null while pending.")
    phase: str = Field(description="Pending, Running, Succeeded, Failed or Unknown.")
    gpu_resources: dict[str, NonNegative] = Field(
        default_factory=dict, description="GPU amount per resource name, summed over containers."
    )
    gpu_amount: float = Field(ge=0, description="GPUs held (DESIGN.md definition; shares as fractions).")
    gpu_models: list[str] = Field(
        default_factory=list, description="GPU models the pod may run on (empty: any)."
    )
    qos: str | None = Field(default=None, description="QoS class or priority tier.")
    cpu_request_milli: int | None = Field(default=None, ge=0, description="CPU requested, millicores.")
    memory_request_bytes: int | None = Field(default=None, ge=0, description="Memory requested, bytes.")
    conditions: list[PodCondition] = Field(default_factory=list, description="Pod conditions.")
    unschedulable_reason: str | None = Field(
        default=None, description="PodScheduled=False reason, e.g. Unschedulable."
    )
    unschedulable_message: str | None = Field(
        default=None, description="Scheduler message, e.g. '0/12 nodes are available: ...'."
    )
    containers: list[ContainerState] = Field(default_factory=list, description="Containers.")
    creation_time: Timestamp = Field(description="metadata.creationTimestamp.")
    scheduled_time: Timestamp | None = Field(default=None, description="When bound to a node.")
    start_time: Timestamp | None = Field(default=None, description="status.startTime.")
    termination_time: Timestamp | None = Field(default=None, description="When it finished.")
    deletion_time: Timestamp | None = Field(default=None, description="When deleted.")
    labels: dict[str, str] = Field(default_factory=dict, description="Pod labels.")
    ip: str | None = Field(default=None, description="Pod IP.")
    owners: list[OwnerReference] = Field(
        default_factory=list, description="Owner chain, direct owner first, top workload last."
    )
    resource_version: str | None = Field(default=None, description="Kubernetes resourceVersion seen.")

    @property
    def holds_gpus(self) -> bool:
        """Bound and running, not terminated nor deleted (DESIGN.md)."""
        return (
            self.type != ChangeType.DELETED
            and self.node is not None
            and self.phase == "Running"
            and self.gpu_amount > 0
        )


class WorkloadStatus(StrEnum):
    """Lifecycle of a workload."""

    RUNNING = "Running"
    DONE = "Done"
    FAILED = "Failed"
    DELETED = "Deleted"


class WorkloadEvent(Event):
    """A workload (Deployment, Job, PyTorchJob, ...) with its place in the owner hierarchy."""

    type: ChangeType = Field(description="ADDED, MODIFIED or DELETED.")
    uid: str = Field(min_length=1, description="Workload uid: the entity key.")
    namespace: str = Field(description="Namespace.")
    name: str = Field(description="Name.")
    group: str = Field(description="API group ('' for the core group).")
    version: str = Field(description="API version.")
    kind: str = Field(description="Kind.")
    parent_uid: str | None = Field(default=None, description="Owner's uid (ReplicaSet -> Deployment).")
    gpu_request: float = Field(default=0.0, ge=0, description="Template GPU amount x replicas/parallelism.")
    replicas: int | None = Field(default=None, ge=0, description="Desired replicas or parallelism.")
    status: WorkloadStatus = Field(description="Running, Done, Failed or Deleted.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    creation_time: Timestamp | None = Field(default=None, description="metadata.creationTimestamp.")
    resource_version: str | None = Field(default=None, description="Kubernetes resourceVersion seen.")
    admitted: bool | None = Field(
        default=None,
        description="A queued workload (Kueue's Workload): admitted or not; None for every other kind.",
    )
    admission_message: str | None = Field(
        default=None, description="Why a queued workload is not admitted, in its queue's words."
    )


# --- devices on a node -----------------------------------------------------------------------


class GpuDevice(Record):
    """Static inventory of one GPU (or MIG / partition) as amdsmi or NVML reports it."""

    device_id: str = Field(description="Stable id: UUID or serial; MIG devices have their own.")
    index: int = Field(ge=0, description="Index on the node as the driver numbers it.")
    vendor: str = Field(description="AMD or NVIDIA.")
    model: str = Field(description="Market name, e.g. AMD Instinct MI300X, NVIDIA H100 80GB HBM3.")
    uuid: str | None = Field(default=None, description="Driver UUID.")
    serial: str | None = Field(default=None, description="Board serial number.")
    pci_vendor_id: str | None = Field(default=None, description="PCI vendor id, e.g. 0x1002.")
    pci_device_id: str | None = Field(default=None, description="PCI device id, e.g. 0x74a1.")
    bdf: str | None = Field(default=None, description="PCI bus address, e.g. 0000:0c:00.0.")
    numa_node: int | None = Field(default=None, description="NUMA node.")
    vram_total_bytes: int | None = Field(default=None, ge=0, description="VRAM size, bytes.")
    vbios_version: str | None = Field(default=None, description="VBIOS version.")
    driver_version: str | None = Field(default=None, description="Driver version.")
    firmware_version: str | None = Field(default=None, description="Main firmware version.")
    parent_device_id: str | None = Field(default=None, description="Parent GPU of a MIG/partition.")
    partition: str | None = Field(default=None, description="MIG profile or compute partition.")

    @property
    def aliases(self) -> tuple[str, ...]:
        """The other names device plugins give this GPU (UUID, PCI address, serial), where known."""
        return tuple(name for name in (self.uuid, self.bdf, self.serial) if name)


class RdmaDevice(Record):
    """One RDMA/InfiniBand port from /sys/class/infiniband."""

    name: str = Field(description="Device name, e.g. mlx5_0.")
    port: int = Field(ge=0, description="Port number.")
    state: str | None = Field(default=None, description="Port state, e.g. ACTIVE.")
    physical_state: str | None = Field(default=None, description="Physical state, e.g. LinkUp.")
    link_layer: str | None = Field(default=None, description="InfiniBand or Ethernet.")
    rate: str | None = Field(default=None, description="Link rate, e.g. '400 Gb/sec (4X NDR)'.")
    node_guid: str | None = Field(default=None, description="Node GUID.")
    firmware_version: str | None = Field(default=None, description="Firmware version.")
    netdev: str | None = Field(default=None, description="Associated network interface.")


class DeviceInventory(Event):
    """Every GPU and RDMA device of one node, as the node agent sees them now."""

    node: str = Field(min_length=1, description="Node name.")
    gpus: list[GpuDevice] = Field(default_factory=list, description="GPUs.")
    rdma_devices: list[RdmaDevice] = Field(default_factory=list, description="RDMA ports.")


class GpuSample(Record):
    """Metrics of one GPU at one instant; unknown values are null."""

    device_id: str = Field(description="GpuDevice.device_id.")
    index: int = Field(ge=0, description="GPU index on the node.")
    utilization_pct: float | None = Field(default=None, ge=0, le=100, description="GFX/SM activity, percent.")
    memory_used_bytes: int | None = Field(default=None, ge=0, description="VRAM used, bytes.")
    memory_total_bytes: int | None = Field(default=None, ge=0, description="VRAM total, bytes.")
    temperature_edge_c: float | None = Field(default=None, ge=0, description="Edge/GPU temperature, C.")
    temperature_junction_c: float | None = Field(default=None, ge=0, description="Junction/hotspot, C.")
    temperature_memory_c: float | None = Field(default=None, ge=0, description="Memory temperature, C.")
    power_watts: float | None = Field(default=None, ge=0, description="Socket/board power, W.")
    energy_joules: float | None = Field(default=None, ge=0, description="Energy counter, J.")
    sm_clock_mhz: float | None = Field(default=None, ge=0, description="Graphics/SM clock, MHz.")
    memory_clock_mhz: float | None = Field(default=None, ge=0, description="Memory clock, MHz.")
    pcie_bandwidth_mbps: float | None = Field(default=None, ge=0, description="PCIe bandwidth, MB/s.")
    ecc_correctable: int | None = Field(default=None, ge=0, description="Correctable ECC errors (total).")
    ecc_uncorrectable: int | None = Field(default=None, ge=0, description="Uncorrectable ECC errors (total).")


class GpuSampleBatch(Event):
    """All GPU samples of one node at one collection: one record per node per interval."""

    node: str = Field(min_length=1, description="Node name.")
    samples: list[GpuSample] = Field(default_factory=list, description="One sample per GPU.")


class GpuHealthEvent(Event):
    """One GPU's health as its node agent sees it, published when it changes: an XID arrived, an
    error counter moved, a condition began or cleared (full state, not a diff).

    ``conditions`` are the critical conditions holding now; the GPU is healthy when there are
    none, and ``healthy`` turning false opens GpuUnhealthy, true again resolves it. Counters
    keep the names the vendor library gives them (NVML: ``ecc_volatile_uncorrected``,
    ``retired_pages_dbe``, ``remapped_rows_pending``, ...; amdsmi: ``uncorrectable_count`` and
    ``umc.uncorrectable_count`` per RAS block).
    """

    node: str = Field(min_length=1, description="Node name.")
    device_id: str = Field(description="GpuDevice.device_id.")
    index: int = Field(ge=0, description="GPU index on the node.")
    vendor: str = Field(description="AMD or NVIDIA.")
    healthy: bool = Field(description="No critical condition holds on this GPU now.")
    conditions: list[str] = Field(
        default_factory=list,
        description="Critical conditions holding now: xid-79, ecc-uncorrectable, retired-pages-pending, "
        "row-remap-pending, row-remap-failure, ras-uncorrectable, ras-uncorrectable.umc, ...",
    )
    cause: str = Field(description="What this record reports: xid, counters or cleared.")
    xid: int | None = Field(
        default=None, ge=0, description="The XID that arrived (cause xid), as NVML gives it."
    )
    counters: dict[str, Annotated[int, Ge(0)]] = Field(
        default_factory=dict, description="The GPU's error counters now, named as the library names them."
    )
    message: str = Field(description="What happened, for people.")


class DeviceKind(StrEnum):
    """What kind of device a container holds."""

    GPU = "GPU"
    RDMA = "RDMA"
    OTHER = "OTHER"


class DeviceAssignment(Record):
    """A device held by a container (from the kubelet pod-resources API)."""

    resource_name: str = Field(description="Device plugin resource, e.g. amd.com/gpu.")
    device_id: str = Field(description="Device id as the device plugin reports it.")
    kind: DeviceKind = Field(default=DeviceKind.OTHER, description="GPU, RDMA or OTHER.")


class ContainerRuntimeState(StrEnum):
    """Where a container is in its life, as the container runtime (containerd) reports it."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    DELETED = "DELETED"


class ContainerEvent(Event):
    """A container and the devices it holds now (full set; DELETED when it is gone).

    Two observers publish it: the kubelet's pod-resources API when the devices a container holds
    change (``state`` unset), and the container runtime's event stream when the container is
    created, starts, is OOM-killed, exits or is deleted (``state`` set, with ``container_id`` the
    runtime's instance it speaks of). Either way ``devices`` is the full set held now.
    """

    type: ChangeType = Field(description="ADDED, MODIFIED or DELETED.")
    node: str = Field(min_length=1, description="Node name.")
    pod_uid: str | None = Field(default=None, description="Pod uid, when known.")
    pod_namespace: str = Field(description="Pod namespace.")
    pod_name: str = Field(description="Pod name.")
    container_name: str = Field(description="Container name.")
    container_id: str | None = Field(default=None, description="Runtime container id.")
    devices: list[DeviceAssignment] = Field(default_factory=list, description="Devices held now.")
    state: ContainerRuntimeState | None = Field(
        default=None,
        description="CREATED, RUNNING, EXITED or DELETED, from the container runtime; null when the "
        "record reports a change of devices only.",
    )
    exit_code: int | None = Field(
        default=None, description="The main process's exit status, once EXITED (137: killed by SIGKILL)."
    )
    exited_at: Timestamp | None = Field(default=None, description="When the main process exited.")
    oom_killed: bool = Field(
        default=False, description="The kernel's OOM killer killed a process of this container instance."
    )

    @property
    def container_key(self) -> str:
        """``node/namespace/pod/container``: one container, whatever pod uid it had."""
        return f"{self.node}/{self.pod_namespace}/{self.pod_name}/{self.container_name}"


class StorageEvent(Event):
    """Capacity and usage of one volume or filesystem."""

    type: ChangeType = Field(description="ADDED, MODIFIED or DELETED.")
    node: str | None = Field(default=None, description="Node, for node-local storage.")
    storage_kind: str = Field(
        description="juicefs, nfs, lustre, hostpath, local, another in-tree volume type (lowercase), or csi."
    )
    name: str = Field(description="Volume or filesystem name (a PersistentVolume's name).")
    namespace: str | None = Field(default=None, description="Namespace of a PVC.")
    storage_class: str | None = Field(default=None, description="StorageClass.")
    mount_point: str | None = Field(default=None, description="Where it is mounted.")
    capacity_bytes: int | None = Field(default=None, ge=0, description="Capacity, bytes.")
    used_bytes: int | None = Field(default=None, ge=0, description="Used, bytes.")
    available_bytes: int | None = Field(default=None, ge=0, description="Available, bytes.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    driver: str | None = Field(
        default=None, description="CSI driver or provisioner: csi.juicefs.com, nfs.csi.k8s.io, ..."
    )
    claim: str | None = Field(default=None, description="Name of the PVC bound to the volume, in namespace.")


# --- progress markers ------------------------------------------------------------------------


class Watermark(Event):
    """Event time has reached ``event_time`` for ``cluster``: no earlier event will follow.

    A replay publishes a final one when it ends, so every open window closes.
    """

    final: bool = Field(default=False, description="The stream ends here: close every open window.")


# --- aggregates (outputs of the stream processors) ---------------------------------------------


class ClusterGpuAllocation(Record):
    """GPU allocation of one cluster over one window (DESIGN.md, cluster_gpu_allocation)."""

    event_id: str = Field(description="cluster and window start: one row per window, ever.")
    cluster: str = Field(description="Cluster name.")
    window_start: Timestamp = Field(description="Window start (inclusive).")
    window_end: Timestamp = Field(description="Window end (exclusive).")
    gpu_capacity: float = Field(description="Allocatable GPUs of Ready, schedulable nodes at window end.")
    gpus_allocated_avg: float = Field(description="Time-weighted mean of GPUs held over the window.")
    gpus_allocated_max: float = Field(description="Most GPUs held at any instant of the window.")
    gpus_allocated_end: float = Field(description="GPUs held at window end.")
    allocation_rate_avg: float | None = Field(
        default=None, description="gpus_allocated_avg / gpu_capacity; null when capacity is 0."
    )
    pods_running_end: int = Field(description="GPU pods holding GPUs at window end.")
    pods_pending_end: int = Field(description="GPU pods that exist but are not bound at window end.")


class NodeGpuAllocation(Record):
    """GPU allocation of one node over one window (the cluster row's columns, per node)."""

    event_id: str = Field(description="cluster, node and window start.")
    cluster: str = Field(description="Cluster name.")
    node: str = Field(description="Node name.")
    gpu_model: str | None = Field(default=None, description="GPU model of the node.")
    window_start: Timestamp = Field(description="Window start (inclusive).")
    window_end: Timestamp = Field(description="Window end (exclusive).")
    gpu_capacity: float = Field(description="Allocatable GPUs if the node is Ready and schedulable, else 0.")
    gpus_allocated_avg: float = Field(description="Time-weighted mean of GPUs held over the window.")
    gpus_allocated_max: float = Field(description="Most GPUs held at any instant of the window.")
    gpus_allocated_end: float = Field(description="GPUs held at window end.")
    allocation_rate_avg: float | None = Field(
        default=None, description="gpus_allocated_avg / gpu_capacity; null when capacity is 0."
    )
    pods_running_end: int = Field(description="GPU pods holding GPUs on this node at window end.")
    pods_pending_end: int = Field(default=0, description="Always 0: pending pods have no node yet.")


class ClusterOverview(Record):
    """How the nodes of a cluster stand at the end of a window, with allocation and utilization."""

    event_id: str = Field(description="cluster and window start.")
    cluster: str = Field(description="Cluster name.")
    window_start: Timestamp = Field(description="Window start (inclusive).")
    window_end: Timestamp = Field(description="Window end (exclusive).")
    nodes_total: int = Field(description="Nodes known (not deleted).")
    nodes_healthy: int = Field(description="Ready and schedulable.")
    nodes_not_ready: int = Field(description="Ready condition not True.")
    nodes_cordoned: int = Field(description="Ready but unschedulable.")
    nodes_fully_idle: int = Field(description="Healthy GPU nodes with no GPU held.")
    nodes_partially_idle: int = Field(description="Healthy GPU nodes with some but not all GPUs held.")
    nodes_busy: int = Field(description="Healthy GPU nodes with every GPU held.")
    gpu_capacity: float = Field(description="As in cluster_gpu_allocation.")
    gpus_allocated_avg: float = Field(description="As in cluster_gpu_allocation.")
    allocation_rate_avg: float | None = Field(default=None, description="As in cluster_gpu_allocation.")
    gpu_utilization_avg: float | None = Field(default=None, description="Mean of every GPU sample, %.")
    gpu_samples: int = Field(default=0, description="GPU samples in the window.")


class WorkloadGpuUsage(Record):
    """GPUs a workload held and how busy they were over one window (Primus-Lens "GPU consumers")."""

    event_id: str = Field(description="cluster, workload and window start.")
    cluster: str = Field(description="Cluster name.")
    workload_uid: str = Field(description="Top owner's uid (the pod's own uid for a bare pod).")
    workload_kind: str = Field(description="Top owner's kind: Deployment, PyTorchJob, ... or Pod.")
    workload_name: str = Field(description="Top owner's name.")
    namespace: str = Field(description="Namespace.")
    window_start: Timestamp = Field(description="Window start (inclusive).")
    window_end: Timestamp = Field(description="Window end (exclusive).")
    gpus_allocated_avg: float = Field(description="Time-weighted mean of GPUs its pods held.")
    gpus_allocated_max: float = Field(description="Most GPUs its pods held at any instant.")
    gpus_allocated_end: float = Field(description="GPUs its pods held at window end.")
    utilization_avg: float | None = Field(default=None, description="Mean utilization of its GPU samples, %.")
    utilization_max: float | None = Field(default=None, description="Highest sample utilization, %.")
    samples: int = Field(default=0, description="GPU samples of its GPUs in the window.")
    pods_active_end: int = Field(description="Its pods holding GPUs at window end.")


class IdleGpuHours(Record):
    """How one GPU's hours of one window were spent by one owner, or left unallocated.

    One row per window, GPU and workload holding a share of it, plus one for the unallocated
    remainder (``workload_uid`` empty). A GPU's rows add up to its total over the window: shared
    GPUs (time-slicing, GPU-milli, MIG) split it by the holders' requests, scaled down when they
    ask for more than it has. ``device_id`` is empty for GPUs held by pods whose devices no
    agent reported (their hours count as unmeasured, and no remainder is known).
    """

    event_id: str = Field(description="cluster, node, device, workload and window start.")
    cluster: str = Field(description="Cluster name.")
    window_start: Timestamp = Field(description="Window start (inclusive).")
    window_end: Timestamp = Field(description="Window end (exclusive).")
    node: str = Field(description="Node name.")
    device_id: str = Field(description="GpuDevice.device_id; empty: GPUs held with no device known.")
    workload_uid: str = Field(description="Top owner's uid (the pod's for a bare pod); empty: unallocated.")
    workload_kind: str = Field(default="", description="Top owner's kind: Deployment, ... or Pod.")
    workload_name: str = Field(default="", description="Top owner's name.")
    namespace: str = Field(default="", description="Namespace.")
    owner_labels: dict[str, str] = Field(
        default_factory=dict, description="The pod's labels named in [pipeline] owner_labels."
    )
    active_gpu_hours: float = Field(ge=0, description="Held, utilization at or above the idle threshold.")
    idle_gpu_hours: float = Field(ge=0, description="Held, utilization under the idle threshold.")
    memory_idle_gpu_hours: float = Field(
        ge=0, description="Held, utilization near 0 with VRAM used above the floor (not in idle)."
    )
    unmeasured_gpu_hours: float = Field(ge=0, description="Held with no valid sample of the GPU.")
    unallocated_gpu_hours: float = Field(ge=0, description="The GPU's hours nobody held.")


class WorkloadState(Event):
    """A workload as the pipeline knows it now: what the watcher reported, and its pods.

    Kept per workload uid at every level of the owner hierarchy (a ReplicaSet and its
    Deployment each have one): a pod counts toward every owner in its chain.
    """

    uid: str = Field(min_length=1, description="Workload uid: the entity key.")
    namespace: str = Field(description="Namespace.")
    name: str = Field(description="Name.")
    kind: str = Field(description="Kind.")
    parent_uid: str | None = Field(default=None, description="Owner's uid, when it has one.")
    top_uid: str = Field(description="uid of the top of its hierarchy (itself for a top workload).")
    gpu_request: float = Field(default=0.0, ge=0, description="GPUs its active pods ask for.")
    gpus_held: float = Field(default=0.0, ge=0, description="GPUs its pods hold now (DESIGN.md definition).")
    active_pods: int = Field(default=0, ge=0, description="Its pods that exist and are Pending or Running.")
    status: WorkloadStatus = Field(description="Running (active pods), Done (none left) or Deleted.")
    first_seen: Timestamp = Field(description="Event time it was first seen (workload or pod event).")
    last_seen: Timestamp = Field(description="Event time of the newest event about it.")


# --- derived events: device changelog and alerts ----------------------------------------------


class DeviceChange(Event):
    """A GPU or RDMA device added to, removed from or changed on a node (from successive inventories)."""

    node: str = Field(min_length=1, description="Node name.")
    change: ChangeType = Field(description="ADDED, MODIFIED (changed) or DELETED (removed).")
    device_kind: DeviceKind = Field(description="GPU or RDMA.")
    device_id: str = Field(description="GpuDevice.device_id, or name/port of an RDMA port.")
    changed: list[str] = Field(default_factory=list, description="What changed: serial, bdf, vbios, ...")
    before: dict[str, str] = Field(default_factory=dict, description="Changed fields' old values.")
    after: dict[str, str] = Field(default_factory=dict, description="Changed fields' new values.")


class PendingGpuPod(Event):
    """Why a GPU pod waits, as the worker judged it at a window's end: written when its verdict
    (class, what-if, the scheduler's words) changes, so a pod's verdict at an instant is its
    newest row by then (:mod:`gpulens.pipeline.pending_waits`)."""

    uid: str = Field(min_length=1, description="Pod uid: the entity key.")
    namespace: str = Field(description="Namespace.")
    name: str = Field(description="Pod name.")
    created: Timestamp = Field(description="Its creationTimestamp: its wait counts from here.")
    waited_s: float = Field(ge=0, description="Seconds it had waited at event_time.")
    gpus_requested: float = Field(ge=0, description="Its GPU amount (DESIGN.md definition).")
    reason_class: str = Field(
        description="insufficient_gpus, fragmentation, taint_or_affinity, node_unavailable, quota, "
        "not_admitted or unknown."
    )
    scheduler_reason: str | None = Field(default=None, description="The scheduler's reason, if any.")
    scheduler_message: str | None = Field(default=None, description="The scheduler's message, if any.")
    gpus_free: float = Field(ge=0, description="Free GPUs on the Ready, schedulable nodes it may use.")
    max_free_on_one_node: float = Field(ge=0, description="The most of them free on any one node.")
    fits_after_consolidation: bool = Field(
        description="It fits now, or moving running pods off one node (onto free room elsewhere) makes room."
    )


class AlertState(StrEnum):
    """Whether an alert starts or ends with this record."""

    OPENED = "OPENED"
    RESOLVED = "RESOLVED"


class Alert(Event):
    """An alert opening or resolving, in event time (GpuIdle, GpuPodPending, GpuPendingPileUp,
    NodeNotReady, GpuLost)."""

    alert: str = Field(description="GpuIdle, GpuPodPending, GpuPendingPileUp, NodeNotReady or GpuLost.")
    state: AlertState = Field(description="OPENED or RESOLVED.")
    entity: str = Field(description="What it is about: GPU id, pod uid or node name.")
    node: str | None = Field(default=None, description="Node concerned.")
    gpu_id: str | None = Field(default=None, description="GPU concerned.")
    pod_uid: str | None = Field(default=None, description="Pod concerned.")
    pod_namespace: str | None = Field(default=None, description="Its namespace.")
    pod_name: str | None = Field(default=None, description="Its name.")
    since: Timestamp = Field(description="When the condition began (e.g. the first idle sample).")
    message: str = Field(description="What happened, for people.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Details: reason, free GPUs by model, ..."
    )


# --- idle reclaim ----------------------------------------------------------------------------


class ReclaimVerdict(StrEnum):
    """What the reclaim command did about one workload in one run."""

    SKIPPED = "SKIPPED"
    WOULD_ACT = "WOULD_ACT"
    ACTED = "ACTED"
    FAILED = "FAILED"


class ReclaimDecision(Event):
    """One decision of ``gpulens reclaim`` about one workload: the audit trail of idle reclaim.

    Every workload a run considers gets one: opted-in ones (acted on, would be acted on in a
    dry run, failed, or skipped with the reason) and idle ones that are not opted in (skipped).
    ``event_time`` is the wall time of the decision; ``idle_until`` the event time of the
    usage it was judged on.
    """

    run_id: str = Field(description="The run that decided (one per command invocation).")
    policy: str = Field(description="Name of the policy file's policy.")
    dry_run: bool = Field(description="True: nothing was changed (the default); False: --apply.")
    verdict: ReclaimVerdict = Field(description="SKIPPED, WOULD_ACT, ACTED or FAILED.")
    reason: str = Field(
        description="Why: idle, busy, unmeasured, no-usage, stale-usage, not-opted-in, "
        "unsupported-kind, or the API error of a failed action."
    )
    action: str | None = Field(default=None, description="annotate, scale-to-zero or delete (null: none).")
    workload_uid: str = Field(min_length=1, description="The workload's uid: the entity key.")
    workload_kind: str = Field(description="Deployment, StatefulSet, Job, ...")
    workload_name: str = Field(description="Its name.")
    namespace: str = Field(description="Its namespace.")
    targets: list[str] = Field(
        default_factory=list, description="Objects acted on or to act on: Kind/namespace/name."
    )
    checks: int = Field(ge=0, description="Checks the policy asks for.")
    idle_checks: int = Field(ge=0, description="Newest consecutive checks that found it idle.")
    utilization_max: float | None = Field(
        default=None, ge=0, le=100, description="Highest GPU utilization the checks saw, %."
    )
    idle_until: Timestamp | None = Field(default=None, description="Event time the usage reached.")
    cpu_millicores_max: float | None = Field(
        default=None, ge=0, description="Highest CPU its pods used at a live check (null: CPU not checked)."
    )


# --- dead letters ----------------------------------------------------------------------------


class DeadLetter(Record):
    """A record that could not be processed, kept with its original bytes and the reason."""

    event_id: str = Field(description="Id from the source coordinates: one DLQ entry per bad record.")
    failed_at: Timestamp = Field(description="When processing failed (wall time).")
    source_topic: str = Field(description="Topic the record came from.")
    source_partition: int = Field(description="Partition it came from.")
    source_offset: int = Field(description="Offset it came from.")
    key: bytes | None = Field(default=None, description="Original key bytes.")
    value: bytes | None = Field(
        default=None,
        description="Original value bytes (only the first ones when value_truncated: see value_length).",
    )
    reason: str = Field(description="Machine-readable reason, e.g. unknown-schema-id.")
    detail: str = Field(description="Human-readable explanation.")
    consumer: str = Field(description="The consumer group or component that gave up on it.")
    value_length: int | None = Field(
        default=None, ge=0, description="Original value length in bytes (null: no value, or an older writer)."
    )
    value_sha256: str | None = Field(
        default=None, description="SHA-256 of the whole original value, hex (null: no value or older writer)."
    )
    value_truncated: bool = Field(
        default=False,
        description="The original value was too large for a dead letter: value holds its first bytes only.",
    )


AVRO_ENUM_DEFAULTS: dict[type[Enum], StrEnum] = {
    AlertState: AlertState.OPENED,
    ChangeType: ChangeType.MODIFIED,
    WorkloadStatus: WorkloadStatus.RUNNING,
    DeviceKind: DeviceKind.OTHER,
    ContainerRuntimeState: ContainerRuntimeState.RUNNING,
    ReclaimVerdict: ReclaimVerdict.SKIPPED,
}
"""What an old reader makes of a symbol added after it was built."""

EVENT_TYPES: tuple[type[Event], ...] = (
    NodeEvent,
    PodEvent,
    WorkloadEvent,
    DeviceInventory,
    GpuSampleBatch,
    ContainerEvent,
    StorageEvent,
    GpuHealthEvent,
)
"""The published event types, in the order their schemas are listed."""
