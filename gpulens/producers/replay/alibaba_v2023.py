"""Replay of Alibaba cluster-trace-gpu-v2023 (1,213 GPU nodes, 8,152 pods) as GPULens events.

Nodes first (all Ready at the trace start), then, in event-time order, per GPU pod: ADDED
Pending at ``creation_time``; MODIFIED Running and bound to a node at ``scheduled_time``
(never, for pods that stayed Pending); DELETED with its final phase at ``deletion_time``.
Pods without GPUs are left out, as the Kubernetes watcher leaves them out. Times in the
trace are seconds from its start; ``epoch`` places that start on the calendar.

With ``devices``, each node also reports its GPUs (DeviceInventory, ids :func:`gpu_id`) and
each bound pod's container holds the GPUs the binder chose (ContainerEvent, as the kubelet's
pod-resources API would say): a pod sharing a GPU holds that one GPU, whatever its share.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from gpulens.producers.replay.binding import MILLI, BestFitBinder
from gpulens.producers.replay.exceptions import TraceError
from gpulens.producers.replay.reading import end_of_replay, number, rows
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    ContainerState,
    DeviceAssignment,
    DeviceInventory,
    DeviceKind,
    Event,
    GpuDevice,
    NodeEvent,
    PodCondition,
    PodEvent,
)
from gpulens.schemas.model.topics import CONTAINERS, DEVICE_INVENTORY, NODES, PODS, WATERMARKS, TopicSpec

SOURCE = "replay:alibaba-v2023"
WHOLE_GPU = "nvidia.com/gpu"
GPU_SHARE = "alibabacloud.com/gpu-milli"
"""Alibaba's GPU-sharing resource: thousandths of one GPU."""

_NAMESPACE = uuid.UUID("6f1d2b1e-8a57-4c55-9a0e-3b7f5d0c2a10")


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]
    qos: str
    phase: str
    creation: int
    deletion: int | None
    scheduled: int | None

    @property
    def gpu_amount(self) -> float:
        """GPUs held: a share of one GPU counts as its fraction (DESIGN.md)."""
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return self.gpu_milli / MILLI
        return float(self.num_gpu)

    @property
    def gpu_resources(self) -> dict[str, float]:
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return {GPU_SHARE: float(self.gpu_milli)}
        return {WHOLE_GPU: float(self.num_gpu)}


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int | None:
    value = number(path, line, row, column)
    return None if value is None else int(value)


def read_nodes(path: Path) -> list[TraceNode]:
    """The GPU nodes of the trace."""
    nodes = []
    for line, row in rows(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}):
        nodes.append(
            TraceNode(
                row["sn"],
                _int(path, line, row, "cpu_milli") or 0,
                _int(path, line, row, "memory_mib") or 0,
                _int(path, line, row, "gpu") or 0,
                row["model"],
            )
        )
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    """Every pod of the trace (with or without GPUs)."""
    columns = {
        *("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase"),
        *("creation_time", "deletion_time", "scheduled_time"),
    }
    pods = []
    for line, row in rows(path, columns):
        pod = TracePod(
            name=row["name"],
            cpu_milli=_int(path, line, row, "cpu_milli") or 0,
            memory_mib=_int(path, line, row, "memory_mib") or 0,
            num_gpu=_int(path, line, row, "num_gpu") or 0,
            gpu_milli=_int(path, line, row, "gpu_milli") or 0,
            gpu_spec=tuple(m for m in row["gpu_spec"].split("|") if m),
            qos=row["qos"],
            phase=row["pod_phase"],
            creation=_int(path, line, row, "creation_time") or 0,
            deletion=_int(path, line, row, "deletion_time"),
            scheduled=_int(path, line, row, "scheduled_time"),
        )
        if pod.scheduled is not None and pod.scheduled < pod.creation:
            raise TraceError(f"{path}:{line}: {pod.name} is scheduled before it is created")
        if pod.deletion is not None and pod.deletion < max(pod.creation, pod.scheduled or 0):
            raise TraceError(f"{path}:{line}: {pod.name} is deleted before it is created or scheduled")
        pods.append(pod)
    return pods


# Per instant: nodes, then creations, schedulings and deletions (a pod's own steps stay in order).
_CREATE, _SCHEDULE, _DELETE = 1, 2, 3


def plan(
    nodes: list[TraceNode],
    pods: list[TracePod],
    *,
    cluster: str,
    epoch: datetime,
    devices: bool = False,
) -> Iterator[tuple[TopicSpec, Event]]:
    """The events of the replay, in non-decreasing event time (with ``devices``: the GPUs too)."""
    binder = BestFitBinder()
    for node in nodes:
        binder.add_node(node.name, node.model, node.gpus)
        yield NODES, _node_event(node, cluster, epoch)
        if devices:
            yield DEVICE_INVENTORY, _inventory(node, cluster, epoch)
    steps: list[tuple[int, int, int]] = []
    gpu_pods = [p for p in pods if p.gpu_amount > 0]
    for index, pod in enumerate(gpu_pods):
        steps.append((pod.creation, _CREATE, index))
        if pod.scheduled is not None:
            steps.append((pod.scheduled, _SCHEDULE, index))
        if pod.deletion is not None:
            steps.append((pod.deletion, _DELETE, index))
    steps.sort()
    bound: dict[int, str] = {}
    for at, step, index in steps:
        pod = gpu_pods[index]
        held: list[int] | None = None
        if step == _SCHEDULE:
            bound[index] = binder.bind(pod.name, pod.num_gpu, min(pod.gpu_milli, MILLI), pod.gpu_spec)
            held = [gpu for gpu, _ in binder.placements[pod.name][1]]
        elif step == _DELETE:
            binder.release(pod.name)
        yield PODS, _pod_event(pod, step, bound.get(index), cluster=cluster, epoch=epoch, at=at)
        if devices and index in bound and step != _CREATE:
            yield CONTAINERS, _container_event(pod, bound[index], held, cluster=cluster, epoch=epoch, at=at)
    yield WATERMARKS, end_of_replay(cluster, SOURCE, epoch + timedelta(seconds=steps[-1][0] if steps else 0))


def gpu_id(node: str, index: int) -> str:
    """The device_id of a trace node's GPU."""
    return f"{node}/gpu{index}"


def _inventory(node: TraceNode, cluster: str, epoch: datetime) -> DeviceInventory:
    return DeviceInventory(
        event_id=event_id(cluster, SOURCE, "inventory", node.name),
        cluster=cluster,
        event_time=epoch,
        source=SOURCE,
        node=node.name,
        gpus=[
            GpuDevice(device_id=gpu_id(node.name, i), index=i, vendor="NVIDIA", model=node.model)
            for i in range(node.gpus)
        ],
    )


def _container_event(
    pod: TracePod, node: str, held: list[int] | None, *, cluster: str, epoch: datetime, at: int
) -> ContainerEvent:
    """The pod's one container holding GPUs ``held`` of ``node`` (None: it is gone)."""
    return ContainerEvent(
        event_id=event_id(cluster, SOURCE, pod.name, "container", at),
        cluster=cluster,
        event_time=epoch + timedelta(seconds=at),
        source=SOURCE,
        type=ChangeType.DELETED if held is None else ChangeType.ADDED,
        node=node,
        pod_uid=pod_uid(cluster, pod.name),
        pod_namespace="default",
        pod_name=pod.name,
        container_name="main",
        devices=[
            DeviceAssignment(
                resource_name=GPU_SHARE if pod.gpu_amount < 1 else WHOLE_GPU,
                device_id=gpu_id(node, gpu),
                kind=DeviceKind.GPU,
            )
            for gpu in held or []
        ],
    )


def _node_event(node: TraceNode, cluster: str, epoch: datetime) -> NodeEvent:
    gpus = {WHOLE_GPU: float(node.gpus)}
    return NodeEvent(
        event_id=event_id(cluster, SOURCE, "node", node.name),
        cluster=cluster,
        event_time=epoch,
        source=SOURCE,
        type=ChangeType.ADDED,
        node=node.name,
        ready=True,
        schedulable=True,
        labels={"alibabacloud.com/gpu-card-model": node.model},
        cpu_capacity_milli=node.cpu_milli,
        cpu_allocatable_milli=node.cpu_milli,
        memory_capacity_bytes=node.memory_mib * 1024 * 1024,
        memory_allocatable_bytes=node.memory_mib * 1024 * 1024,
        gpu_capacity=gpus,
        gpu_allocatable=gpus,
        gpu_model=node.model,
        gpu_vendor="NVIDIA",
    )


def pod_uid(cluster: str, name: str) -> str:
    """The uid a trace pod gets: stable across replays of the same cluster."""
    return str(uuid.uuid5(_NAMESPACE, f"{cluster}/{name}"))


def _pod_event(
    pod: TracePod, step: int, node: str | None, *, cluster: str, epoch: datetime, at: int
) -> PodEvent:
    when = epoch + timedelta(seconds=at)
    created = epoch + timedelta(seconds=pod.creation)
    scheduled = (
        epoch + timedelta(seconds=pod.scheduled) if pod.scheduled is not None and step >= _SCHEDULE else None
    )
    if step == _CREATE:
        kind, phase = ChangeType.ADDED, "Pending"
    elif step == _SCHEDULE:
        kind, phase = ChangeType.MODIFIED, "Running"
    else:
        kind, phase = ChangeType.DELETED, pod.phase
    if scheduled is not None:
        condition = PodCondition(type="PodScheduled", status="True", last_transition_time=scheduled)
    else:
        condition = PodCondition(
            type="PodScheduled", status="False", reason="Unschedulable", last_transition_time=created
        )
    finished = when if step == _DELETE and pod.phase in ("Succeeded", "Failed") else None
    return PodEvent(
        event_id=event_id(cluster, SOURCE, pod.name, kind.value, at),
        cluster=cluster,
        event_time=when,
        source=SOURCE,
        type=kind,
        uid=pod_uid(cluster, pod.name),
        namespace="default",
        name=pod.name,
        node=node if step >= _SCHEDULE and pod.scheduled is not None else None,
        phase=phase,
        gpu_resources=pod.gpu_resources,
        gpu_amount=pod.gpu_amount,
        gpu_models=list(pod.gpu_spec),
        qos=pod.qos,
        cpu_request_milli=pod.cpu_milli,
        memory_request_bytes=pod.memory_mib * 1024 * 1024,
        conditions=[condition],
        unschedulable_reason=None if scheduled else "Unschedulable",
        containers=[ContainerState(name="main", gpu_amount=pod.gpu_amount, state=_container_state(phase))],
        creation_time=created,
        scheduled_time=scheduled,
        start_time=scheduled,
        termination_time=finished,
        deletion_time=when if step == _DELETE else None,
    )


def _container_state(phase: str) -> str:
    return {"Pending": "waiting", "Running": "running"}.get(phase, "terminated")
