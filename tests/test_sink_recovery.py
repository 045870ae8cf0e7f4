"""The sink loses and repeats nothing: across kill -9 mid-load, and across a ClickHouse outage."""

from __future__ import annotations

import os
import signal

from prometheus_client import REGISTRY
from sink_support import (
    GPUS,
    SinkProcesses,
    SinkThread,
    committed_lag,
    produce_batches,
    sample_batches,
    wait_for,
)

from gpulens.platform import service_specs
from gpulens.schemas.model.topics import GPU_SAMPLES

LOAD = 125_000
"""GpuSampleBatch records of 8 GPUs: 1,000,000 sample rows."""


def _lag_gauge(group: str, topic: str) -> float | None:
    return REGISTRY.get_sample_value("gpulens_consumer_lag_records", {"consumer": group, "topic": topic})


def test_a_sink_killed_mid_load_and_restarted_stores_every_sample_exactly_once(
    platform, codec, config_file, unique, spawned
) -> None:
    cluster, group, database = f"kill-{unique}", f"sink-{unique}", f"kill_{unique}"
    sinks = SinkProcesses(platform, config_file, spawned, group=group, database=database)
    expected = sinks.load(codec, cluster, LOAD)
    first = sinks.start("--batch-rows", "40000", "--batch-seconds", "1")
    wait_for(lambda: sinks.stored() >= expected // 4, 180, "a quarter of the load in ClickHouse")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    at_kill = sinks.stored()
    assert at_kill < expected, "the kill should land in the middle of the load"

    sinks.start("--batch-rows", "40000", "--batch-seconds", "1")
    wait_for(
        lambda: committed_lag(platform, group, GPU_SAMPLES.name) == 0, 300, "the restarted sink to catch up"
    )
    assert sinks.distinct() == [(expected, expected)], f"{at_kill:,} rows stored at the kill"


def test_the_sink_waits_for_clickhouse_and_catches_up_with_nothing_lost(
    platform, codec, config_file, services, unique
) -> None:
    sink = SinkThread(platform, codec, unique).start()
    cluster = f"away-{unique}"
    topic = sink.topics[GPU_SAMPLES.name]
    spec = service_specs(platform, config_file)["clickhouse"]
    retries = {"operation": "insert gpu_samples"}
    try:
        produce_batches(platform, codec, topic, sample_batches(cluster, 500))
        sink.wait_rows("gpu_samples", 500 * GPUS)
        before = REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0.0
        services.stop("clickhouse")
        try:
            produce_batches(platform, codec, topic, sample_batches(cluster, 1500, first=500))
            wait_for(
                lambda: (REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0) >= before + 3,
                30,
                "the sink to retry while ClickHouse is away",
            )
            assert committed_lag(platform, sink.group, topic.name) > 0, (
                "nothing may be committed while it is away"
            )
            wait_for(lambda: (_lag_gauge(sink.group, topic.name) or 0) > 0, 30, "the lag metric to show it")
        finally:
            services.start(spec, timeout=platform.platform.start_timeout_s)
        sink.wait_rows("gpu_samples", 2000 * GPUS)
        wait_for(lambda: committed_lag(platform, sink.group, topic.name) == 0, 30, "the sink to commit")
        wait_for(lambda: _lag_gauge(sink.group, topic.name) == 0, 30, "the lag metric to go back to 0")
        assert (
            sink.scalar("SELECT count(), uniqExact(event_id, device_id) FROM gpu_samples FINAL")
            == 2000 * GPUS
        )
    finally:
        sink.stop()
