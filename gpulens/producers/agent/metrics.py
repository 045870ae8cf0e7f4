"""The agent's Prometheus metrics, in a registry of its own so that two agents never collide:
its own health, its node's per-GPU gauges (:mod:`gpulens.producers.agent.gauges`) and their
health (:mod:`gpulens.producers.agent.health`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpulens.producers.agent.gauges import GpuGauges
from gpulens.producers.agent.health import HealthGauges


class AgentMetrics:
    """What an operator needs to trust a node agent (is each collector on, fresh, and is data
    leaving), and what its GPUs read now."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.gpus = GpuGauges()
        self.registry.register(self.gpus)
        self.health = HealthGauges()
        self.registry.register(self.health)
        self.collector_enabled = Gauge(
            "gpulens_agent_collector_enabled",
            "1 while the collector works, 0 once switched off (library, socket or tree missing).",
            ["collector"],
            registry=self.registry,
        )
        self.last_collection = Gauge(
            "gpulens_agent_last_collection_timestamp_seconds",
            "Unix time of the collector's last successful collection.",
            ["collector"],
            registry=self.registry,
        )
        self.runtime_connected = Gauge(
            "gpulens_agent_runtime_connected",
            "1 while the container runtime's event stream is followed, 0 while it is tried again.",
            ["collector"],
            registry=self.registry,
        )
        self.collection_errors = Counter(
            "gpulens_agent_collection_errors_total",
            "Collection rounds that failed (the collector stays on).",
            ["collector"],
            registry=self.registry,
        )
        self.samples_collected = Counter(
            "gpulens_agent_samples_collected_total",
            "GPU samples collected.",
            ["collector"],
            registry=self.registry,
        )
        self.records_published = Counter(
            "gpulens_agent_records_published_total",
            "Records the broker acknowledged.",
            ["topic"],
            registry=self.registry,
        )
        self.publish_errors = Counter(
            "gpulens_agent_publish_errors_total",
            "Records the broker did not acknowledge (they went to the spool).",
            ["topic"],
            registry=self.registry,
        )
        self.spool_bytes = Gauge(
            "gpulens_agent_spool_bytes", "Bytes of records waiting in the spool.", registry=self.registry
        )
        self.spool_records = Gauge(
            "gpulens_agent_spool_records", "Records waiting in the spool.", registry=self.registry
        )
        self.dropped_samples = Counter(
            "gpulens_agent_dropped_samples_total",
            "GPU sample batches dropped because the spool was full.",
            registry=self.registry,
        )
