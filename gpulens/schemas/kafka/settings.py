"""Settings of the shared core: how to reach Kafka and the schema registry.

Each group is a frozen pydantic model with a docstring per field; the composition root
(``gpulens.config``) loads them from a TOML file and ``GPULENS_*`` environment variables.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class KafkaSettings(BaseModel):
    """How every component reaches the Kafka cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(
        default="127.0.0.1:19092",
        min_length=1,
        description="host:port[,host:port...] of the brokers; the embedded broker listens here.",
    )
    security_protocol: str = Field(default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_SSL, ...")
    sasl_mechanism: str | None = Field(default=None, description="PLAIN, SCRAM-SHA-512, ...")
    sasl_username: str | None = Field(default=None, description="SASL user.")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    extra: dict[str, str] = Field(
        default_factory=dict, description="More librdkafka properties, passed through verbatim."
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="zstd",
        description="How every producer of GPULens compresses its record batches (librdkafka's "
        "compression.type). The broker keeps and serves them compressed: the embedded noida-db "
        "holds everything in memory, and at 100,000 GPUs its peak RSS fell from 2.1-2.5 GB to "
        "0.8 GB with zstd. Consumers decompress whatever they get.",
    )
    fetch_interval_ms: int = Field(
        default=100,
        ge=0,
        le=10_000,
        description="How long a consumer of the pipeline (worker, sink, exporter) waits before it "
        "fetches a partition again once a fetch brought records (librdkafka's "
        "fetch.queue.backoff.ms with queued.min.messages 1): the embedded broker answers every "
        "fetch at once, so without it a consumer that keeps up fetches in a loop. Adds up to this "
        "much latency per hop; 0 fetches again at once (librdkafka's own behaviour).",
    )

    def librdkafka(self, **overrides: Any) -> dict[str, Any]:
        """These settings as a librdkafka (confluent-kafka) configuration dict."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            # noida-db ignores fetch.max.bytes: a large backlog can come back as one response
            # above librdkafka's default 100 MB limit, which the client then rejects forever.
            "receive.message.max.bytes": 1_000_000_000,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        conf.update(self.extra)
        conf.update(overrides)
        return conf

    def producer(self, **overrides: Any) -> dict[str, Any]:
        """The configuration of a producer: :meth:`librdkafka`, compressing by :attr:`compression`
        (a producer property: a consumer would warn about it). :attr:`extra` and ``overrides`` win."""
        conf = self.librdkafka(**overrides)
        conf.setdefault("compression.type", self.compression)
        return conf

    def streaming_consumer(self, **overrides: Any) -> dict[str, Any]:
        """The configuration of a long-running consumer of the pipeline: :meth:`librdkafka`,
        fetching a partition at most once per :attr:`fetch_interval_ms` while records come.

        noida-db ignores ``fetch.wait.max.ms`` and ``fetch.min.bytes``, so librdkafka's next
        fetch came back at once with the few records that arrived meanwhile: at 20,000 GPUs
        the worker spent 44 % of a core and the sink 39 %, against 11 % and 5 % fetching
        every 100 ms (README, "End to end at fleet scale"). Partitions at their end are paced
        apart from this, by ``consuming.IdlePartitions``. :attr:`extra` and ``overrides`` win.
        """
        conf = self.librdkafka(**overrides)
        if self.fetch_interval_ms:  # under what extra and overrides set
            conf.setdefault("queued.min.messages", 1)
            conf.setdefault("fetch.queue.backoff.ms", self.fetch_interval_ms)
        return conf


class RegistrySettings(BaseModel):
    """Where the Confluent-compatible schema registry is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        default="http://127.0.0.1:18081",
        pattern=r"^https?://",
        description=(
            "Registry URL, http(s)://host:port (several comma-separated, tried in order; "
            "user:password@host for basic authentication); the embedded registry serves on it."
        ),
    )
    store_topic: str = Field(
        default="_schemas", description="Compacted topic the embedded registry keeps its store in."
    )
    compatibility: str = Field(
        default="BACKWARD",
        pattern=r"^(NONE|BACKWARD|BACKWARD_TRANSITIVE|FORWARD|FORWARD_TRANSITIVE|FULL|FULL_TRANSITIVE)$",
        description="Default compatibility level of new subjects.",
    )
