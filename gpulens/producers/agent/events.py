"""Turning what the collectors saw into events, with deterministic ids.

The same observation always gets the same ``event_id`` (cluster, node, what, when), so a
record re-sent from the spool after a doubtful delivery is stored once by the sinks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpulens.producers.agent.collecting import ContainerKey, RuntimeChange
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    ContainerRuntimeState,
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

    def forget(self, key: ContainerKey) -> None:
        """Drop ``key`` (its runtime deleted it): if the kubelet still lists it, it is ADDED again."""
        self.held.pop(key, None)

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


@dataclass(frozen=True, slots=True)
class _Instance:
    """What was last published of one container instance."""

    state: ContainerRuntimeState | None
    exit_code: int | None
    exited_at: datetime | None
    oom_killed: bool


@dataclass
class LifecycleTracker:
    """Turns containerd's lifecycle changes into ContainerEvents with the devices held.

    The record is keyed by the pod's container (namespace, pod, container name), while
    containerd speaks of instances: a restarted container is a new instance under the same
    key. Only the key's current instance (the one containerd created last) is published; the
    deletion of an older one, which the kubelet's garbage collection does later, is not (it
    would say the key is gone while its successor runs). A change that repeats the instance's
    last published state (TaskCreate after ContainerCreate, TaskDelete after TaskExit) is not
    published either.

    The current instance's deletion is a DELETED record and makes ``containers`` forget the
    key, so that the kubelet's view, if it still lists the key, is published again next round.
    """

    who: NodeIdentity
    containers: ContainerTracker
    _current: dict[ContainerKey, tuple[datetime, str]] = field(default_factory=dict)
    _instances: dict[str, _Instance] = field(default_factory=dict)

    def changes(self, changes: list[RuntimeChange]) -> list[ContainerEvent]:
        """The events ``changes`` (in containerd's order) make, with the devices held now."""
        return [event for change in changes if (event := self._event(change)) is not None]

    def _event(self, change: RuntimeChange) -> ContainerEvent | None:
        key, cid = change.identity.key, change.container_id
        current = self._current.get(key)
        if current is None or (current[1] != cid and current[0] <= change.identity.created_at):
            current = self._current[key] = (change.identity.created_at, cid)
        if current[1] != cid:  # an older instance of the key
            self._instances.pop(cid, None)
            return None
        last = self._instances.get(cid, _Instance(None, None, None, False))
        state = change.state or last.state or ContainerRuntimeState.RUNNING
        now = _Instance(
            state,
            change.exit_code if change.exit_code is not None else last.exit_code,
            change.exited_at or last.exited_at,
            change.oom_killed or last.oom_killed,
        )
        if now == last:
            return None
        self._instances[cid] = now
        change_type = ChangeType.MODIFIED
        devices = self.containers.held.get(key, ())
        if state is ContainerRuntimeState.CREATED:
            change_type = ChangeType.ADDED
        elif state is ContainerRuntimeState.DELETED:
            change_type, devices = ChangeType.DELETED, ()
            del self._current[key], self._instances[cid]
            self.containers.forget(key)
        namespace, pod, container = key
        who = self.who
        return ContainerEvent(
            event_id=event_id(who.cluster, who.node, cid, state, now.oom_killed, change.at.isoformat()),
            cluster=who.cluster,
            event_time=change.at,
            source=who.source,
            type=change_type,
            node=who.node,
            pod_uid=change.identity.pod_uid,
            pod_namespace=namespace,
            pod_name=pod,
            container_name=container,
            container_id=cid,
            devices=list(devices),
            state=state,
            exit_code=now.exit_code,
            exited_at=now.exited_at,
            oom_killed=now.oom_killed,
        )
