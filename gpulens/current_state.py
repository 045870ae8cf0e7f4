"""The cluster as it is now, read as any subscriber would: the compacted state topics from the
beginning to their end, the newest row per key, tombstoned keys gone."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.models import NodeEvent, PodEvent, WorkloadState
from gpulens.schemas.model.topics import STATE_NODES, STATE_PODS, STATE_WORKLOADS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec


class StateReadError(GPULensError):
    """A state topic could not be read to its end in time."""


def read_newest(kafka: KafkaSettings, topic: TopicSpec, *, timeout: float = 60.0) -> dict[bytes, bytes]:
    """Every live key of ``topic`` with its newest value, read up to the partitions' ends."""
    consumer = Consumer(
        kafka.librdkafka(
            **{
                "group.id": f"gpulens-state-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    try:
        left = {
            p
            for p in range(topic.partitions)
            if consumer.get_watermark_offsets(TopicPartition(topic.name, p), timeout=10)[1] > 0
        }
        consumer.assign([TopicPartition(topic.name, p, OFFSET_BEGINNING) for p in left])
        newest: dict[bytes, bytes] = {}
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise StateReadError(f"{topic.name}: not read to its end within {timeout:.0f} s")
            for message in consumer.consume(5_000, 0.5):
                error = message.error()
                if error is None:
                    key, value = message.key() or b"", message.value()
                    if value is None:
                        newest.pop(key, None)
                    else:
                        newest[key] = value
                elif error.code() == KafkaError._PARTITION_EOF:
                    left.discard(message.partition() or 0)
                elif not error.retriable():
                    raise StateReadError(f"{topic.name}: {error.str()}")
        return newest
    finally:
        consumer.close()


@dataclass(slots=True)
class ClusterNow:
    """What one cluster holds now, from the state topics."""

    nodes: int = 0
    pods: Counter[str] = field(default_factory=Counter)
    """Pods by phase."""
    workloads: Counter[str] = field(default_factory=Counter)
    """Workloads by status."""
    gpus_held: float = 0.0
    top: list[WorkloadState] = field(default_factory=list)
    """Top-level workloads holding the most GPUs."""


def clusters_now(kafka: KafkaSettings, codec: AvroCodec, *, top: int = 3) -> dict[str, ClusterNow]:
    """Every cluster on the state topics, as it is now."""
    clusters: dict[str, ClusterNow] = {}
    for value in read_newest(kafka, STATE_NODES).values():
        node = codec.decode(STATE_NODES, value)
        assert isinstance(node, NodeEvent)
        clusters.setdefault(node.cluster, ClusterNow()).nodes += 1
    for value in read_newest(kafka, STATE_PODS).values():
        pod = codec.decode(STATE_PODS, value)
        assert isinstance(pod, PodEvent)
        clusters.setdefault(pod.cluster, ClusterNow()).pods[pod.phase] += 1
    tops: dict[str, list[WorkloadState]] = {}
    for value in read_newest(kafka, STATE_WORKLOADS).values():
        workload = codec.decode(STATE_WORKLOADS, value)
        assert isinstance(workload, WorkloadState)
        now = clusters.setdefault(workload.cluster, ClusterNow())
        now.workloads[workload.status.value] += 1
        if workload.top_uid == workload.uid:
            now.gpus_held += workload.gpus_held
            tops.setdefault(workload.cluster, []).append(workload)
    for cluster, workloads in tops.items():
        workloads.sort(key=lambda w: (-w.gpus_held, w.name))
        clusters[cluster].top = workloads[:top]
    return clusters
