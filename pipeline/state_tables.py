"""Materialized tables: the newest state of every pod, node, inventory, container and workload.

Every change is a row for the entity's compacted state topic (``gpulens.state.*.v1``), keyed
by entity; an entity that is gone gets its last state and then a tombstone, so reading a state
topic from the beginning gives the cluster as it is now and stays bounded by its size.

Workloads are built from both sides: what the watcher reports about the workload (kind, name,
parent, deletion) and its pods (a pod counts toward every owner in its chain), so a workload
whose controller the watcher does not know still has its pods counted.

State is checkpointed per workload: ``["workload", cluster, uid]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.checkpointing import StateKey
from pipeline.windows import from_ms, to_ms
from schemas.ids import event_id
from schemas.models import (
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    Event,
    NodeEvent,
    PodEvent,
    Record,
    WorkloadEvent,
    WorkloadState,
    WorkloadStatus,
)
from schemas.topics import (
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


@dataclass(frozen=True, slots=True)
class Tombstone:
    """The end of an entity on a compacted topic: a null value under its key."""

    topic: TopicSpec
    key: bytes


@dataclass(slots=True)
class _Pod:
    gpu_amount: float
    holds_gpus: bool


@dataclass(slots=True)
class _Workload:
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
    pods: dict[str, _Pod] = field(default_factory=dict)
    """Its active pods."""


class StateTables:
    """Turns entity events into state rows and tombstones, per cluster."""

    def __init__(self) -> None:
        self._workloads: dict[tuple[str, str], _Workload] = {}
        self._changed: set[StateKey] = set()

    def process(self, event: Event) -> list[Record | Tombstone]:
        """The state rows (and tombstones) ``event`` causes."""
        if isinstance(event, PodEvent):
            return [event, *self._tombstone(STATE_PODS, event), *self._pod(event)]
        if isinstance(event, WorkloadEvent):
            return self._workload_event(event)
        if isinstance(event, NodeEvent):
            rows: list[Record | Tombstone] = [event, *self._tombstone(STATE_NODES, event)]
            if event.type == ChangeType.DELETED:  # its inventory goes with it
                rows.append(Tombstone(STATE_INVENTORY, entity_key(event.cluster, event.node)))
            return rows
        if isinstance(event, DeviceInventory):
            return [event]
        if isinstance(event, ContainerEvent):
            return [event, *self._tombstone(STATE_CONTAINERS, event)]
        return []

    @staticmethod
    def _tombstone(topic: TopicSpec, event: PodEvent | NodeEvent | ContainerEvent) -> list[Tombstone]:
        return [Tombstone(topic, record_key(topic, event))] if event.type == ChangeType.DELETED else []

    def _pod(self, pod: PodEvent) -> list[Record | Tombstone]:
        at = to_ms(pod.event_time)
        active = pod.type != ChangeType.DELETED and pod.phase in ACTIVE_PHASES
        rows: list[Record | Tombstone] = []
        chain = pod.owners
        top = chain[-1].uid if chain else None
        for depth, owner in enumerate(chain):
            parent = chain[depth + 1].uid if depth + 1 < len(chain) else None
            workload = self._workloads.get((pod.cluster, owner.uid))
            if workload is None:
                workload = _Workload(
                    owner.uid, pod.namespace, owner.name, owner.kind, parent, top or owner.uid, first_seen=at
                )
                self._workloads[(pod.cluster, owner.uid)] = workload
            if active:
                workload.pods[pod.uid] = _Pod(pod.gpu_amount, pod.holds_gpus)
            else:
                workload.pods.pop(pod.uid, None)
            workload.last_seen = max(workload.last_seen, at)
            self._changed.add(("workload", pod.cluster, owner.uid))
            rows.append(self._state(pod.cluster, workload, pod.event_id, deleted=False))
        return rows

    def _workload_event(self, event: WorkloadEvent) -> list[Record | Tombstone]:
        at = to_ms(event.event_time)
        key = (event.cluster, event.uid)
        workload = self._workloads.get(key)
        if workload is None:
            workload = self._workloads[key] = _Workload(
                event.uid, event.namespace, event.name, event.kind, event.parent_uid, event.uid, first_seen=at
            )
        workload.namespace, workload.name, workload.kind = event.namespace, event.name, event.kind
        workload.parent_uid = event.parent_uid
        workload.reported = event.status
        workload.last_seen = max(workload.last_seen, at)
        self._changed.add(("workload", *key))
        deleted = event.type == ChangeType.DELETED or event.status == WorkloadStatus.DELETED
        rows: list[Record | Tombstone] = [
            self._state(event.cluster, workload, event.event_id, deleted=deleted)
        ]
        if deleted:
            del self._workloads[key]
            rows.append(Tombstone(STATE_WORKLOADS, entity_key(event.cluster, event.uid)))
        return rows

    @staticmethod
    def _state(cluster: str, workload: _Workload, cause: str, *, deleted: bool) -> WorkloadState:
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

    # --- checkpoint (pipeline.checkpointing.Stateful) -------------------------------------------

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
        *fields, reported, pods = value
        self._workloads[(key[1], key[2])] = _Workload(
            *fields,
            reported=None if reported is None else WorkloadStatus(reported),
            pods={uid: _Pod(*pod) for uid, pod in pods.items()},
        )
