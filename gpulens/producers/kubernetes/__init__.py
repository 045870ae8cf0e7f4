"""Kubernetes watchers: nodes, GPU pods, workloads and volumes -> NodeEvent, PodEvent,
WorkloadEvent, StorageEvent.

resources     what is watched (definitions)       translating   objects -> events (pure)
api           the official client, raw JSON        watching      list, watch, resume, relist on 410
reconciling   what changed since last published    restoring     last published state from the topics
leading       Lease-based leader election          running       the process: threads, sessions
volumes       PersistentVolumes -> StorageEvent    usage         kubelet summaries: volume usage

Names load on first use (PEP 562): every process imports ``gpulens.producers.kubernetes.settings``
for its configuration, and that must not cost it the Kubernetes client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.schemas.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gpulens.producers.kubernetes.api import KubeApi, load_configuration
    from gpulens.producers.kubernetes.exceptions import (
        ConflictError,
        KubernetesApiError,
        NotFoundError,
        PermanentApiError,
        ResourceExpiredError,
        StateRestoreError,
        TemporaryApiError,
        WatcherError,
    )
    from gpulens.producers.kubernetes.gpus import GpuCatalog
    from gpulens.producers.kubernetes.leading import LeaseElector
    from gpulens.producers.kubernetes.quantities import parse_quantity
    from gpulens.producers.kubernetes.reconciling import Reconciler
    from gpulens.producers.kubernetes.restoring import read_published
    from gpulens.producers.kubernetes.running import Watcher
    from gpulens.producers.kubernetes.settings import CustomWorkloadKind, LeaseSettings, WatcherSettings
    from gpulens.producers.kubernetes.translating import Translator

_EXPORTS: dict[str, str] = {
    "ConflictError": "exceptions",
    "CustomWorkloadKind": "settings",
    "GpuCatalog": "gpus",
    "KubeApi": "api",
    "KubernetesApiError": "exceptions",
    "LeaseElector": "leading",
    "LeaseSettings": "settings",
    "NotFoundError": "exceptions",
    "PermanentApiError": "exceptions",
    "Reconciler": "reconciling",
    "ResourceExpiredError": "exceptions",
    "StateRestoreError": "exceptions",
    "TemporaryApiError": "exceptions",
    "Translator": "translating",
    "Watcher": "running",
    "WatcherError": "exceptions",
    "WatcherSettings": "settings",
    "load_configuration": "api",
    "parse_quantity": "quantities",
    "read_published": "restoring",
}
"""Public name -> the submodule defining it."""

__all__ = [
    "ConflictError",
    "CustomWorkloadKind",
    "GpuCatalog",
    "KubeApi",
    "KubernetesApiError",
    "LeaseElector",
    "LeaseSettings",
    "NotFoundError",
    "PermanentApiError",
    "Reconciler",
    "ResourceExpiredError",
    "StateRestoreError",
    "TemporaryApiError",
    "Translator",
    "Watcher",
    "WatcherError",
    "WatcherSettings",
    "load_configuration",
    "parse_quantity",
    "read_published",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
