"""The gRPC ingest gateway: agents that cannot reach Kafka stream batches of events to it.

The server (:class:`Gateway`) authenticates every call, checks every event of a batch and
publishes the batch whole with an idempotent producer, acking it only after the broker
acknowledged every record; :class:`GatewayPublisher` is the client side, a stand-in for
``gpulens.producers.publishing.EventPublisher`` (``agent.transport = "gateway"``).
"""

from gpulens.producers.gateway.exceptions import (
    BatchIdReused,
    GatewayError,
    GatewayUnavailable,
    InvalidBatch,
    RejectReason,
)
from gpulens.producers.gateway.metrics import GatewayMetrics
from gpulens.producers.gateway.publishing import GatewayPublisher
from gpulens.producers.gateway.serving import BATCH_ID_METADATA, Gateway, running_gateway
from gpulens.producers.gateway.settings import GatewayClientSettings, GatewaySettings
from gpulens.producers.gateway.validating import BatchValidator

__all__ = [
    "BATCH_ID_METADATA",
    "BatchIdReused",
    "BatchValidator",
    "Gateway",
    "GatewayClientSettings",
    "GatewayError",
    "GatewayMetrics",
    "GatewayPublisher",
    "GatewaySettings",
    "GatewayUnavailable",
    "InvalidBatch",
    "RejectReason",
    "running_gateway",
]
