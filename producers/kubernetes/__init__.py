"""Kubernetes watchers: nodes, GPU pods and workloads -> NodeEvent, PodEvent, WorkloadEvent.

resources     what is watched (definitions)       translating   objects -> events (pure)
api           the official client, raw JSON        watching      list, watch, resume, relist on 410
reconciling   what changed since last published    restoring     last published state from the topics
leading       Lease-based leader election          running       the process: threads, sessions
"""

from producers.kubernetes.api import KubeApi, load_configuration
from producers.kubernetes.exceptions import (
    ConflictError,
    KubernetesApiError,
    NotFoundError,
    PermanentApiError,
    ResourceExpiredError,
    StateRestoreError,
    TemporaryApiError,
    WatcherError,
)
from producers.kubernetes.gpus import GpuCatalog
from producers.kubernetes.leading import LeaseElector
from producers.kubernetes.quantities import parse_quantity
from producers.kubernetes.reconciling import Reconciler
from producers.kubernetes.restoring import read_published
from producers.kubernetes.running import Watcher
from producers.kubernetes.settings import CustomWorkloadKind, LeaseSettings, WatcherSettings
from producers.kubernetes.translating import Translator

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
