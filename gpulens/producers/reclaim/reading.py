"""The workload usage windows reclaim judges on, read back from gpulens.agg.workload-gpu-usage.v1.

Only the tail is read: records are produced when their window closes, so every window a check
can reach was produced after ``now - max_age_s - checks * interval_s`` (wall clock) whenever
the usage is fresh enough to decide anything; partitions are read from the offset of that
time (``offsets_for_times``) to the end offsets taken at the start. Other clusters' rows are
dropped after decoding.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpulens.producers.reclaim.exceptions import UsageReadError
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import WorkloadGpuUsage
from gpulens.schemas.model.topics import WORKLOAD_USAGE
from gpulens.schemas.wire.codec import AvroCodec


def read_usage(
    kafka: KafkaSettings, codec: AvroCodec, *, cluster: str, since: datetime, timeout_s: float = 60.0
) -> list[WorkloadGpuUsage]:
    """``cluster``'s workload usage rows produced since ``since``, in log order per partition."""
    consumer = Consumer(
        kafka.librdkafka(
            **{"group.id": f"gpulens-reclaim-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    )
    rows: list[WorkloadGpuUsage] = []
    try:
        remaining = _assign_since(consumer, int(since.timestamp() * 1000))
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise UsageReadError(f"{WORKLOAD_USAGE.name} not read to its end in {timeout_s:.0f}s")
            for msg in consumer.consume(1000, timeout=0.5):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() or partition is None or offset is None:
                    raise UsageReadError(f"reading {WORKLOAD_USAGE.name}[{partition}]: {msg.error()}")
                if offset + 1 >= remaining.get(partition, 0):
                    remaining.pop(partition, None)
                try:
                    row = codec.decode(WORKLOAD_USAGE, msg.value() or b"", WorkloadGpuUsage)
                except DecodeError:  # the sink dead-letters these; here they are no usage
                    continue
                if row.cluster == cluster:
                    rows.append(row)
    except KafkaException as err:
        raise UsageReadError(f"reading {WORKLOAD_USAGE.name}: {err}") from err
    finally:
        consumer.close()
    return rows


def _assign_since(consumer: Consumer, since_ms: int) -> dict[int, int]:
    """Assign every partition from the first offset at ``since_ms``; the end offsets left to reach."""
    metadata = consumer.list_topics(WORKLOAD_USAGE.name, timeout=10).topics.get(WORKLOAD_USAGE.name)
    if metadata is None or metadata.error is not None:
        raise UsageReadError(f"topic {WORKLOAD_USAGE.name} does not exist; run `gpulens topics create`")
    wanted = [TopicPartition(WORKLOAD_USAGE.name, p, since_ms) for p in metadata.partitions]
    starts = consumer.offsets_for_times(wanted, timeout=10)
    remaining: dict[int, int] = {}
    assignment = []
    for start in starts:
        _, high = consumer.get_watermark_offsets(start, timeout=10)
        if 0 <= start.offset < high:
            remaining[start.partition] = high
            assignment.append(start)
    consumer.assign(assignment)
    return remaining
