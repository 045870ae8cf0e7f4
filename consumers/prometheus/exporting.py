"""The exporter process: reads the derived topics into the state and serves ``/metrics``.

State is derived, so it is rebuilt rather than resumed: every start reads every partition
from the beginning (assigned, no group rebalancing) and keeps the newest row per series, which
is what a restarted exporter must show. Offsets are still committed, every ``lag_interval_s``,
so that the usual consumer-group tools see how far the exporter has read; committing also
makes the dead letters of undecodable records durable (see :class:`DecodingConsumer`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from wsgiref.simple_server import WSGIServer

from confluent_kafka import OFFSET_BEGINNING
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from consumers.prometheus.collecting import StateCollector
from consumers.prometheus.exceptions import ExporterError
from consumers.prometheus.health import ConsumerHealth
from consumers.prometheus.settings import ExporterSettings
from consumers.prometheus.state import LatestState
from schemas.codec import AvroCodec
from schemas.consuming import DecodingConsumer
from schemas.exceptions import GPULensError
from schemas.settings import KafkaSettings
from schemas.topic_admin import topic_partitions
from schemas.topics import ALERTS, CLUSTER_ALLOCATION, GPU_SAMPLES, NODE_ALLOCATION, WORKLOAD_USAGE, TopicSpec

log = logging.getLogger(__name__)

EXPORTED_TOPICS: tuple[TopicSpec, ...] = (
    CLUSTER_ALLOCATION,
    NODE_ALLOCATION,
    WORKLOAD_USAGE,
    GPU_SAMPLES,
    ALERTS,
)
"""What the exporter reads by default."""


class Exporter:
    """One exporter: a consumer over ``topics``, the state it fills and the registry it serves.

    The registry holds the state's collector, the exporter's health and the process-wide
    default registry (where ``gpulens_dead_letters_total`` counts this consumer's dead letters).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        codec: AvroCodec,
        settings: ExporterSettings,
        *,
        topics: Sequence[TopicSpec] = EXPORTED_TOPICS,
    ) -> None:
        self._settings = settings
        self.state = LatestState(workload_max_age_windows=settings.workload_max_age_windows)
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(self.state))
        self.registry.register(REGISTRY)
        self._health = ConsumerHealth(self.registry, consumer=settings.group_id)
        try:
            start = topic_partitions(kafka, topics, offset=OFFSET_BEGINNING)
        except GPULensError as err:
            raise ExporterError(f"exporter cannot read its topics: {err}") from err
        self._consumer = DecodingConsumer(
            kafka, codec, group_id=settings.group_id, topics=topics, start=start
        )
        self._server: tuple[WSGIServer, threading.Thread] | None = None
        self._closed = False
        self._lag_due = 0.0

    def serve(self) -> tuple[str, int]:
        """Start serving ``/metrics`` in a background thread; the address bound (port 0: a free one)."""
        host, port = self._settings.host, self._settings.port
        try:
            self._server = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise ExporterError(f"cannot serve /metrics on {host}:{port}: {err}") from err
        bound = self._server[0].server_port
        log.info("exporter serving http://%s:%d/metrics", host, bound)
        return host, bound

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then stop serving and leave."""
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.close()

    def step(self, timeout: float = 0.5) -> None:
        """Apply one batch; measure lag and commit when due."""
        batch = self._consumer.poll(self._settings.poll_records, timeout)
        started = time.perf_counter()
        for item in batch:
            self.state.apply(item.record)
        if batch:
            self._health.batch(batch, time.perf_counter() - started)
        if time.monotonic() >= self._lag_due:
            self._health.lag(self._consumer.lag())
            self._consumer.commit()
            self._lag_due = time.monotonic() + self._settings.lag_interval_s

    def close(self) -> None:
        """Stop serving and leave the topics (idempotent)."""
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join()
            self._server = None
        if not self._closed:
            self._closed = True
            self._consumer.close()


def run_exporter(
    kafka: KafkaSettings, codec: AvroCodec, settings: ExporterSettings, stop: threading.Event
) -> None:
    """Serve ``/metrics`` from the derived topics until ``stop`` is set."""
    exporter = Exporter(kafka, codec, settings)
    try:
        exporter.serve()
        exporter.run(stop)
    finally:
        exporter.close()
