"""The workload usage windows reclaim judges on, read back from gpulens.agg.workload-gpu-usage.v1.

Only the tail is read: records are produced when their window closes, so every window a check
can reach was produced after ``now - max_age_s - checks * interval_s`` (wall clock) whenever
the usage is fresh enough to decide anything; partitions are read from the offset of that
time (``offsets_for_times``) to their end. Other clusters' rows are dropped after decoding.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from gpulens.producers.reclaim.exceptions import UsageReadError
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import WorkloadGpuUsage
from gpulens.schemas.model.topics import WORKLOAD_USAGE
from gpulens.schemas.wire.codec import AvroCodec


def read_usage(
    kafka: KafkaSettings, codec: AvroCodec, *, cluster: str, since: datetime, timeout_s: float = 60.0
) -> list[WorkloadGpuUsage]:
    """``cluster``'s committed workload usage rows produced since ``since``, in log order per partition.

    The worker writes in transactions, so a partition ends with a commit marker no message
    carries: its end is the consumer's end-of-partition event (``read_committed``: at the last
    stable offset), never an offset compared with the high watermark.
    """
    consumer = Consumer(
        kafka.librdkafka(
            **{
                "group.id": f"gpulens-reclaim-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
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
                error = msg.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard(msg.partition())
                    continue
                if error is not None:
                    raise UsageReadError(f"reading {WORKLOAD_USAGE.name}[{msg.partition()}]: {error}")
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


def _assign_since(consumer: Consumer, since_ms: int) -> set[int]:
    """Assign each partition with records from ``since_ms`` on, from the first; those partitions."""
    metadata = consumer.list_topics(WORKLOAD_USAGE.name, timeout=10).topics.get(WORKLOAD_USAGE.name)
    if metadata is None or metadata.error is not None:
        raise UsageReadError(f"topic {WORKLOAD_USAGE.name} does not exist; run `gpulens topics create`")
    wanted = [TopicPartition(WORKLOAD_USAGE.name, p, since_ms) for p in metadata.partitions]
    assignment = [start for start in consumer.offsets_for_times(wanted, timeout=10) if start.offset >= 0]
    consumer.assign(assignment)
    return {start.partition for start in assignment}
