"""Handing records to librdkafka: wait while its queue is full, never fail on a burst.

``Producer.produce`` raises ``BufferError`` as soon as the local queue holds
``queue.buffering.max.messages`` records; a burst (200,000 dead letters, a catch-up's window
rows) reaches that in well under a second. Every produce path goes through
:func:`produce_with_backpressure`, which serves delivery reports until there is room again:
the caller slows down to the broker's pace instead of crashing. A record larger than
``message.max.bytes`` is refused for good (:class:`RecordTooLarge`): waiting cannot help.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import Counter

from gpulens.schemas.model.exceptions import GPULensError

__all__ = ["QUEUE_FULL_WAITS", "RecordTooLarge", "produce_with_backpressure"]

QUEUE_FULL_WAITS = Counter(
    "gpulens_producer_queue_full_waits_total",
    "Times a produce found librdkafka's queue full and waited for deliveries, by topic.",
    ["topic"],
)

Headers = dict[str, str | bytes | None]
"""Record headers as librdkafka takes them."""
DeliveryReport = Callable[[KafkaError | None, Message], None]


class _ProduceOptions(TypedDict, total=False):
    """The optional arguments of ``Producer.produce``, passed only when given."""

    headers: Headers
    on_delivery: DeliveryReport


class RecordTooLarge(GPULensError):
    """A record is larger than the producer's ``message.max.bytes``: no retry can send it."""


def produce_with_backpressure(
    producer: Producer,
    topic: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None = None,
    on_delivery: DeliveryReport | None = None,
    wait_s: float = 0.05,
) -> None:
    """``producer.produce(...)``, waiting (serving delivery reports ``wait_s`` at a time) while
    librdkafka's queue is full; :class:`RecordTooLarge` when the record can never fit."""
    extra: _ProduceOptions = {}
    if headers is not None:
        extra["headers"] = headers
    if on_delivery is not None:
        extra["on_delivery"] = on_delivery
    waited = False
    while True:
        try:
            producer.produce(topic, key=key, value=value, **extra)
            return
        except BufferError:
            if not waited:
                QUEUE_FULL_WAITS.labels(topic).inc()
                waited = True
            producer.poll(wait_s)
        except KafkaException as err:
            error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
            if error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                size = len(key or b"") + len(value or b"")
                raise RecordTooLarge(f"{topic}: {size:,} bytes exceed message.max.bytes") from err
            raise
