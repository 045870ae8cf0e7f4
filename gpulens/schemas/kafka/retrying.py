"""Broker calls that fail for a while: timeouts, brokers away, coordinators moving.

Under load the broker answers ``get_watermark_offsets`` after its 5 s timeout, and a restart
takes it away for seconds; neither is a reason for a process to exit (it did: the worker and
the exporter died on one slow answer). :func:`is_transient` tells those errors from the ones
retrying cannot fix; :func:`retry_transient` repeats a call with backoff until it answers,
and every failure is counted in ``gpulens_kafka_transient_errors_total`` by operation. Calls
whose answer can wait (an end offset for a barrier, a lag figure) use :func:`transient_failure`
to count and skip instead, and ask again on their next turn.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from prometheus_client import Counter

__all__ = ["TRANSIENT_ERRORS", "is_transient", "retry_transient", "transient_failure"]

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_ERRORS = Counter(
    "gpulens_kafka_transient_errors_total",
    "Broker calls that failed for now (timeouts, brokers away) and were retried or skipped, by operation.",
    ["operation"],
)

TRANSIENT_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError._WAIT_CACHE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)
"""Codes librdkafka does not always flag retriable but that pass once the broker is back."""

DEFAULT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


def is_transient(error: KafkaError | KafkaException) -> bool:
    """True when the same call may succeed later: not fatal, and retriable or a known passing fault."""
    if isinstance(error, KafkaException):
        if not error.args or not isinstance(error.args[0], KafkaError):
            return False
        error = error.args[0]
    return not error.fatal() and (error.retriable() or error.code() in TRANSIENT_CODES)


def transient_failure(operation: str, err: KafkaException) -> None:
    """Count and log a transient failure of ``operation`` that the caller skips for now."""
    TRANSIENT_ERRORS.labels(operation).inc()
    log.warning("%s failed for now, will ask again: %s", operation, err)


def retry_transient(
    call: Callable[[], T],
    *,
    operation: str,
    backoff: Sequence[float] = DEFAULT_BACKOFF_S,
    stop: threading.Event | None = None,
    transient: Callable[[KafkaException], bool] = is_transient,
) -> T:
    """``call()``, repeated after each :class:`KafkaException` that ``transient`` accepts, with
    the ``backoff`` delays (the last repeats); other errors, and a transient one once ``stop`` is
    set, are raised."""
    delays = chain(backoff, repeat(backoff[-1]))
    pause = stop or threading.Event()
    while True:
        try:
            return call()
        except KafkaException as err:
            if not transient(err) or pause.is_set():
                raise
            delay = next(delays)
            TRANSIENT_ERRORS.labels(operation).inc()
            log.warning("%s failed for now (%s); retrying in %.1f s", operation, err, delay)
            if pause.wait(delay):
                raise
