"""Errors of the ingest gateway.

    GPULensError
    └── GatewayError
        ├── InvalidBatch         a batch breaks the rules (INVALID_ARGUMENT); nothing of it is published
        ├── BatchIdReused        a known batch id with other events (ALREADY_EXISTS); nothing is published
        └── GatewayUnavailable   Kafka did not acknowledge a batch in time (UNAVAILABLE); resend it

grpc errors are translated where they enter: in :mod:`gpulens.producers.gateway.serving` into status
codes, in :mod:`gpulens.producers.gateway.publishing` into delivery errors of the records they carried.
"""

from __future__ import annotations

from enum import StrEnum

from gpulens.schemas.model.exceptions import GPULensError


class GatewayError(GPULensError):
    """Root of the gateway's errors."""


class RejectReason(StrEnum):
    """Why a batch was refused; each is a label of ``gpulens_gateway_rejected_batches_total``."""

    UNAUTHENTICATED = "unauthenticated"
    EMPTY = "empty-batch"
    NO_BATCH_ID = "no-batch-id"
    TOO_LARGE = "batch-too-large"
    UNKNOWN_TOPIC = "unknown-topic"
    DEAD_LETTER_TOPIC = "dead-letter-topic"
    KEY_MISMATCH = "key-mismatch"
    TRUNCATED = "truncated-header"
    BAD_MAGIC = "bad-magic-byte"
    UNKNOWN_SCHEMA_ID = "unknown-schema-id"
    AVRO_DECODE = "avro-decode-error"
    INVALID_RECORD = "invalid-record"
    """Valid Avro whose values break the event model's rules (a negative amount, NaN, a time
    out of bounds)."""
    UNDECODABLE_BATCH = "undecodable-batch"
    """The gRPC message is not an EventBatch (protobuf that does not parse)."""
    BATCH_ID_REUSED = "batch-id-reused"
    """A batch id already published with other events."""


class InvalidBatch(GatewayError):
    """A batch that can never be published as sent; the message names its first bad event."""

    def __init__(self, batch_id: str, reason: RejectReason, detail: str, *, index: int | None = None) -> None:
        where = f"batch {batch_id!r}" + ("" if index is None else f", event {index}")
        super().__init__(f"{where}: {reason.value}: {detail}")
        self.batch_id = batch_id
        self.reason = reason
        self.index = index


class BatchIdReused(GatewayError):
    """A batch id the gateway published already, sent again with other events: a client bug
    (acking it would drop the new events, publishing it would break the resend guarantee)."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(
            f"batch {batch_id!r} was already sent with other events; "
            "a batch id names one set of events: send new events under a new id"
        )
        self.batch_id = batch_id


class GatewayUnavailable(GatewayError):
    """Kafka did not acknowledge every record of a batch in time; the batch may be sent again."""
