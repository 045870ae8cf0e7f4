"""Assembling an agent from its settings: which collectors, which spool, which producer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpulens.producers.agent.amd import AmdCollector
from gpulens.producers.agent.collecting import BaseCollector
from gpulens.producers.agent.containerd import ContainerdWatcher
from gpulens.producers.agent.events import NodeIdentity
from gpulens.producers.agent.health import HealthRules
from gpulens.producers.agent.metrics import AgentMetrics
from gpulens.producers.agent.nvidia import NvidiaCollector
from gpulens.producers.agent.podresources import PodResourcesCollector
from gpulens.producers.agent.rdma import RdmaCollector
from gpulens.producers.agent.running import NodeAgent, utcnow
from gpulens.producers.agent.sending import SpoolingSender
from gpulens.producers.agent.settings import AgentSettings
from gpulens.producers.agent.spooling import Spool
from gpulens.producers.publishing import BasePublisher, EventPublisher
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.wire.codec import AvroCodec


def collectors_for(
    settings: AgentSettings, *, amd_library: Any | None = None, nvml_library: Any | None = None
) -> list[BaseCollector]:
    """The enabled collectors, not started; the libraries default to the real amdsmi and pynvml."""
    make: dict[str, Callable[[], BaseCollector]] = {
        "amd": lambda: AmdCollector(amd_library),
        "nvidia": lambda: NvidiaCollector(nvml_library),
        "rdma": lambda: RdmaCollector(settings.sysfs_root),
        "pod-resources": lambda: PodResourcesCollector(
            settings.pod_resources_socket,
            timeout_s=settings.pod_resources_timeout_s,
            gpu_patterns=settings.gpu_resource_patterns,
            rdma_patterns=settings.rdma_resource_patterns,
        ),
        "containerd": lambda: ContainerdWatcher(
            settings.containerd_socket,
            namespace=settings.containerd_namespace,
            retry_min_s=settings.containerd_retry_min_s,
            retry_max_s=settings.containerd_retry_max_s,
        ),
    }
    return [make[name]() for name in settings.collectors]


def build_agent(
    settings: AgentSettings,
    *,
    cluster: str,
    kafka: KafkaSettings,
    codec: AvroCodec,
    collectors: list[BaseCollector],
    metrics: AgentMetrics | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> NodeAgent:
    """An agent whose records go to ``kafka`` (or the gateway, by ``settings.transport``), through
    the spool in ``settings.spool_dir`` when needed."""
    metrics = metrics or AgentMetrics()
    publisher: BasePublisher
    if settings.transport == "gateway":
        from gpulens.producers.gateway.publishing import GatewayPublisher  # its gRPC stubs only when used

        publisher = GatewayPublisher(settings.gateway, codec, delivery_timeout_s=settings.delivery_timeout_s)
    else:
        publisher = EventPublisher(
            kafka, codec, **{"message.timeout.ms": int(settings.delivery_timeout_s * 1000)}
        )
    spool = Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
    sender = SpoolingSender(publisher, spool, metrics, drain_batch=settings.drain_batch)
    return NodeAgent(
        NodeIdentity(cluster, settings.node, settings.own_source),
        collectors,
        sender,
        metrics,
        sample_interval_s=settings.sample_interval_s,
        inventory_interval_s=settings.inventory_interval_s,
        watermark_interval_s=settings.watermark_interval_s,
        health_rules=HealthRules(settings.xid_hold_s, settings.ignored_xids),
        clock=clock,
    )
