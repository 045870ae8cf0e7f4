"""Turning what the collectors saw into events, with deterministic ids.

The same observation always gets the same ``event_id`` (cluster, node, what, when), so a
record re-sent from the spool after a doubtful delivery is stored once by the sinks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpulens.producers.agent.collecting import ContainerKey
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceAssignment,
    DeviceInventory,
    GpuDevice,
    GpuSample,
    GpuSampleBatch,
    RdmaDevice,
)


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who reports: every event of one agent carries these."""

    cluster: str
    node: str
    source: str


def inventory_event(
    who: NodeIdentity, at: datetime, gpus: list[GpuDevice], rdma: list[RdmaDevice]
) -> DeviceInventory:
    """Every device of the node now."""
    return DeviceInventory(
        event_id=event_id(who.cluster, who.node, "inventory", at.isoformat()),
        cluster=who.cluster,
        event_time=at,
        source=who.source,
        node=who.node,
        gpus=gpus,
        rdma_devices=rdma,
    )


def sample_batch(who: NodeIdentity, at: datetime, samples: list[GpuSample]) -> GpuSampleBatch:
    """Every GPU's sample of one round: one record per node per interval."""
    return GpuSampleBatch(
        event_id=event_id(who.cluster, who.node, "gpu-samples", at.isoformat()),
        cluster=who.cluster,
        event_time=at,
        source=who.source,
        node=who.node,
        samples=samples,
    )


@dataclass
class ContainerTracker:
    """Remembers which devices each container held, and says what changed since the last look.

    Losers come before winners: when a device moves from one container to another within
    one round, the DELETED / MODIFIED event of the one that gave it up is published first, so
    a reader of the (single, node-keyed) partition never sees the device held twice.
    """

    who: NodeIdentity
    held: dict[ContainerKey, tuple[DeviceAssignment, ...]] = field(default_factory=dict)

    def changes(
        self, now: Mapping[ContainerKey, tuple[DeviceAssignment, ...]], at: datetime
    ) -> list[ContainerEvent]:
        """The events that turn the last state into ``now`` (which then becomes the state)."""
        deleted = sorted(key for key in self.held if key not in now)
        modified = sorted(
            (key for key in now if key in self.held and set(now[key]) != set(self.held[key])),
            key=lambda key: (bool(set(now[key]) - set(self.held[key])), key),  # pure losers first
        )
        added = sorted(key for key in now if key not in self.held)
        events = [self._event(ChangeType.DELETED, key, (), at) for key in deleted]
        events += [self._event(ChangeType.MODIFIED, key, now[key], at) for key in modified]
        events += [self._event(ChangeType.ADDED, key, now[key], at) for key in added]
        self.held = dict(now)
        return events

    def _event(
        self, change: ChangeType, key: ContainerKey, devices: tuple[DeviceAssignment, ...], at: datetime
    ) -> ContainerEvent:
        namespace, pod, container = key
        who = self.who
        return ContainerEvent(
            event_id=event_id(who.cluster, who.node, namespace, pod, container, change, at.isoformat()),
            cluster=who.cluster,
            event_time=at,
            source=who.source,
            type=change,
            node=who.node,
            pod_namespace=namespace,
            pod_name=pod,
            container_name=container,
            devices=list(devices),
        )
