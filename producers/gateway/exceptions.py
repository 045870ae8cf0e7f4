"""Errors of the ingest gateway.

    GPULensError
    └── GatewayError
        ├── InvalidBatch         a batch breaks the rules (INVALID_ARGUMENT); nothing of it is published
        └── GatewayUnavailable   Kafka did not acknowledge a batch in time (UNAVAILABLE); resend it

grpc errors are translated where they enter: in :mod:`producers.gateway.serving` into status
codes, in :mod:`producers.gateway.publishing` into delivery errors of the records they carried.
"""

from __future__ import annotations

from enum import StrEnum

from schemas.exceptions import GPULensError


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


class InvalidBatch(GatewayError):
    """A batch that can never be published as sent; the message names its first bad event."""

    def __init__(self, batch_id: str, reason: RejectReason, detail: str, *, index: int | None = None) -> None:
        where = f"batch {batch_id!r}" + ("" if index is None else f", event {index}")
        super().__init__(f"{where}: {reason.value}: {detail}")
        self.batch_id = batch_id
        self.reason = reason
        self.index = index


class GatewayUnavailable(GatewayError):
    """Kafka did not acknowledge every record of a batch in time; the batch may be sent again."""
