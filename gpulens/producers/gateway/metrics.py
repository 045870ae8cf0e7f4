"""The gateway's Prometheus metrics, in a registry of its own so that two gateways never collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class GatewayMetrics:
    """What goes in, what is refused and why, what reaches Kafka and how long the acks take."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.batches_received = Counter(
            "gpulens_gateway_batches_received_total", "Batches received.", registry=self.registry
        )
        self.events_received = Counter(
            "gpulens_gateway_events_received_total", "Events received in batches.", registry=self.registry
        )
        self.rejected = Counter(
            "gpulens_gateway_rejected_batches_total",
            "Batches (or calls, for unauthenticated) refused, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.events_published = Counter(
            "gpulens_gateway_events_published_total",
            "Events the broker acknowledged.",
            registry=self.registry,
        )
        self.duplicates = Counter(
            "gpulens_gateway_duplicate_batches_total",
            "Batches sent again whose id was already published (or in flight): not published again.",
            registry=self.registry,
        )
        self.unavailable = Counter(
            "gpulens_gateway_unacknowledged_batches_total",
            "Batches answered UNAVAILABLE because Kafka did not acknowledge them in time.",
            registry=self.registry,
        )
        self.container_events = Counter(
            "gpulens_gateway_container_events_total",
            "Primus-Lens container events (ExporterService.StreamContainerEvents) by outcome: published, "
            "or skipped (no container id or node, not a pod's container, an unknown type).",
            ["outcome"],
            registry=self.registry,
        )
        self.ack_latency = Histogram(
            "gpulens_gateway_ack_latency_seconds",
            "From a batch's arrival to its ack (every record acknowledged by the broker).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
