"""Assembling an agent from its settings: which collectors, which spool, which producer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from producers.agent.amd import AmdCollector
from producers.agent.collecting import BaseCollector
from producers.agent.events import NodeIdentity
from producers.agent.metrics import AgentMetrics
from producers.agent.nvidia import NvidiaCollector
from producers.agent.podresources import PodResourcesCollector
from producers.agent.rdma import RdmaCollector
from producers.agent.running import NodeAgent, utcnow
from producers.agent.sending import SpoolingSender
from producers.agent.settings import AgentSettings
from producers.agent.spooling import Spool
from producers.publishing import BasePublisher, EventPublisher
from schemas.codec import AvroCodec
from schemas.settings import KafkaSettings


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
        from producers.gateway.publishing import GatewayPublisher  # its gRPC stubs only when used

        publisher = GatewayPublisher(settings.gateway, codec, delivery_timeout_s=settings.delivery_timeout_s)
    else:
        publisher = EventPublisher(
            kafka, codec, **{"message.timeout.ms": int(settings.delivery_timeout_s * 1000)}
        )
    spool = Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
    sender = SpoolingSender(publisher, spool, metrics, drain_batch=settings.drain_batch)
    return NodeAgent(
        NodeIdentity(cluster, settings.node, settings.source),
        collectors,
        sender,
        metrics,
        sample_interval_s=settings.sample_interval_s,
        inventory_interval_s=settings.inventory_interval_s,
        clock=clock,
    )
