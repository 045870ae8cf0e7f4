"""Publishing events to their catalog topics: Avro-encoded, keyed by entity, idempotent.

:class:`BasePublisher` is the contract a sender relies on (encode, queue bytes with a delivery
callback, serve callbacks, flush or purge, close); :class:`EventPublisher` fulfils it straight
to Kafka, ``producers.gateway.GatewayPublisher`` through the ingest gateway.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from schemas.codec import AvroCodec
from schemas.exceptions import GPULensError
from schemas.models import Event
from schemas.producing import produce_with_backpressure
from schemas.settings import KafkaSettings
from schemas.topics import TopicSpec, record_key

DeliveryCallback = Callable[[KafkaError | None, Message | None], None]
"""The answer about one record: no error once the broker acknowledged it (librdkafka passes its
``Message``; the gateway client passes ``None``)."""


class PublishError(GPULensError):
    """The broker did not take a record (after librdkafka's own retries)."""


class BasePublisher(ABC):
    """Queues encoded events for the broker; delivery callbacks run inside :meth:`poll` (and the
    other methods), on the caller's thread."""

    def __init__(self, codec: AvroCodec) -> None:
        self._codec = codec

    def encode(self, topic: TopicSpec, event: Event) -> tuple[bytes, bytes]:
        """The key and value bytes ``event`` is published with on ``topic``."""
        return record_key(topic, event), self._codec.encode(topic, event)

    def publish(self, topic: TopicSpec, event: Event) -> None:
        """Queue ``event`` on ``topic`` (keyed by its entity); blocks while the queue is full."""
        key, value = self.encode(topic, event)
        self.produce(topic.name, key, value)

    @abstractmethod
    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Queue encoded bytes; ``on_delivery`` hears the broker's answer (default: :meth:`flush` raises)."""

    @abstractmethod
    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for one."""

    @abstractmethod
    def purge(self) -> None:
        """Give up on every queued and in-flight record: their callbacks get an error."""

    @abstractmethod
    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued record is acknowledged; :class:`PublishError` otherwise."""

    def close(self) -> None:  # noqa: B027 - a publisher without connections of its own has nothing to do
        """Release connections and threads; queued records are not waited for (flush first)."""


class EventPublisher(BasePublisher):
    """Produces events with an idempotent producer; :meth:`flush` raises if any was refused."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec, **overrides: object) -> None:
        super().__init__(codec)
        self._producer = Producer(
            kafka.librdkafka(
                **{
                    "enable.idempotence": True,
                    "linger.ms": 20,
                    "batch.num.messages": 10_000,
                    "queue.buffering.max.messages": 500_000,
                    **overrides,
                }
            )
        )
        self._failures: list[str] = []
        self.published = 0

    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Queue encoded bytes; ``on_delivery`` hears the broker's answer (default: :meth:`flush` raises)."""
        produce_with_backpressure(
            self._producer, topic, key=key, value=value, on_delivery=on_delivery or self._delivered
        )
        self._producer.poll(0)
        self.published += 1

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for one."""
        self._producer.poll(timeout)

    def purge(self) -> None:
        """Give up on every queued and in-flight record: their callbacks get a purge error."""
        self._producer.purge()
        self._producer.poll(0)

    def _delivered(self, err: KafkaError | None, _message: Message | None) -> None:
        if err is not None:
            self._failures.append(err.str())

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued record is acknowledged; :class:`PublishError` otherwise."""
        left = self._producer.flush(timeout)
        if left or self._failures:
            raise PublishError(
                f"{left} records unacknowledged after {timeout:.0f}s, {len(self._failures)} refused"
                + (f": {self._failures[0]}" if self._failures else "")
            )
