"""The gRPC ingest gateway: agents that cannot reach Kafka stream batches of events to it.

The server (:class:`Gateway`) authenticates every call, checks every event of a batch and
publishes the batch whole with an idempotent producer, acking it only after the broker
acknowledged every record; :class:`GatewayPublisher` is the client side, a stand-in for
``gpulens.producers.publishing.EventPublisher`` (``agent.transport = "gateway"``).

Names load on first use (PEP 562): every GPULens process imports
``gpulens.producers.gateway.settings`` for its configuration, and that must not load gRPC with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.schemas.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

_EXPORTS: dict[str, str] = {
    "BATCH_ID_METADATA": "serving",
    "BatchIdReused": "exceptions",
    "BatchValidator": "validating",
    "Gateway": "serving",
    "GatewayClientSettings": "settings",
    "GatewayError": "exceptions",
    "GatewayMetrics": "metrics",
    "GatewayPublisher": "publishing",
    "GatewaySettings": "settings",
    "GatewayUnavailable": "exceptions",
    "InvalidBatch": "exceptions",
    "RejectReason": "exceptions",
    "running_gateway": "serving",
}
"""Public name -> the submodule defining it."""

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
