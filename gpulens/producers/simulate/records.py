"""The simulated cluster's state as the records the live producers publish.

Nodes, pods and workloads look as the Kubernetes watcher translates them (full state,
``resource_version`` from one cluster-wide counter as etcd's revision); inventories, sample
batches and container events as the node agent builds them. Ids are deterministic: the same
simulation always gives the same ``event_id`` s, so a sink stores a re-run once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from gpulens.producers.simulate.specs import SOURCE, GpuModel, from_ms
from gpulens.producers.simulate.state import SimNode, SimPod, SimWorkload
from gpulens.schemas.model.ids import event_id, event_ids_after
from gpulens.schemas.model.models import (
    Address,
    ChangeType,
    ContainerEvent,
    ContainerState,
    DeviceAssignment,
    DeviceInventory,
    DeviceKind,
    GpuDevice,
    NodeEvent,
    OwnerReference,
    PodCondition,
    PodEvent,
    RdmaDevice,
    Taint,
    Watermark,
    WorkloadEvent,
)

NAMESPACE = uuid.UUID("4a7c0e52-9d3b-4f61-8c2a-5e1b7d903f48")
"""uuid5 namespace of every simulated uid and GPU UUID."""

_HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
"""PCI buses of the eight GPUs of an HGX board, as lspci shows them."""
_CPU_MILLI_PER_GPU = 28_000
_MEMORY_PER_GPU = 256 * 1024**3
_RESERVED_CPU_MILLI = 1_000
_RESERVED_MEMORY = 16 * 1024**3


def stable_uuid(*parts: object) -> str:
    """A uuid5 of ``parts``: the same names always give the same uid."""
    return str(uuid.uuid5(NAMESPACE, "/".join(str(p) for p in parts)))


def gpu_devices(cluster: str, node: str, model: GpuModel, count: int) -> list[GpuDevice]:
    """The GPUs of a new node, as amdsmi / NVML would list them."""
    devices = []
    for index in range(count):
        ident = uuid.uuid5(NAMESPACE, f"{cluster}/{node}/{model.key}/{index}")
        uid = f"GPU-{ident}" if model.vendor == "NVIDIA" else str(ident)
        bus = _HGX_BUSES[index] if count <= len(_HGX_BUSES) else f"{0x10 + 3 * index:02x}"
        devices.append(
            GpuDevice(
                device_id=uid,
                index=index,
                vendor=model.vendor,
                model=model.name,
                uuid=uid,
                serial=f"{1650_000_000_000 + ident.int % 1_000_000_000:013d}",
                pci_vendor_id=model.pci_vendor_id,
                pci_device_id=model.pci_device_id,
                bdf=f"0000:{bus}:00.0",
                numa_node=index * 2 // count,
                vram_total_bytes=model.vram_bytes,
                vbios_version=model.vbios_version,
                driver_version=model.driver_version,
            )
        )
    return devices


def rdma_devices(count: int) -> list[RdmaDevice]:
    """One 400G InfiniBand port per GPU, as on rail-optimised GPU nodes."""
    return [
        RdmaDevice(
            name=f"mlx5_{index}",
            port=1,
            state="ACTIVE",
            physical_state="LinkUp",
            link_layer="InfiniBand",
            rate="400 Gb/sec (4X NDR)",
            firmware_version="28.39.1002",
        )
        for index in range(count)
    ]


class RecordBuilder:
    """Builds the records of one simulated cluster; numbers Kubernetes objects' versions."""

    def __init__(self, cluster: str, model: GpuModel, gpus_per_node: int) -> None:
        self.cluster = cluster
        self.model = model
        self.gpus_per_node = gpus_per_node
        self._revision = 0
        self._samples_ids: dict[str, Callable[..., str]] = {}

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    # --- nodes and their devices -------------------------------------------------------------

    def node(self, node: SimNode, change: ChangeType, at_ms: int) -> NodeEvent:
        """The node's full state (DELETED: its last one)."""
        model, revision = self.model, self._next_revision()
        taints = [Taint(key=model.resource, value="present", effect="NoSchedule")]
        if not node.ready:
            taints += [
                Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule"),
                Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"),
            ]
        cpu = self.gpus_per_node * _CPU_MILLI_PER_GPU
        memory = self.gpus_per_node * _MEMORY_PER_GPU
        return NodeEvent(
            event_id=event_id(self.cluster, SOURCE, "Node", node.uid, revision, change.value),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            type=change,
            node=node.name,
            uid=node.uid,
            ready=node.ready,
            schedulable=True,
            taints=taints,
            addresses=[
                Address(type="InternalIP", address=f"10.0.{node.index >> 8 & 255}.{node.index & 255}"),
                Address(type="Hostname", address=node.name),
            ],
            labels={
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                model.product_label[0]: model.product_label[1],
            },
            cpu_capacity_milli=cpu,
            cpu_allocatable_milli=cpu - _RESERVED_CPU_MILLI,
            memory_capacity_bytes=memory,
            memory_allocatable_bytes=memory - _RESERVED_MEMORY,
            gpu_capacity={model.resource: float(self.gpus_per_node)},
            # The device plugin stops offering a GPU the driver lost: capacity stays, allocatable drops.
            gpu_allocatable={model.resource: float(node.allocatable)},
            gpu_model=model.product_label[1],
            gpu_vendor=model.vendor,
            kubelet_version="v1.29.6",
            container_runtime_version="containerd://1.7.20",
            kernel_version="5.15.0-116-generic",
            os_image="Ubuntu 22.04.4 LTS",
            resource_version=revision,
        )

    def inventory(self, node: SimNode, at_ms: int) -> DeviceInventory:
        """Every GPU the driver sees on ``node`` now, and its RDMA ports."""
        return DeviceInventory(
            event_id=event_id(self.cluster, SOURCE, node.name, "inventory", at_ms, self._next_revision()),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            node=node.name,
            gpus=[gpu.device for gpu in node.gpus if gpu.present],
            rdma_devices=node.rdma,
        )

    def samples_ids(self, nodes: list[SimNode], at_ms: int) -> list[str]:
        """The event ids of ``nodes``' GpuSampleBatches at ``at_ms`` (the batches themselves are
        built by column: :class:`gpulens.producers.simulate.rounds.SampleRound`)."""
        known = self._samples_ids
        for node in nodes:
            if node.name not in known:
                known[node.name] = event_ids_after(self.cluster, SOURCE, node.name, "gpu-samples")
        return [known[node.name](at_ms) for node in nodes]

    # --- workloads, pods, containers ---------------------------------------------------------

    def workload(self, workload: SimWorkload, change: ChangeType, at_ms: int) -> WorkloadEvent:
        """The workload's full state."""
        revision = self._next_revision()
        return WorkloadEvent(
            event_id=event_id(self.cluster, SOURCE, workload.kind, workload.uid, revision, change.value),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            type=change,
            uid=workload.uid,
            namespace=workload.namespace,
            name=workload.name,
            group=workload.group,
            version=workload.version,
            kind=workload.kind,
            parent_uid=workload.parent.uid if workload.parent else None,
            gpu_request=float(workload.gpus),
            replicas=1,
            status=workload.status,
            labels={"app": _top(workload).name},
            creation_time=from_ms(workload.created_ms),
            resource_version=revision,
        )

    def pod(self, pod: SimPod, change: ChangeType, at_ms: int) -> PodEvent:
        """The pod's full state."""
        model, revision = self.model, self._next_revision()
        top = pod.owners[-1]
        return PodEvent(
            event_id=event_id(self.cluster, SOURCE, "Pod", pod.uid, revision, change.value),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            type=change,
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            node=pod.node.name if pod.node else None,
            phase=pod.phase,
            gpu_resources={model.resource: float(pod.gpus)},
            gpu_amount=float(pod.gpus),
            # Training jobs pin the GPU model with a nodeSelector; serving and notebooks take any.
            gpu_models=[model.product_label[1]] if pod.profile.kind == "Job" else [],
            qos="Guaranteed",
            cpu_request_milli=pod.gpus * (_CPU_MILLI_PER_GPU // 2),
            memory_request_bytes=pod.gpus * (_MEMORY_PER_GPU // 2),
            conditions=_conditions(pod),
            unschedulable_reason="Unschedulable" if pod.unschedulable else None,
            unschedulable_message=pod.unschedulable,
            containers=[_container(pod, float(pod.gpus))],
            creation_time=from_ms(pod.created_ms),
            scheduled_time=_time(pod.scheduled_ms),
            start_time=_time(pod.started_ms),
            termination_time=_time(pod.finished_ms),
            deletion_time=_time(pod.deleted_ms),
            labels={"app": top.name, "workload-class": pod.profile.name},
            ip=f"10.{64 + (pod.number >> 16) % 64}.{pod.number >> 8 & 255}.{pod.number & 255}"
            if pod.started_ms is not None
            else None,
            owners=[
                OwnerReference(kind=w.kind, api_version=w.api_version, name=w.name, uid=w.uid)
                for w in pod.owners
            ],
            resource_version=revision,
        )

    def container(self, pod: SimPod, change: ChangeType, at_ms: int) -> ContainerEvent:
        """The pod's one container and the GPUs it holds (none once DELETED)."""
        assert pod.node is not None, "only a bound pod has containers"
        resource, gpu = self.model.resource, DeviceKind.GPU
        held = [] if change is ChangeType.DELETED else pod.devices
        devices = [DeviceAssignment(resource_name=resource, device_id=g.device_id, kind=gpu) for g in held]
        return ContainerEvent(
            event_id=event_id(self.cluster, SOURCE, pod.node.name, pod.uid, "main", change.value, at_ms),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            type=change,
            node=pod.node.name,
            pod_uid=pod.uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            container_name="main",
            container_id="containerd://" + event_id(pod.uid, "main") + event_id(pod.uid, "main", 2),
            devices=devices,
        )

    def watermark(self, at_ms: int) -> Watermark:
        """The end of the simulation: stream processors close every open window on it."""
        return Watermark(
            event_id=event_id(self.cluster, SOURCE, "end", at_ms),
            cluster=self.cluster,
            event_time=from_ms(at_ms),
            source=SOURCE,
            final=True,
        )


def _top(workload: SimWorkload) -> SimWorkload:
    while workload.parent is not None:
        workload = workload.parent
    return workload


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else from_ms(ms)


def _conditions(pod: SimPod) -> list[PodCondition]:
    if pod.scheduled_ms is None:
        if pod.unschedulable is None:
            return []
        return [
            PodCondition(
                type="PodScheduled",
                status="False",
                reason="Unschedulable",
                message=pod.unschedulable,
                last_transition_time=from_ms(pod.created_ms),
            )
        ]
    scheduled = from_ms(pod.scheduled_ms)
    conditions = [
        PodCondition(type="PodScheduled", status="True", last_transition_time=scheduled),
        PodCondition(type="Initialized", status="True", last_transition_time=scheduled),
    ]
    status: str
    reason: str | None
    if pod.finished_ms is not None:
        reason = "PodCompleted" if pod.phase == "Succeeded" else "PodFailed"
        status, since = "False", pod.finished_ms
    elif pod.started_ms is not None:
        status, reason, since = "True", None, pod.started_ms
    else:
        status, reason, since = "False", "ContainersNotReady", pod.scheduled_ms
    at = from_ms(since)
    return [
        *conditions,
        *(
            PodCondition(type=kind, status=status, reason=reason, last_transition_time=at)
            for kind in ("ContainersReady", "Ready")
        ),
    ]


def _container(pod: SimPod, gpus: float) -> ContainerState:
    if pod.finished_ms is not None:
        state, reason = "terminated", pod.reason
    elif pod.started_ms is not None:
        state, reason = "running", None
    else:
        state, reason = "waiting", "ContainerCreating" if pod.scheduled_ms is not None else None
    return ContainerState(
        name="main",
        image=pod.profile.image,
        gpu_amount=gpus,
        state=state,
        reason=reason,
        exit_code=pod.exit_code if pod.finished_ms is not None else None,
    )
