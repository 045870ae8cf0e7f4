"""Definitions of the watched resource types: where they live in the API and what they become.

Definitions only; :mod:`gpulens.producers.kubernetes.watching` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.schemas.model.models import Event, NodeEvent, PodEvent, StorageEvent, WorkloadEvent
from gpulens.schemas.model.topics import NODES as NODE_TOPIC
from gpulens.schemas.model.topics import PODS as POD_TOPIC
from gpulens.schemas.model.topics import STORAGE as STORAGE_TOPIC
from gpulens.schemas.model.topics import WORKLOADS as WORKLOAD_TOPIC
from gpulens.schemas.model.topics import TopicSpec


class Role(StrEnum):
    """Which event a resource's objects become."""

    NODE = "node"
    POD = "pod"
    WORKLOAD = "workload"
    VOLUME = "volume"
    """A PersistentVolume: what a StorageEvent is about."""
    CLAIM = "claim"
    """A PersistentVolumeClaim: context of its volume (capacity, usage key), published as no event."""
    STORAGE_CLASS = "storage-class"
    """A StorageClass: context of its volumes (the provisioner), published as no event."""


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One watched resource type."""

    group: str
    version: str
    plural: str
    kind: str
    role: Role
    namespaced: bool = True

    @property
    def key(self) -> str:
        """A name unique across groups, as kubectl spells it: ``Deployment.apps``, ``Pod``."""
        return kind_key(self.group, self.kind)

    @property
    def group_path(self) -> str:
        """The URL path of its group version's discovery document."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None) -> str:
        """The collection URL path, cluster-wide or in ``namespace``."""
        base = self.group_path
        scope = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        return f"{base}{scope}/{self.plural}"


def kind_key(group: str, kind: str) -> str:
    """:attr:`ResourceKind.key` from a group and a kind (also for events read back from topics)."""
    return f"{kind}.{group}" if group else kind


NODES = ResourceKind("", "v1", "nodes", "Node", Role.NODE, namespaced=False)
PODS = ResourceKind("", "v1", "pods", "Pod", Role.POD)
PERSISTENT_VOLUMES = ResourceKind(
    "", "v1", "persistentvolumes", "PersistentVolume", Role.VOLUME, namespaced=False
)
CLAIMS = ResourceKind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", Role.CLAIM)
STORAGE_CLASSES = ResourceKind(
    "storage.k8s.io", "v1", "storageclasses", "StorageClass", Role.STORAGE_CLASS, namespaced=False
)
BUILTIN_WORKLOADS: tuple[ResourceKind, ...] = (
    ResourceKind("apps", "v1", "deployments", "Deployment", Role.WORKLOAD),
    ResourceKind("apps", "v1", "replicasets", "ReplicaSet", Role.WORKLOAD),
    ResourceKind("apps", "v1", "statefulsets", "StatefulSet", Role.WORKLOAD),
    ResourceKind("apps", "v1", "daemonsets", "DaemonSet", Role.WORKLOAD),
    ResourceKind("batch", "v1", "jobs", "Job", Role.WORKLOAD),
    ResourceKind("batch", "v1", "cronjobs", "CronJob", Role.WORKLOAD),
)
KUEUE_WORKLOADS = ResourceKind("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", Role.WORKLOAD)
"""Kueue's queued workloads (one per Job it manages, owned by it): admitted or not, and why."""


TOPICS: dict[type[Event], TopicSpec] = {
    NodeEvent: NODE_TOPIC,
    PodEvent: POD_TOPIC,
    WorkloadEvent: WORKLOAD_TOPIC,
    StorageEvent: STORAGE_TOPIC,
}
"""Where each event type is published."""


def workload_kinds(settings: WatcherSettings) -> tuple[ResourceKind, ...]:
    """The built-in workload kinds and the configured custom ones."""
    custom = tuple(
        ResourceKind(c.group, c.version, c.plural, c.kind, Role.WORKLOAD) for c in settings.custom_workloads
    )
    return BUILTIN_WORKLOADS + custom
