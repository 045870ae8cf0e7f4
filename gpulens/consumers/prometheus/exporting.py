"""The exporter process: serves ``/metrics`` at once, restores its state, then reads on.

A start never replays history. It binds ``/metrics`` first (``gpulens_exporter_restored`` is 0
until the state is back), restores the newest row of every series from its state log (see
:mod:`gpulens.consumers.prometheus.checkpointing`: the cost follows the live series), and assigns
itself every partition of its topics (no group rebalancing) from the checkpointed offsets.
A new group has no checkpoint: it reads the derived topics from the beginning.

It never reads the GPU sample stream: decoding every batch of every node was most of its work
on a large cluster, and the node agents serve the per-GPU gauges themselves. In the per-GPU
mode (``per_gpu``, for small clusters) it also reads each node's newest batch from the
compacted ``gpulens.state.gpu-samples.v1``; samples are gauges, so a partition of it starts at
most ``sample_tail_records`` before its end and a backlog piled up during a downtime is
skipped rather than replayed.

Every ``checkpoint_interval_s`` the consumer commits (dead letters first, then the group's
offsets, for the usual tools) and the series changed since, with those offsets, go to the state
log. A graceful stop checkpoints once more. A broker that does not answer in time never ends
the exporter: a lag measurement is skipped, a checkpoint tried again at its next turn, the ends
read at start retried (``gpulens_kafka_transient_errors_total`` counts each).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial
from wsgiref.simple_server import WSGIServer

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, start_http_server

from gpulens.consumers.prometheus.checkpointing import ExporterCheckpoint, Partition
from gpulens.consumers.prometheus.collecting import StateCollector
from gpulens.consumers.prometheus.exceptions import ExporterError
from gpulens.consumers.prometheus.health import ConsumerHealth, ProcessFamilies
from gpulens.consumers.prometheus.settings import ExporterSettings
from gpulens.consumers.prometheus.state import LatestState
from gpulens.consumers.prometheus.topics import exported_topics
from gpulens.schemas.kafka.consuming import ConsumeError, DecodingConsumer
from gpulens.schemas.kafka.retrying import retry_transient
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import topic_partitions
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.models import GpuSampleBatch
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)


class Exporter:
    """One exporter: a consumer over ``topics``, the state it fills and the registry it serves.

    The registry holds the state's collector, the exporter's health and the process-wide
    families of the default registry (where ``gpulens_dead_letters_total`` counts this
    consumer's dead letters), each family once.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        codec: AvroCodec,
        settings: ExporterSettings,
        *,
        topics: Sequence[TopicSpec] | None = None,
    ) -> None:
        """``topics``: the catalog's (:func:`exported_topics`) unless given (private copies)."""
        self._kafka, self._codec, self._settings = kafka, codec, settings
        topics = self._topics = list(exported_topics(settings) if topics is None else topics)
        self.state = LatestState(workload_max_age_windows=settings.workload_max_age_windows)
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(self.state))
        self.registry.register(ProcessFamilies())
        self._health = ConsumerHealth(self.registry, consumer=settings.group_id)
        try:
            self._partitions = topic_partitions(kafka, topics, offset=OFFSET_BEGINNING)
        except GPULensError as err:
            raise ExporterError(f"exporter cannot read its topics: {err}") from err
        self._checkpoint = ExporterCheckpoint(kafka, codec, group_id=settings.group_id, topics=topics)
        self._consumer: DecodingConsumer | None = None
        self._server: tuple[WSGIServer, threading.Thread] | None = None
        self._closed = False
        self._lag_due = 0.0
        self._checkpoint_due = 0.0

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

    def start(self) -> None:
        """Restore the state from the state log and start reading where it left off."""
        restored = self._checkpoint.restore(self.state)
        samples = {t.name for t in self._topics if t.record is GpuSampleBatch}
        start, skipped = start_offsets(
            self._kafka, self._partitions, restored.offsets, samples, self._settings.sample_tail_records
        )
        self._consumer = DecodingConsumer(
            self._kafka, self._codec, group_id=self._settings.group_id, topics=self._topics, start=start
        )
        self._checkpoint_due = time.monotonic() + self._settings.checkpoint_interval_s
        self._health.restored(series=restored.series, seconds=restored.seconds, samples_skipped=skipped)
        log.info(
            "exporter %s: %d series restored from %d state records in %.2f s; %d sample records skipped",
            self._settings.group_id,
            restored.series,
            restored.records_read,
            restored.seconds,
            skipped,
        )

    def run(self, stop: threading.Event) -> None:
        """Restore, then consume until ``stop`` is set; then stop serving and leave."""
        try:
            if self._consumer is None:
                self.start()
            while not stop.is_set():
                self.step()
        finally:
            self.close()

    def step(self, timeout: float = 0.5) -> None:
        """Apply one batch; measure lag and checkpoint when due."""
        consumer = self._started()
        batch = consumer.poll(self._settings.poll_records, timeout)
        started = time.perf_counter()
        for item in batch:
            self.state.apply(item.record, item.value)
        if batch:
            self._health.batch(batch, time.perf_counter() - started)
        now = time.monotonic()
        if now >= self._lag_due:
            lag = consumer.lag()
            if lag is not None:
                self._health.lag(lag)
            self._lag_due = now + self._settings.lag_interval_s
        if now >= self._checkpoint_due:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Commit what was read (dead letters first), then write the changed series and those
        offsets to the state log."""
        self._checkpoint_due = time.monotonic() + self._settings.checkpoint_interval_s
        try:
            offsets = self._started().commit()
        except ConsumeError as err:  # nothing written: the next checkpoint covers this one's records
            log.warning("checkpoint skipped, offsets not committed: %s", err)
            return
        self._health.checkpointed(self._checkpoint.write(self.state, offsets))

    def _started(self) -> DecodingConsumer:
        if self._consumer is None:
            raise ExporterError("the exporter is not started: call start() first")
        return self._consumer

    def close(self) -> None:
        """Stop serving, checkpoint a last time and leave the topics (idempotent)."""
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join()
            self._server = None
        if not self._closed:
            self._closed = True
            if self._consumer is not None:
                try:
                    self.checkpoint()
                finally:
                    self._consumer.close()
            self._checkpoint.close()


def start_offsets(
    kafka: KafkaSettings,
    partitions: Sequence[TopicPartition],
    checkpointed: dict[Partition, int],
    samples: set[str],
    sample_tail: int,
) -> tuple[list[TopicPartition], int]:
    """Where each partition is read from, and how many sample records that skips.

    A checkpointed partition resumes at its offset, any other starts at the beginning; a
    partition of a ``samples`` topic starts no earlier than ``sample_tail`` records before
    its end.
    """
    probe = Consumer(kafka.librdkafka(**{"group.id": "gpulens-exporter-start", "enable.auto.commit": False}))
    start: list[TopicPartition] = []
    skipped = 0
    try:
        for tp in partitions:
            offset = checkpointed.get((tp.topic, tp.partition))
            if tp.topic in samples:
                low, high = retry_transient(
                    partial(probe.get_watermark_offsets, tp, timeout=10, cached=False),
                    operation="watermarks",
                )
                resume = low if offset is None else max(offset, low)
                tail = max(resume, high - sample_tail)
                skipped += tail - resume
                offset = tail
            where = OFFSET_BEGINNING if offset is None else offset
            start.append(TopicPartition(tp.topic, tp.partition, where))
    except KafkaException as err:
        raise ExporterError(f"exporter cannot read the ends of its partitions: {err}") from err
    finally:
        probe.close()
    return start, skipped


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
