"""Kubernetes objects (the dicts the API returns) -> NodeEvent, PodEvent, WorkloadEvent.

Pure: no I/O, no clock. The caller says what happened (``change``) and when (``at``); the
owner chain of a pod comes from the caller's cache of workloads, so no pod costs an API call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.gpus import GpuCatalog
from gpulens.producers.kubernetes.quantities import milli, whole
from gpulens.producers.kubernetes.resources import KUEUE_WORKLOADS, ResourceKind
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    Address,
    ChangeType,
    ContainerState,
    Event,
    NodeEvent,
    OwnerReference,
    PodCondition,
    PodEvent,
    StorageEvent,
    Taint,
    WorkloadEvent,
    WorkloadStatus,
)

E = TypeVar("E", bound=Event)
MAX_OWNER_DEPTH = 8
"""Owner chains are short (pod -> ReplicaSet -> Deployment); the bound guards against cycles."""

_DONE_CONDITIONS = frozenset({"Complete", "Succeeded"})
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp of the API (``2024-05-01T12:00:00Z``), None when absent."""
    return datetime.fromisoformat(text) if text else None


def controller_of(obj: RawObject) -> OwnerReference | None:
    """The owner reference marked ``controller: true``: the one that manages ``obj``."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return OwnerReference(
                kind=ref["kind"], api_version=ref["apiVersion"], name=ref["name"], uid=ref["uid"]
            )
    return None


def owner_chain(obj: RawObject, parents: Mapping[str, OwnerReference]) -> list[OwnerReference]:
    """Direct controller first, top workload last; ``parents`` maps a workload uid to its controller."""
    chain: list[OwnerReference] = []
    link = controller_of(obj)
    while link is not None and len(chain) < MAX_OWNER_DEPTH and link not in chain:
        chain.append(link)
        link = parents.get(link.uid)
    return chain


def _entity_id(cluster: str, kind: str, metadata: Mapping[str, Any], change: ChangeType) -> str:
    uid = metadata.get("uid") or metadata["name"]
    return event_id(cluster, kind, uid, metadata.get("resourceVersion"), change.value)


@dataclass(frozen=True, slots=True)
class Translator:
    """Turns objects of one cluster into events; configured by the GPU catalog."""

    cluster: str
    source: str
    gpus: GpuCatalog

    # --- nodes -----------------------------------------------------------------------------------

    def node(self, obj: RawObject, *, change: ChangeType, at: datetime) -> NodeEvent:
        """The node's full state."""
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
        labels = meta.get("labels") or {}
        info = status.get("nodeInfo") or {}
        gpu_capacity = self.gpus.amounts(capacity)
        return NodeEvent(
            event_id=_entity_id(self.cluster, "Node", meta, change),
            cluster=self.cluster,
            event_time=at,
            source=self.source,
            type=change,
            node=meta["name"],
            uid=meta.get("uid"),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
            ),
            schedulable=not spec.get("unschedulable", False),
            taints=[
                Taint(key=t["key"], value=t.get("value"), effect=t["effect"])
                for t in spec.get("taints") or ()
            ],
            addresses=[Address(type=a["type"], address=a["address"]) for a in status.get("addresses") or ()],
            labels=labels,
            cpu_capacity_milli=_optional(milli, capacity.get("cpu")),
            cpu_allocatable_milli=_optional(milli, allocatable.get("cpu")),
            memory_capacity_bytes=_optional(whole, capacity.get("memory")),
            memory_allocatable_bytes=_optional(whole, allocatable.get("memory")),
            gpu_capacity=gpu_capacity,
            gpu_allocatable=self.gpus.amounts(allocatable),
            gpu_model=next((labels[k] for k in self.gpus.model_labels if labels.get(k)), None),
            gpu_vendor=self.gpus.vendor(gpu_capacity),
            kubelet_version=info.get("kubeletVersion"),
            container_runtime_version=info.get("containerRuntimeVersion"),
            kernel_version=info.get("kernelVersion"),
            os_image=info.get("osImage"),
            resource_version=meta.get("resourceVersion"),
        )

    # --- pods ------------------------------------------------------------------------------------

    def pod_gpus(self, pod_spec: Mapping[str, Any] | None) -> dict[str, float]:
        """GPU amount per resource of a pod spec, summed over its containers (requests, else limits)."""
        total: dict[str, float] = {}
        for container in (pod_spec or {}).get("containers") or ():
            for name, amount in self.gpus.container_amounts(container.get("resources")).items():
                total[name] = total.get(name, 0.0) + amount
        return total

    def pod(
        self,
        obj: RawObject,
        *,
        change: ChangeType,
        at: datetime,
        parents: Mapping[str, OwnerReference],
    ) -> PodEvent | None:
        """The pod's full state, or None when it asks for no GPU (only GPU pods are published)."""
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        gpu_resources = self.pod_gpus(spec)
        gpu_amount = sum(gpu_resources.values())
        if gpu_amount <= 0:
            return None
        conditions = [
            PodCondition(
                type=c["type"],
                status=c["status"],
                reason=c.get("reason"),
                message=c.get("message"),
                last_transition_time=parse_time(c.get("lastTransitionTime")),
            )
            for c in status.get("conditions") or ()
        ]
        scheduled = next((c for c in conditions if c.type == "PodScheduled"), None)
        unscheduled = scheduled if scheduled is not None and scheduled.status == "False" else None
        statuses = {s["name"]: s for s in status.get("containerStatuses") or ()}
        containers = [self._container(c, statuses.get(c["name"], {})) for c in spec.get("containers") or ()]
        requests = [(c.get("resources") or {}).get("requests") or {} for c in spec.get("containers") or ()]
        phase = status.get("phase") or "Unknown"
        event = PodEvent(
            event_id=_entity_id(self.cluster, "Pod", meta, change),
            cluster=self.cluster,
            event_time=at,
            source=self.source,
            type=change,
            uid=meta["uid"],
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            node=spec.get("nodeName"),
            phase=phase,
            gpu_resources=gpu_resources,
            gpu_amount=gpu_amount,
            gpu_models=sorted(set(self._model_constraints(spec))),
            qos=status.get("qosClass"),
            cpu_request_milli=_total(milli, (r.get("cpu") for r in requests)),
            memory_request_bytes=_total(whole, (r.get("memory") for r in requests)),
            conditions=conditions,
            unschedulable_reason=unscheduled.reason if unscheduled else None,
            unschedulable_message=unscheduled.message if unscheduled else None,
            containers=containers,
            creation_time=datetime.fromisoformat(meta["creationTimestamp"]),
            scheduled_time=scheduled.last_transition_time
            if scheduled is not None and scheduled.status == "True"
            else None,
            start_time=parse_time(status.get("startTime")),
            termination_time=_termination(statuses.values()) if phase in _FINISHED_PHASES else None,
            deletion_time=parse_time(meta.get("deletionTimestamp")),
            labels=meta.get("labels") or {},
            ip=status.get("podIP"),
            owners=owner_chain(obj, parents),
            resource_version=meta.get("resourceVersion"),
        )
        return as_deleted(event, at=at) if change is ChangeType.DELETED else event

    def _container(self, container: Mapping[str, Any], status: Mapping[str, Any]) -> ContainerState:
        states: Mapping[str, Mapping[str, Any]] = status.get("state") or {}
        state_name, state = next(iter(states.items()), (None, {}))
        return ContainerState(
            name=container["name"],
            image=container.get("image"),
            gpu_amount=sum(self.gpus.container_amounts(container.get("resources")).values()),
            state=state_name,
            reason=state.get("reason"),
            restart_count=status.get("restartCount", 0),
            exit_code=state.get("exitCode"),
        )

    def _model_constraints(self, spec: Mapping[str, Any]) -> Iterator[str]:
        """GPU models the pod is pinned to by nodeSelector or required node affinity ``In`` terms."""
        selector = spec.get("nodeSelector") or {}
        yield from (selector[k] for k in self.gpus.model_labels if k in selector)
        affinity: Mapping[str, Any] = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        required: Mapping[str, Any] = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        for term in required.get("nodeSelectorTerms") or ():
            for expression in term.get("matchExpressions") or ():
                if expression.get("key") in self.gpus.model_labels and expression.get("operator") == "In":
                    yield from expression.get("values") or ()

    # --- workloads -------------------------------------------------------------------------------

    def workload(
        self, resource: ResourceKind, obj: RawObject, *, change: ChangeType, at: datetime
    ) -> WorkloadEvent:
        """The workload with its parent and the GPUs its pod templates ask for in all."""
        meta = obj["metadata"]
        parent = controller_of(obj)
        templates = list(_templates(obj, resource.kind))
        event = WorkloadEvent(
            event_id=_entity_id(self.cluster, resource.kind, meta, change),
            cluster=self.cluster,
            event_time=at,
            source=self.source,
            type=change,
            uid=meta["uid"],
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            group=resource.group,
            version=resource.version,
            kind=resource.kind,
            parent_uid=parent.uid if parent else None,
            gpu_request=sum(
                replicas * sum(self.pod_gpus(t.get("spec")).values()) for replicas, t in templates
            ),
            replicas=sum(replicas for replicas, _ in templates) if templates else None,
            status=_workload_status(obj),
            labels=meta.get("labels") or {},
            creation_time=parse_time(meta.get("creationTimestamp")),
            resource_version=meta.get("resourceVersion"),
            **(_admission(obj) if resource.key == KUEUE_WORKLOADS.key else {}),
        )
        return as_deleted(event, at=at) if change is ChangeType.DELETED else event


def as_deleted(event: E, *, at: datetime) -> E:
    """The DELETED event of an entity whose last state is ``event`` (also when it vanished unseen)."""
    kind = event.kind if isinstance(event, WorkloadEvent) else type(event).__name__.removesuffix("Event")
    uid = getattr(event, "uid", None) or getattr(event, "node", "")
    if isinstance(event, StorageEvent):  # a volume is known by its name alone
        kind, uid = "PersistentVolume", event.name
    update: dict[str, Any] = {
        "type": ChangeType.DELETED,
        "event_time": at,
        "event_id": event_id(
            event.cluster, kind, uid, getattr(event, "resource_version", None), ChangeType.DELETED.value
        ),
    }
    if isinstance(event, PodEvent):
        update["deletion_time"] = event.deletion_time or at
    if isinstance(event, WorkloadEvent):
        update["status"] = WorkloadStatus.DELETED
    return event.model_copy(update=update)


def _templates(obj: RawObject, kind: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(replicas, pod template) pairs: spec.template, a CronJob's job template, any spec.*ReplicaSpecs."""
    spec = obj.get("spec") or {}
    if "jobTemplate" in spec:
        spec = (spec["jobTemplate"] or {}).get("spec") or {}
    if "template" in spec:
        if kind == "DaemonSet":
            replicas = (obj.get("status") or {}).get("desiredNumberScheduled", 0)
        else:
            replicas = spec.get("parallelism", spec.get("replicas", 1))
        yield replicas, spec["template"] or {}
    for pod_set in spec.get("podSets") or ():  # Kueue's Workload
        yield pod_set.get("count", 1), pod_set.get("template") or {}
    for key, replica_specs in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(replica_specs, Mapping):
            for replica_spec in replica_specs.values():
                yield replica_spec.get("replicas", 1), replica_spec.get("template") or {}


def _workload_status(obj: RawObject) -> WorkloadStatus:
    """Done or Failed from a True Complete/Succeeded/Failed condition (Jobs, kubeflow) or
    Kueue's Finished (its reason says which); else Running."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind == "Finished":
            kind = "Failed" if condition.get("reason") == "Failed" else "Succeeded"
        if kind in _DONE_CONDITIONS:
            return WorkloadStatus.DONE
        if kind == "Failed":
            return WorkloadStatus.FAILED
    return WorkloadStatus.RUNNING


def _admission(obj: RawObject) -> dict[str, Any]:
    """A Kueue Workload's ``admitted`` (a True Admitted condition) and, when it is not, the
    message of its first False QuotaReserved or Admitted condition, or of a True Evicted one
    (Kueue's words: "couldn't assign flavors to pod set main: insufficient quota ...")."""
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or ()}
    admitted = (conditions.get("Admitted") or {}).get("status") == "True"
    message = None
    if not admitted:
        for kind, status in (("QuotaReserved", "False"), ("Admitted", "False"), ("Evicted", "True")):
            condition = conditions.get(kind) or {}
            if condition.get("status") == status and condition.get("message"):
                message = condition["message"]
                break
    return {"admitted": admitted, "admission_message": message}


def _termination(statuses: Iterable[Mapping[str, Any]]) -> datetime | None:
    finished = [
        parse_time(s["state"]["terminated"].get("finishedAt"))
        for s in statuses
        if "terminated" in (s.get("state") or {})
    ]
    return max((f for f in finished if f is not None), default=None)


Convert = Callable[[str | int | float], int]


def _optional(convert: Convert, quantity: str | None) -> int | None:
    return None if quantity is None else convert(quantity)


def _total(convert: Convert, quantities: Iterable[str | None]) -> int | None:
    present = [convert(q) for q in quantities if q is not None]
    return sum(present) if present else None
