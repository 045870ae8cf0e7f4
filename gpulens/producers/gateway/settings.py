"""Settings of the ingest gateway (the server) and of the agents that publish through it (clients)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class GatewaySettings(BaseModel):
    """The gRPC ingest gateway: where it listens, whom it lets in, how long it waits for Kafka."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on (0.0.0.0: all).")
    port: int = Field(default=19400, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    tokens: tuple[SecretStr, ...] = Field(
        default=(),
        description="Bearer tokens that may publish (`authorization: Bearer <token>`); none: nobody may.",
    )
    tls_cert: Path | None = Field(default=None, description="PEM certificate chain; with tls_key: TLS on.")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")
    max_batch_events: int = Field(
        default=10_000, gt=0, description="Events one batch may carry; a larger batch is rejected."
    )
    max_message_bytes: int = Field(
        default=32 * 1024 * 1024, gt=0, description="Largest gRPC message (one batch) accepted."
    )
    ack_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a batch waits for the broker's acknowledgement before UNAVAILABLE.",
    )
    delivery_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long the producer keeps trying a record (message.timeout.ms); a batch whose "
        "records it gave up on is published again when its id is sent again.",
    )
    dedup_batches: int = Field(
        default=100_000, gt=0, description="Recent batch ids remembered so that a resend is not republished."
    )
    shutdown_grace_s: float = Field(
        default=10.0, ge=0, description="On stop, how long calls in progress may finish."
    )
    metrics_port: int = Field(
        default=9403, ge=0, le=65535, description="Port of the gateway's Prometheus metrics; 0 turns it off."
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address the metrics port binds (0.0.0.0: every interface, for a scraper elsewhere).",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        return self


class GatewayClientSettings(BaseModel):
    """How a node agent reaches the gateway when ``agent.transport = "gateway"``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = Field(default="127.0.0.1:19400", min_length=1, description="host:port of the gateway.")
    token: SecretStr | None = Field(default=None, description="Bearer token the gateway knows.")
    tls_ca: Path | None = Field(
        default=None, description="PEM CA bundle that signed the gateway's certificate; set: TLS on."
    )
    batch_events: int = Field(
        default=500, ge=1, description="Events per message; a batch leaves when full or after linger_s."
    )
    linger_s: float = Field(default=0.05, ge=0, description="How long a batch that is not full waits.")
    max_unacked_batches: int = Field(
        default=64,
        ge=1,
        description="Batches sent but not acked yet; beyond it produce() waits (back pressure).",
    )
    retry_backoff_s: float = Field(
        default=0.5, gt=0, description="Wait before a broken stream is opened again and its batches resent."
    )
