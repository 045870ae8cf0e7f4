"""Retention on the embedded broker: a pass deletes exactly what every group has consumed and
the retention time allows, never what a group still needs, never a compacted topic's records.

Each test publishes to topics of its own on the real broker (old records stamped two hours
back, new ones now), moves consumer groups through them, runs a pass and reads the broker's
low watermarks, against the offsets the test itself chose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpulens.config import GPULensSettings
from gpulens.draining import pipeline_groups
from gpulens.infra.retaining import Retainer, RetentionMetrics, RetentionPolicy
from gpulens.main_job import RETENTION, pipeline_specs
from gpulens.pipeline.running import WorkerOptions
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import DAY_MS, GPU_SAMPLES, TopicSpec

PARTITIONS = 2
OLD, NEW = 10, 10
"""Records per partition stamped two hours back, then stamped now: offsets 0-9 and 10-19."""
HOUR_MS = 3600 * 1000


@pytest.fixture
def topics(platform: GPULensSettings, unique: str) -> tuple[TopicSpec, TopicSpec]:
    """A delete-policy topic and a compacted one, each holding OLD + NEW records per partition."""
    events = TopicSpec(f"ret-events-{unique}", PodEvent, "uid", PARTITIONS, retention_ms=7 * DAY_MS)
    state = TopicSpec(f"ret-state-{unique}", PodEvent, "uid", PARTITIONS, "compact")
    admin = AdminClient(platform.kafka.librdkafka())
    futures = admin.create_topics(
        [NewTopic(t.name, PARTITIONS, 1, config=t.config()) for t in (events, state)]
    )
    for future in futures.values():
        future.result(30)
    producer = Producer(platform.kafka.librdkafka())
    now = int(time.time() * 1000)
    for topic in (events, state):
        for partition in range(PARTITIONS):
            for i in range(OLD + NEW):
                stamp = now - 2 * HOUR_MS if i < OLD else now
                producer.produce(topic.name, b"v", key=f"k{i}".encode(), partition=partition, timestamp=stamp)
    assert producer.flush(30) == 0
    return events, state


def consume_to(platform: GPULensSettings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """``group`` reads ``topic`` from the start up to ``offsets`` (per partition) and commits there."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group, "enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, p, 0) for p in offsets])
    read = dict.fromkeys(offsets, 0)
    deadline = time.monotonic() + 30
    while any(read[p] < offsets[p] for p in offsets) and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.5):
            assert message.error() is None, message.error()
            partition, offset = message.partition() or 0, message.offset() or 0
            if offset < offsets[partition]:
                read[partition] = offset + 1
    assert read == offsets, f"{group} read {read}, wanted {offsets}"
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def low_watermarks(platform: GPULensSettings, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": "retention-test-reader"}))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def first_offset(platform: GPULensSettings, group: str, topic: str) -> dict[int, int]:
    """Where ``group`` resumes: the offset of the first record it gets per partition."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group, "enable.auto.commit": False}))
    consumer.subscribe([topic])
    first: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while len(first) < PARTITIONS and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.5):
            assert message.error() is None, message.error()
            first.setdefault(message.partition() or 0, message.offset() or 0)
    consumer.close()
    return first


def publish_samples(settings: GPULensSettings, per_partition: int) -> None:
    producer = Producer(settings.kafka.librdkafka())
    for partition in range(GPU_SAMPLES.partitions):
        for _ in range(per_partition):
            producer.produce(GPU_SAMPLES.name, b"v", partition=partition)
    assert producer.flush(30) == 0


def retention_once(config: Path, **retention: str) -> str:
    """What `gpulens retention --once` prints, with ``[retention]`` settings by environment."""
    env = {**os.environ, **{f"GPULENS_RETENTION__{key.upper()}": value for key, value in retention.items()}}
    once = [sys.executable, "-m", "gpulens", "--config", str(config), "retention", "--once"]
    return subprocess.run(once, env=env, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def behind(platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str) -> str:
    """Two groups through the topics: one behind (events at 15 and 5), one ahead (events at 18
    and 20, the compacted topic read whole); the name of the one behind."""
    events, state = topics
    behind, ahead = f"ret-behind-{unique}", f"ret-ahead-{unique}"
    consume_to(platform, behind, events.name, {0: 15, 1: 5})
    consume_to(platform, ahead, events.name, {0: 18, 1: 20})
    consume_to(platform, ahead, state.name, {0: 20, 1: 20})
    return behind


def test_cuts_at_the_least_committed_offset_and_the_retention_time(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], behind: str
) -> None:
    events, state = topics
    policy = RetentionPolicy(topics=(events, state), keep_ms=HOUR_MS)

    cuts = Retainer(platform.kafka, policy).run_once()

    # partition 0: both groups are past the old records, the retention time keeps the new ones;
    # partition 1: the group behind still needs offsets 5 on.
    assert low_watermarks(platform, events.name) == {0: OLD, 1: 5}
    assert {(c.topic, c.partition, c.start, c.offset) for c in cuts} == {
        (events.name, 0, 0, OLD),
        (events.name, 1, 0, 5),
    }
    assert low_watermarks(platform, state.name) == {0: 0, 1: 0}
    assert first_offset(platform, behind, events.name) == {0: 15, 1: 5}
    assert Retainer(platform.kafka, policy).run_once() == []


def test_without_a_retention_time_everything_every_group_consumed_goes(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str
) -> None:
    events, state = topics
    consume_to(platform, f"ret-a-{unique}", events.name, {0: 15, 1: 5})
    consume_to(platform, f"ret-b-{unique}", events.name, {0: 18, 1: 20})
    consume_to(platform, f"ret-a-{unique}", state.name, {0: 20, 1: 20})

    Retainer(platform.kafka, RetentionPolicy(topics=(events, state), keep_ms=0)).run_once()

    assert low_watermarks(platform, events.name) == {0: 15, 1: 5}
    assert low_watermarks(platform, state.name) == {0: 0, 1: 0}


def test_a_required_group_that_has_not_committed_holds_its_partitions(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str
) -> None:
    events, _state = topics
    sink, worker = f"ret-sink-{unique}", f"ret-worker-{unique}"
    consume_to(platform, sink, events.name, {0: 20})  # nothing committed on partition 1 yet
    consume_to(platform, worker, events.name, {0: 12, 1: 16})
    never = f"ret-never-{unique}"

    Retainer(
        platform.kafka, RetentionPolicy(topics=(events,), keep_ms=0, required={sink: (events,)})
    ).run_once()
    assert low_watermarks(platform, events.name) == {0: 12, 1: 0}

    Retainer(
        platform.kafka, RetentionPolicy(topics=(events,), keep_ms=0, required={never: (events,)})
    ).run_once()
    assert low_watermarks(platform, events.name) == {0: 12, 1: 0}


def test_a_required_groups_commits_on_topics_it_no_longer_reads_hold_nothing_back(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str
) -> None:
    events, state = topics
    exporter, worker = f"ret-exporter-{unique}", f"ret-worker-{unique}"
    consume_to(platform, exporter, events.name, {0: 2, 1: 3})  # an earlier release read the topic
    consume_to(platform, worker, events.name, {0: 15, 1: 16})
    policy = RetentionPolicy(topics=(events,), keep_ms=0, required={exporter: (state,), worker: (events,)})

    Retainer(platform.kafka, policy).run_once()

    assert low_watermarks(platform, events.name) == {0: 15, 1: 16}


def test_a_required_group_given_no_topics_holds_back_wherever_it_committed(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str
) -> None:
    """The worker (its inputs follow its processors) lags behind the sink: its commits hold."""
    events, _state = topics
    sink, worker = f"ret-sink-{unique}", f"ret-worker-{unique}"
    consume_to(platform, sink, events.name, {0: 20, 1: 20})
    consume_to(platform, worker, events.name, {0: 4, 1: 7})
    policy = RetentionPolicy(topics=(events,), keep_ms=0, required={sink: (events,), worker: ()})

    Retainer(platform.kafka, policy).run_once()

    assert low_watermarks(platform, events.name) == {0: 4, 1: 7}


def test_ignored_groups_hold_nothing_back_and_unread_partitions_stay(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], unique: str
) -> None:
    events, _state = topics
    consume_to(platform, f"ret-smoke-{unique}", events.name, {0: 1, 1: 1})
    consume_to(platform, f"ret-reader-{unique}", events.name, {0: 17})
    policy = RetentionPolicy(topics=(events,), keep_ms=0, ignored=(f"ret-smoke-{unique}",))

    Retainer(platform.kafka, policy).run_once()

    # partition 1: the only group that committed there is ignored, and no one else read it
    assert low_watermarks(platform, events.name) == {0: 17, 1: 0}


def test_past_the_cap_a_partition_keeps_its_newest_records_whoever_has_not_consumed_them(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], behind: str
) -> None:
    events, state = topics
    metrics = RetentionMetrics()
    policy = RetentionPolicy(topics=(events, state), keep_ms=HOUR_MS, max_records=8)

    cuts = Retainer(platform.kafka, policy, metrics=metrics).run_once()

    # 8 of 20 stay on both partitions. Partition 0: every group had read what the cap cut
    # (10-11: new, but over the cap). Partition 1: the group behind loses offsets 5-11.
    assert low_watermarks(platform, events.name) == {0: 12, 1: 12}
    assert {(c.partition, c.offset, c.dropped, c.behind) for c in cuts} == {
        (0, 12, 0, ()),
        (1, 12, 7, (behind,)),
    }
    dropped = metrics.registry.get_sample_value(
        "gpulens_retention_dropped_records_total", {"topic": events.name}
    )
    assert dropped == 7
    assert low_watermarks(platform, state.name) == {0: 0, 1: 0}


def test_past_the_cap_records_younger_than_the_spare_time_stay(
    platform: GPULensSettings, topics: tuple[TopicSpec, TopicSpec], behind: str
) -> None:
    """The cap would keep the newest 8 of 20 (offsets 12-19), but offsets 10-19 are stamped now:
    a burst gets ``spare_ms`` to be consumed. The group behind still loses what is older (5-9)."""
    events, state = topics
    policy = RetentionPolicy(topics=(events, state), keep_ms=HOUR_MS, max_records=8, spare_ms=HOUR_MS)

    cuts = Retainer(platform.kafka, policy).run_once()

    assert low_watermarks(platform, events.name) == {0: 10, 1: 10}
    assert {(c.partition, c.offset, c.dropped, c.behind) for c in cuts} == {
        (0, 10, 0, ()),
        (1, 10, 5, (behind,)),
    }


def test_gpulens_retention_waits_for_every_pipeline_group(
    own_platform: tuple[GPULensSettings, Path], unique: str
) -> None:
    """`gpulens retention` holds the GPU samples until every pipeline group that reads them (the
    worker, the sink; not the exporter, which never reads them) has committed past them: a
    pipeline group not started yet loses nothing."""
    settings, config = own_platform
    publish_samples(settings, 10)
    everything = dict.fromkeys(range(GPU_SAMPLES.partitions), 10)
    groups = [
        group for group, topics in pipeline_groups(settings).items() if GPU_SAMPLES in topics or not topics
    ]
    assert groups == [WorkerOptions().group_id, settings.sink.group_id]

    for group in groups:
        assert retention_once(config, keep_s="0") == ""
        assert set(low_watermarks(settings, GPU_SAMPLES.name, GPU_SAMPLES.partitions).values()) == {0}
        consume_to(settings, group, GPU_SAMPLES.name, everything)
    deleted = retention_once(config, keep_s="0")

    assert low_watermarks(settings, GPU_SAMPLES.name, GPU_SAMPLES.partitions) == everything
    assert deleted.splitlines() == [
        f"{GPU_SAMPLES.name}/{p}: deleted 10 records below 10" for p in range(GPU_SAMPLES.partitions)
    ]


def test_gpulens_retention_cuts_past_the_cap_and_names_the_groups_that_lose_records(
    own_platform: tuple[GPULensSettings, Path],
) -> None:
    """The sink has not committed on the GPU samples yet (it holds them all back), but each
    partition holds 10 records against a cap of 4: the oldest 6 go, and the sink is named."""
    settings, config = own_platform
    publish_samples(settings, 10)

    deleted = retention_once(config, max_records_per_partition="4", cap_spares_s="0")

    assert low_watermarks(settings, GPU_SAMPLES.name, GPU_SAMPLES.partitions) == dict.fromkeys(
        range(GPU_SAMPLES.partitions), 6
    )
    assert deleted.splitlines() == [
        f"{GPU_SAMPLES.name}/{p}: deleted 6 records below 6 (6 not consumed by {settings.sink.group_id})"
        for p in range(GPU_SAMPLES.partitions)
    ]


def test_gpulens_up_runs_the_job_on_the_embedded_noida_broker_only() -> None:
    def runs(**settings: object) -> bool:
        return RETENTION in pipeline_specs(GPULensSettings.model_validate(settings), None)

    assert runs()
    assert not runs(retention={"interval_s": 0})
    assert not runs(platform={"broker": "external"})
    assert not runs(platform={"broker": "tansu"})
