"""Materialized tables: the newest state of every pod, node, inventory, container and workload.

Every change is a row for the entity's compacted state topic (``gpulens.state.*.v1``), keyed
by entity; an entity that is gone gets its last state and then a tombstone, so reading a state
topic from the beginning gives the cluster as it is now and stays bounded by its size.

Workloads are built from both sides: what the watcher reports about the workload (kind, name,
parent, deletion) and its pods (a pod counts toward every owner in its chain), so a workload
whose controller the watcher does not know still has its pods counted. A pod without owners is a
workload of its own (kind ``Pod``, the pod's uid), as in workload usage: it is gone, and
tombstoned, with its pod. The per-workload state
lives in a mapping the caller may supply (the worker: a dict; `gpulens tables`: a faust table),
and every change is written back to it, so a mapping that persists on assignment persists it.
In the worker that state is checkpointed per workload: ``["workload", cluster, uid]``.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.windows import from_ms, to_ms
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    Event,
    NodeEvent,
    OwnerReference,
    PodEvent,
    Record,
    WorkloadEvent,
    WorkloadState,
    WorkloadStatus,
)
from gpulens.schemas.model.topics import (
    STATE_CONTAINERS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    TopicSpec,
    entity_key,
    record_key,
)

ACTIVE_PHASES = frozenset({"Pending", "Running"})


STATE_TOPIC_OF: dict[type[Record], TopicSpec] = {
    PodEvent: STATE_PODS,
    NodeEvent: STATE_NODES,
    DeviceInventory: STATE_INVENTORY,
    ContainerEvent: STATE_CONTAINERS,
    WorkloadState: STATE_WORKLOADS,
}
"""The state topic of each kind of state row."""


@dataclass(frozen=True, slots=True)
class Tombstone:
    """The end of an entity on a compacted topic: a null value under its key."""

    topic: TopicSpec
    key: bytes


@dataclass(slots=True)
class ActivePod:
    """What a workload counts of one of its active pods."""

    gpu_amount: float
    holds_gpus: bool


@dataclass(slots=True)
class Workload:
    """One workload as the tables know it: more than its public WorkloadState (the watcher's
    reported status, which pods are active)."""

    uid: str
    namespace: str
    name: str
    kind: str
    parent_uid: str | None
    top_uid: str
    first_seen: int
    last_seen: int = 0
    reported: WorkloadStatus | None = None
    """The watcher's status, when it reported the workload."""
    pods: dict[str, ActivePod] = field(default_factory=dict)
    """Its active pods."""


def workload_chain(pod: PodEvent) -> list[OwnerReference]:
    """The workloads ``pod`` counts toward, nearest first: its owners, or itself when it has none."""
    if pod.owners:
        return pod.owners
    return [OwnerReference(kind="Pod", api_version="v1", name=pod.name, uid=pod.uid)]


WorkloadStore = MutableMapping[tuple[str, str], Workload]
"""Workloads by (cluster, uid)."""


def entity_rows(event: Event) -> list[Record | Tombstone]:
    """The rows ``event`` causes on the entity topics (all but workloads): its own newest
    state, then a tombstone if it is gone (a deleted node takes its inventory with it)."""
    if isinstance(event, PodEvent):
        return [event, *_tombstone(STATE_PODS, event)]
    if isinstance(event, NodeEvent):
        rows: list[Record | Tombstone] = [event, *_tombstone(STATE_NODES, event)]
        if event.type == ChangeType.DELETED:
            rows.append(Tombstone(STATE_INVENTORY, entity_key(event.cluster, event.node)))
        return rows
    if isinstance(event, DeviceInventory):
        return [event]
    if isinstance(event, ContainerEvent):
        return [event, *_tombstone(STATE_CONTAINERS, event)]
    return []


def _tombstone(topic: TopicSpec, event: PodEvent | NodeEvent | ContainerEvent) -> list[Tombstone]:
    return [Tombstone(topic, record_key(topic, event))] if event.type == ChangeType.DELETED else []


class StateTables:
    """Turns entity events into state rows and tombstones, per cluster."""

    def __init__(self, workloads: WorkloadStore | None = None) -> None:
        self._workloads: WorkloadStore = {} if workloads is None else workloads
        self._changed: set[StateKey] = set()

    def process(self, event: Event) -> list[Record | Tombstone]:
        """The state rows (and tombstones) ``event`` causes."""
        if isinstance(event, WorkloadEvent):
            return self.workload_event(event)
        rows = entity_rows(event)
        if isinstance(event, PodEvent):
            for depth in range(len(workload_chain(event))):
                rows += self.pod_in_workload(event, depth)
        return rows

    def pod_in_workload(self, pod: PodEvent, depth: int) -> list[Record | Tombstone]:
        """The new state of the workload at ``depth`` of ``pod``'s chain after ``pod`` (then its
        tombstone, when the workload is the pod itself and the pod is gone)."""
        at = to_ms(pod.event_time)
        active = pod.type != ChangeType.DELETED and pod.phase in ACTIVE_PHASES
        chain = workload_chain(pod)
        owner = chain[depth]
        parent = chain[depth + 1].uid if depth + 1 < len(chain) else None
        key = (pod.cluster, owner.uid)
        workload = self._workloads.get(key)
        if workload is None:
            workload = Workload(
                owner.uid, pod.namespace, owner.name, owner.kind, parent, chain[-1].uid, first_seen=at
            )
        if active:
            workload.pods[pod.uid] = ActivePod(pod.gpu_amount, pod.holds_gpus)
        else:
            workload.pods.pop(pod.uid, None)
        workload.first_seen = min(workload.first_seen, at)
        workload.last_seen = max(workload.last_seen, at)
        self._changed.add(("workload", *key))
        if owner.uid == pod.uid and pod.type == ChangeType.DELETED:
            self._workloads.pop(key, None)
            state = self._state(pod.cluster, workload, pod.event_id, deleted=True)
            return [state, Tombstone(STATE_WORKLOADS, entity_key(pod.cluster, owner.uid))]
        self._workloads[key] = workload
        return [self._state(pod.cluster, workload, pod.event_id, deleted=False)]

    def workload_event(self, event: WorkloadEvent) -> list[Record | Tombstone]:
        """The workload's new state, and its tombstone when it is gone."""
        at = to_ms(event.event_time)
        key = (event.cluster, event.uid)
        workload = self._workloads.get(key)
        if workload is None:
            workload = Workload(
                event.uid, event.namespace, event.name, event.kind, event.parent_uid, event.uid, first_seen=at
            )
        workload.namespace, workload.name, workload.kind = event.namespace, event.name, event.kind
        workload.parent_uid = event.parent_uid
        workload.reported = event.status
        workload.first_seen = min(workload.first_seen, at)
        workload.last_seen = max(workload.last_seen, at)
        self._changed.add(("workload", *key))
        deleted = event.type == ChangeType.DELETED or event.status == WorkloadStatus.DELETED
        rows: list[Record | Tombstone] = [
            self._state(event.cluster, workload, event.event_id, deleted=deleted)
        ]
        if deleted:
            self._workloads.pop(key, None)
            rows.append(Tombstone(STATE_WORKLOADS, entity_key(event.cluster, event.uid)))
        else:
            self._workloads[key] = workload
        return rows

    @staticmethod
    def _state(cluster: str, workload: Workload, cause: str, *, deleted: bool) -> WorkloadState:
        pods = workload.pods.values()
        if deleted:
            status = WorkloadStatus.DELETED
        elif pods:
            status = WorkloadStatus.RUNNING
        else:
            status = (
                WorkloadStatus.FAILED if workload.reported == WorkloadStatus.FAILED else WorkloadStatus.DONE
            )
        return WorkloadState(
            event_id=event_id(cluster, "workload-state", workload.uid, cause),
            cluster=cluster,
            event_time=from_ms(workload.last_seen),
            source="gpulens-worker",
            uid=workload.uid,
            namespace=workload.namespace,
            name=workload.name,
            kind=workload.kind,
            parent_uid=workload.parent_uid,
            top_uid=workload.top_uid,
            gpu_request=sum(p.gpu_amount for p in pods),
            gpus_held=sum(p.gpu_amount for p in pods if p.holds_gpus),
            active_pods=len(workload.pods),
            status=status,
            first_seen=from_ms(workload.first_seen),
            last_seen=from_ms(workload.last_seen),
        )

    # --- checkpoint (gpulens.pipeline.checkpointing.Stateful) -------------------------------------------

    def changed(self) -> set[StateKey]:
        changed, self._changed = self._changed, set()
        return changed

    def live(self) -> Iterator[StateKey]:
        return (("workload", *key) for key in self._workloads)

    def dump(self, key: StateKey) -> Any:
        workload = self._workloads.get((key[1], key[2]))
        if workload is None:
            return None
        return [
            workload.uid, workload.namespace, workload.name, workload.kind, workload.parent_uid,
            workload.top_uid, workload.first_seen, workload.last_seen,
            None if workload.reported is None else workload.reported.value,
            {uid: [pod.gpu_amount, pod.holds_gpus] for uid, pod in workload.pods.items()},
        ]  # fmt: skip

    def load(self, key: StateKey, value: Any) -> None:
        uid, namespace, name, kind, parent_uid, top_uid, first_seen, last_seen, reported, pods = value
        self._workloads[(key[1], key[2])] = Workload(
            uid, namespace, name, kind, parent_uid, top_uid, first_seen, last_seen,
            reported=None if reported is None else WorkloadStatus(reported),
            pods={pod_uid: ActivePod(*pod) for pod_uid, pod in pods.items()},
        )  # fmt: skip
