"""Replay of the Alibaba GenAI 2026 per-pod GPU duty cycles (GenTD26) as GPULens events.

Each ``container_ip`` (an MD5 of the pod IP: the pod's identity) becomes a one-GPU pod
running on a node of its own from its first sample on: the node, its inventory (one GPU),
the pod, the container holding that GPU, then one GpuSampleBatch per row at
``timestamp_anon`` (epoch seconds) with the row's ``value`` as utilization.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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
    GpuSample,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
)
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    TopicSpec,
)

SOURCE = "replay:genai-duty"
GPU_RESOURCE = "nvidia.com/gpu"
_NAMESPACE = uuid.UUID("0b6e54f2-71c9-4f0e-b1d4-8f5a3c2e9d77")


@dataclass(frozen=True, slots=True)
class DutySample:
    pod: str
    """The trace's container_ip hash."""
    at: datetime
    utilization_pct: float


def read_samples(path: Path) -> list[DutySample]:
    """Every row, in event-time order (rows of one instant keep the file's order)."""
    samples = []
    for line, row in rows(path, {"value", "timestamp_anon", "container_ip"}):
        at, value = number(path, line, row, "timestamp_anon"), number(path, line, row, "value")
        if at is None or value is None:
            raise TraceError(f"{path}:{line}: value and timestamp_anon are required")
        samples.append(DutySample(row["container_ip"], datetime.fromtimestamp(at, UTC), value))
    samples.sort(key=lambda s: s.at)
    return samples


def node_name(pod: str) -> str:
    """The node a trace pod runs on alone."""
    return f"genai-node-{pod[:12]}"


def gpu_id(pod: str) -> str:
    """The id of that node's one GPU."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, pod)}"


def pod_uid(cluster: str, pod: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{cluster}/{pod}"))


def plan(samples: list[DutySample], *, cluster: str) -> Iterator[tuple[TopicSpec, Event]]:
    """The events of the replay, in non-decreasing event time."""
    started: set[str] = set()
    sample = None
    for sample in samples:
        if sample.pod not in started:
            started.add(sample.pod)
            yield from _start(sample, cluster)
        node = node_name(sample.pod)
        yield (
            GPU_SAMPLES,
            GpuSampleBatch(
                event_id=event_id(cluster, SOURCE, "samples", sample.pod, sample.at.isoformat()),
                cluster=cluster,
                event_time=sample.at,
                source=SOURCE,
                node=node,
                samples=[
                    GpuSample(device_id=gpu_id(sample.pod), index=0, utilization_pct=sample.utilization_pct)
                ],
            ),
        )
    if sample is not None:
        yield WATERMARKS, end_of_replay(cluster, SOURCE, sample.at)


def _start(first: DutySample, cluster: str) -> Iterator[tuple[TopicSpec, Event]]:
    pod, at = first.pod, first.at
    node = node_name(pod)
    name = f"sd-serving-{pod[:8]}"
    gpus = {GPU_RESOURCE: 1.0}
    yield (
        NODES,
        NodeEvent(
            event_id=event_id(cluster, SOURCE, "node", node),
            cluster=cluster,
            event_time=at,
            source=SOURCE,
            type=ChangeType.ADDED,
            node=node,
            ready=True,
            schedulable=True,
            gpu_capacity=gpus,
            gpu_allocatable=gpus,
            gpu_vendor="NVIDIA",
        ),
    )
    yield (
        DEVICE_INVENTORY,
        DeviceInventory(
            event_id=event_id(cluster, SOURCE, "inventory", node),
            cluster=cluster,
            event_time=at,
            source=SOURCE,
            node=node,
            gpus=[GpuDevice(device_id=gpu_id(pod), index=0, vendor="NVIDIA", model="unknown (GenTD26)")],
        ),
    )
    yield (
        PODS,
        PodEvent(
            event_id=event_id(cluster, SOURCE, "pod", pod),
            cluster=cluster,
            event_time=at,
            source=SOURCE,
            type=ChangeType.ADDED,
            uid=pod_uid(cluster, pod),
            namespace="genai",
            name=name,
            node=node,
            phase="Running",
            gpu_resources=gpus,
            gpu_amount=1.0,
            containers=[ContainerState(name="serving", gpu_amount=1.0, state="running")],
            creation_time=at,
            scheduled_time=at,
            start_time=at,
            labels={"app": "stable-diffusion-serving"},
        ),
    )
    yield (
        CONTAINERS,
        ContainerEvent(
            event_id=event_id(cluster, SOURCE, "container", pod),
            cluster=cluster,
            event_time=at,
            source=SOURCE,
            type=ChangeType.ADDED,
            node=node,
            pod_uid=pod_uid(cluster, pod),
            pod_namespace="genai",
            pod_name=name,
            container_name="serving",
            devices=[
                DeviceAssignment(resource_name=GPU_RESOURCE, device_id=gpu_id(pod), kind=DeviceKind.GPU)
            ],
        ),
    )
