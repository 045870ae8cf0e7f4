"""Settings of the Kubernetes watchers: what counts as a GPU, what to watch, how to retry and lead."""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel, ConfigDict, Field


class CustomWorkloadKind(BaseModel):
    """A custom resource to watch as a workload (e.g. kubeflow.org/v1 pytorchjobs PyTorchJob)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str = Field(min_length=1, description="API group, e.g. kubeflow.org.")
    version: str = Field(min_length=1, description="API version, e.g. v1.")
    plural: str = Field(min_length=1, description="Plural resource name in URLs, e.g. pytorchjobs.")
    kind: str = Field(min_length=1, description="Kind, e.g. PyTorchJob.")


def _default_identity() -> str:
    # In a pod the hostname is the pod name; the pid tells two watchers on one machine apart.
    return f"{socket.gethostname()}-{os.getpid()}"


class LeaseSettings(BaseModel):
    """Leader election over a coordination.k8s.io/v1 Lease: only the holder publishes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description="Elect a leader; off: this replica always publishes.")
    name: str = Field(default="gpulens-watcher", min_length=1, description="Lease name.")
    namespace: str = Field(default="gpulens", min_length=1, description="Namespace of the Lease.")
    duration_s: float = Field(
        default=15.0, gt=0, description="How long a lease holds without renewal before others take over."
    )
    renew_interval_s: float = Field(
        default=5.0, gt=0, description="How often the holder renews (and others try to acquire)."
    )
    identity: str = Field(
        default_factory=_default_identity, min_length=1, description="This replica's holder identity."
    )


class WatcherSettings(BaseModel):
    """What the watchers count as GPUs, which resources they watch and how they retry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(default="k8s-watcher", min_length=1, description="`source` of every event.")
    gpu_resources: tuple[str, ...] = Field(
        default=("amd.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu.shared"),
        description="Extended resources that count one GPU per unit.",
    )
    gpu_resource_patterns: tuple[str, ...] = Field(
        default=("nvidia.com/mig-*",),
        description="Shell patterns of more whole-unit GPU resources (MIG profiles).",
    )
    gpu_milli_resources: tuple[str, ...] = Field(
        default=("alibabacloud.com/gpu-milli", "gpu-milli"),
        description="GPU-share resources counted as value/1000 GPUs.",
    )
    gpu_vendors: dict[str, str] = Field(
        default_factory=lambda: {"amd.com/": "AMD", "nvidia.com/": "NVIDIA"},
        description="Resource-name prefix -> vendor, for NodeEvent.gpu_vendor.",
    )
    gpu_model_labels: tuple[str, ...] = Field(
        default=("nvidia.com/gpu.product", "amd.com/gpu.product-name", "amd.com/gpu.product"),
        description="Node label keys holding the GPU model, first present wins.",
    )
    custom_workloads: tuple[CustomWorkloadKind, ...] = Field(
        default=(), description="Custom resources watched as workloads besides the built-in kinds."
    )
    namespace: str | None = Field(
        default=None, description="Watch pods and workloads of this namespace only (None: all)."
    )
    watch_timeout_s: int = Field(
        default=300, gt=0, description="timeoutSeconds of each watch request; the watch resumes after it."
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Read timeout beyond the watch timeout: a silent stream is dead."
    )
    backoff_s: tuple[float, ...] = Field(
        default=(0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0, 60.0, 60.0),
        min_length=1,
        description="Delays between retries of a failing request; the error is raised after the last.",
    )
    backoff_jitter: float = Field(
        default=0.2, ge=0, le=1, description="Each delay is stretched by a random fraction up to this."
    )
    kueue: bool | None = Field(
        default=None,
        description="Watch Kueue's Workloads (kueue.x-k8s.io/v1beta1): whether each queued workload is "
        "admitted, and why not. None: when the API server serves them.",
    )
    storage: bool = Field(
        default=True,
        description="Also watch PersistentVolumes, their claims and StorageClasses (StorageEvent).",
    )
    storage_usage_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="How often each node's kubelet summary (through the API server) is read for volume "
        "usage; 0: never (capacity only).",
    )
    storage_kinds: dict[str, str] = Field(
        default_factory=lambda: {
            "csi.juicefs.com": "juicefs",
            "nfs.csi.k8s.io": "nfs",
            "efs.csi.aws.com": "nfs",
            "filestore.csi.storage.gke.io": "nfs",
            "lustre.csi.hpe.com": "lustre",
            "fsx.csi.aws.com": "lustre",
            "lustre.csi.azure.com": "lustre",
        },
        description="CSI driver or provisioner -> storage_kind; a name not listed that contains juicefs, "
        "lustre or nfs is that kind, any other CSI volume is csi.",
    )
    watermark_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the leading watcher vouches, with a Watermark, that every change it saw "
        "before then is on the broker (also while the cluster is quiet).",
    )
    watermark_lag_s: float = Field(
        default=2.0,
        ge=0,
        description="Each watermark vouches for this much before the instant it is made: a new object's "
        "event time is its creationTimestamp (to the second), delivered by its watch a little later.",
    )
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
