"""What a command does before its real work, in one order: :func:`run_service`.

The commands that run until stopped (worker, sink, exporter, tables, retention, watch, agent,
gateway) and the publishers (replay, simulate) start alike: create the topics (first, so that
an unreachable broker is one clear error before anything else starts), serve /metrics, turn
SIGTERM/Ctrl-C into a stop event, say what they read, make the Avro codec, tune the garbage
collector (:mod:`gpulens.tuning`). Each step is optional; their order is the same everywhere.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

import click

from gpulens.config import GPULensSettings
from gpulens.schemas.model.topics import TopicSpec
from gpulens.tuning import tune_for_throughput

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpulens.schemas.wire.codec import AvroCodec

__all__ = ["STOP_SIGNALS", "Metrics", "Service", "run_service", "serve_metrics"]

Result = TypeVar("Result")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What stops a service: `kill` (a supervisor, Kubernetes) and Ctrl-C."""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Where Prometheus /metrics is served; ``port`` None or 0: not served."""

    port: int | None
    host: str
    registry: CollectorRegistry | None = None
    """The collectors served; None: the process's default registry."""


def serve_metrics(metrics: Metrics) -> None:
    """Serve ``metrics`` from a daemon thread, if it has a port."""
    if not metrics.port:
        return
    from prometheus_client import REGISTRY, start_http_server

    start_http_server(metrics.port, addr=metrics.host, registry=metrics.registry or REGISTRY)


class Service:
    """What the work of a command gets: the settings, its stop event, the codec."""

    def __init__(self, settings: GPULensSettings, stop: threading.Event) -> None:
        self.settings = settings
        self.stop = stop
        """Set by the stop signals: the work ends what it is doing (a cycle, a batch) and returns."""

    @cached_property
    def codec(self) -> AvroCodec:
        """The Avro codec through the configured schema registry (made when first asked for)."""
        from gpulens.schemas.wire.codec import AvroCodec, registry_client

        return AvroCodec(registry_client(self.settings.registry.url))


@contextlib.contextmanager
def _stop_on(
    signals: Sequence[signal.Signals], announce: Callable[[signal.Signals], None] | None
) -> Iterator[threading.Event]:
    """An event that ``signals`` set instead of ending the process; the previous handlers are
    back once the work returned."""
    stop = threading.Event()

    def handle(signum: int, _frame: FrameType | None) -> None:
        if announce is not None:
            announce(signal.Signals(signum))
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_service(
    settings: GPULensSettings,
    work: Callable[[Service], Result],
    *,
    topics: Sequence[TopicSpec] = (),
    metrics: Metrics | None = None,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    announce: Callable[[signal.Signals], None] | None = None,
    banner: str | None = None,
    tuned: bool = False,
) -> Result:
    """Start as every command does, then run ``work`` and return what it returns.

    In this order: create ``topics`` that do not exist yet (none: the broker is not asked);
    serve ``metrics``; have ``signals`` set the stop event (``announce`` hears each one);
    print ``banner`` on stderr; with ``tuned``, tune the garbage collector for throughput
    (the long-running processes, :mod:`gpulens.tuning`); run ``work``.
    """
    if topics:
        from gpulens.schemas.kafka.topic_admin import create_topics

        create_topics(settings.kafka, topics)
    if metrics is not None:
        serve_metrics(metrics)
    with _stop_on(signals, announce) as stop:
        if banner is not None:
            click.echo(banner, err=True)
        if tuned:
            tune_for_throughput()
        return work(Service(settings, stop))
