"""The exporter's own health, in its own registry (several exporters may share a process in tests),
and the process-wide families served beside it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from gpulens.schemas.kafka.consuming import Decoded

LAG = "gpulens_consumer_lag_records"
"""The lag family: the exporter's own per instance, the sink's and the worker's process-wide."""


class ConsumerHealth:
    """Records in per topic, batch sizes and durations, lag per topic of one consumer; how its
    state came back at start and what its checkpoints wrote."""

    def __init__(self, registry: CollectorRegistry, *, consumer: str) -> None:
        self._consumer = consumer
        self._records_in = Counter(
            "gpulens_exporter_records_in_total",
            "Decoded records taken into the exporter's state, per topic.",
            ["topic"],
            registry=registry,
        )
        self._batch_records = Histogram(
            "gpulens_exporter_batch_records",
            "Decoded records per poll batch.",
            buckets=(1, 10, 100, 500, 1_000, 2_500, 5_000, 10_000),
            registry=registry,
        )
        self._batch_seconds = Histogram(
            "gpulens_exporter_batch_duration_seconds",
            "Time to apply one poll batch to the state.",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
            registry=registry,
        )
        self._lag = Gauge(
            LAG,
            "Records on the broker a consumer has not read yet (high watermark - position), per topic.",
            ["consumer", "topic"],
            registry=registry,
        )

        self._restored = Gauge(
            "gpulens_exporter_restored",
            "1 once the state is restored and the topics are read on from there; scrapes before "
            "show what is loaded so far.",
            registry=registry,
        )
        self._restored_series = Gauge(
            "gpulens_exporter_restored_series",
            "Series restored from the state log at start.",
            registry=registry,
        )
        self._restore_seconds = Gauge(
            "gpulens_exporter_restore_seconds",
            "Time the restore from the state log took at start.",
            registry=registry,
        )
        self._samples_skipped = Gauge(
            "gpulens_exporter_sample_records_skipped",
            "Sample records between the checkpoint (or the beginning) and the tail read at start.",
            registry=registry,
        )
        self._state_written = Counter(
            "gpulens_exporter_state_records_written_total",
            "Records written to the exporter's state log (changed series, offsets, snapshots).",
            registry=registry,
        )

    def restored(self, *, series: int, seconds: float, samples_skipped: int) -> None:
        """The state is back: say how much and how fast."""
        self._restored_series.set(series)
        self._restore_seconds.set(seconds)
        self._samples_skipped.set(samples_skipped)
        self._restored.set(1)

    def checkpointed(self, records: int) -> None:
        self._state_written.inc(records)

    def batch(self, records: Sequence[Decoded], seconds: float) -> None:
        """Count one applied batch."""
        for item in records:
            self._records_in.labels(item.topic).inc()
        self._batch_records.observe(len(records))
        self._batch_seconds.observe(seconds)

    def lag(self, per_topic: dict[str, int]) -> None:
        """Set the lag of every topic read."""
        for topic, lag in per_topic.items():
            self._lag.labels(self._consumer, topic).set(lag)


class ProcessFamilies:
    """The default registry's families (dead letters, transient Kafka errors, the process), less
    those an exporter serves per instance.

    The default registry declares :data:`LAG` too (``gpulens.schemas.kafka.consuming``, for the sink and the
    worker; empty in an exporter). Served beside the exporter's own, the family had two HELP
    lines: ``promtool check metrics`` fails on that, and a Prometheus server refuses the scrape.
    """

    def collect(self) -> Iterator[Metric]:
        return (family for family in REGISTRY.collect() if family.name != LAG)
