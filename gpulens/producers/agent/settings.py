"""Settings of the node agent: what it collects, how often, and where it spools when Kafka is away."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpulens.producers.gateway.settings import GatewayClientSettings

CollectorName = Literal["amd", "nvidia", "rdma", "pod-resources", "containerd"]


def _default_node() -> str:
    # A DaemonSet passes spec.nodeName as NODE_NAME; on a bare machine the hostname is the node.
    return os.environ.get("NODE_NAME") or socket.gethostname()


class AgentSettings(BaseModel):
    """One agent per node: collectors, intervals, the spool and its own metrics endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(default_factory=_default_node, min_length=1, description="Node name in every record.")
    source: str = Field(
        default="node-agent",
        min_length=1,
        description="`source` of every event, followed by `/<node>`: each agent is a source of its own, "
        "which its watermarks speak for.",
    )
    collectors: tuple[CollectorName, ...] = Field(
        default=("amd", "nvidia", "rdma", "pod-resources", "containerd"),
        description="Collectors to try; each one whose library, socket or tree is missing switches off "
        "(containerd's socket is waited for instead, with backoff).",
    )
    sample_interval_s: float = Field(
        default=5.0, gt=0, description="One GpuSampleBatch per node every this many seconds."
    )
    watermark_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the agent vouches, with a Watermark, that every record it sent is on the "
        "broker (only while nothing is in flight or spooled).",
    )
    inventory_interval_s: float = Field(
        default=600.0, gt=0, description="DeviceInventory is republished this often even when unchanged."
    )
    xid_hold_s: float = Field(
        default=600.0,
        gt=0,
        description="A critical XID keeps its GPU unhealthy this long after it last arrived (NVML never "
        "says when the GPU is fine again).",
    )
    ignored_xids: tuple[int, ...] = Field(
        default=(13, 31, 43, 45, 68, 109),
        description="XIDs an application causes, published but never critical (the list NVIDIA's device "
        "plugin skips).",
    )
    sysfs_root: Path = Field(
        default=Path("/sys"), description="Root of sysfs; RDMA devices are read from class/infiniband."
    )
    pod_resources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="Unix socket of the kubelet pod-resources API.",
    )
    pod_resources_timeout_s: float = Field(default=5.0, gt=0, description="Deadline of one List call.")
    containerd_socket: Path = Field(
        default=Path("/run/containerd/containerd.sock"),
        description="Unix socket of containerd's gRPC API, whose events give container lifecycle.",
    )
    containerd_namespace: str = Field(
        default="k8s.io", min_length=1, description="containerd namespace of the Kubernetes containers (CRI)."
    )
    containerd_retry_min_s: float = Field(
        default=0.5, gt=0, description="First wait before containerd is tried again once its stream is lost."
    )
    containerd_retry_max_s: float = Field(
        default=30.0, gt=0, description="Longest wait between tries (the wait doubles up to it)."
    )
    gpu_resource_patterns: tuple[str, ...] = Field(
        default=("amd.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"),
        description="Shell patterns of device-plugin resources that are GPUs.",
    )
    rdma_resource_patterns: tuple[str, ...] = Field(
        default=("rdma/*",), description="Shell patterns of device-plugin resources that are RDMA devices."
    )
    spool_dir: Path = Field(
        default=Path(".gpulens/agent-spool"),
        description="Where records the broker did not acknowledge wait (a hostPath in the DaemonSet).",
    )
    spool_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description="Spool bound; beyond it the oldest GPU samples go (inventory and containers never).",
    )
    transport: Literal["kafka", "gateway"] = Field(
        default="kafka",
        description="Publish straight to Kafka, or through the ingest gateway (agent.gateway) where "
        "the node cannot reach the brokers.",
    )
    gateway: GatewayClientSettings = Field(
        default_factory=GatewayClientSettings, description="The ingest gateway, for transport = gateway."
    )
    delivery_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long the producer (or the gateway client) tries a record before it goes to "
        "the spool (message.timeout.ms).",
    )
    drain_batch: int = Field(default=1000, gt=0, description="Spooled records re-sent per pass.")
    metrics_port: int = Field(
        default=9402,
        ge=0,
        le=65535,
        description="Port of the agent's /metrics (its health and its GPUs' gauges); 0 turns it off.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address /metrics binds (0.0.0.0 in the DaemonSet, where Prometheus scrapes every node).",
    )

    @property
    def own_source(self) -> str:
        """The `source` of this agent's events and watermarks: `<source>/<node>`."""
        return f"{self.source}/{self.node}"
