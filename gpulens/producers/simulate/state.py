"""The simulated cluster's entities: nodes with their GPUs, workloads and their pods.

Plain mutable data; :mod:`gpulens.producers.simulate.simulating` changes it, the record builder
reads it. Identity is by object (``eq=False``): two pods are never "equal".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulens.producers.simulate.specs import WorkloadProfile
from gpulens.schemas.model.models import GpuDevice, RdmaDevice, WorkloadStatus


@dataclass(slots=True, eq=False)
class SimGpu:
    """One GPU: its static inventory, whether the driver sees it, who holds it (its telemetry's
    counters live in :class:`gpulens.producers.simulate.sampling.GpuTelemetry`, by column)."""

    device: GpuDevice
    present: bool = True
    holder: SimPod | None = None

    @property
    def index(self) -> int:
        return self.device.index

    @property
    def device_id(self) -> str:
        return self.device.device_id


@dataclass(slots=True, eq=False)
class SimNode:
    """One node: present until removed, Ready or not, with its GPUs and the pods bound to it."""

    index: int
    name: str
    uid: str
    gpus: list[SimGpu]
    rdma: list[RdmaDevice]
    present: bool = True
    ready: bool = True
    pods: dict[str, SimPod] = field(default_factory=dict)
    """Pods bound to it (pending or running), by uid, in binding order."""

    @property
    def schedulable(self) -> bool:
        return self.present and self.ready

    @property
    def allocatable(self) -> int:
        """GPUs the device plugin offers: the ones the driver still sees."""
        return sum(1 for g in self.gpus if g.present)

    @property
    def free(self) -> int:
        """GPUs present and held by no pod."""
        return sum(1 for g in self.gpus if g.present and g.holder is None)


@dataclass(slots=True, eq=False)
class SimWorkload:
    """A controller object: Job, StatefulSet, Deployment or the ReplicaSet under one."""

    uid: str
    name: str
    namespace: str
    kind: str
    group: str
    version: str
    gpus: int
    created_ms: int
    parent: SimWorkload | None = None
    status: WorkloadStatus = WorkloadStatus.RUNNING

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(slots=True, eq=False)
class SimPod:
    """A GPU pod from creation to deletion, with what it does to its GPUs while it runs."""

    number: int
    uid: str
    name: str
    profile: WorkloadProfile
    gpus: int
    owners: list[SimWorkload]
    """Direct controller first, top workload last (as PodEvent.owners)."""
    created_ms: int
    duration_ms: int
    busy_pct: float
    memory_fraction: float
    phase: str = "Pending"
    node: SimNode | None = None
    devices: list[SimGpu] = field(default_factory=list)
    scheduled_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    deleted_ms: int | None = None
    unschedulable: str | None = None
    """The scheduler's message while no node has room for it."""
    reason: str | None = None
    exit_code: int | None = None
    busy: bool = True
    stretch_until_ms: int = 0
    """When the current busy or idle stretch ends."""

    @property
    def namespace(self) -> str:
        return self.profile.namespace

    @property
    def deleted(self) -> bool:
        return self.deleted_ms is not None
