"""Forwarding pods to their workloads' partitions.

A workload's state sums its pods, which gpulens.pods.v1 spreads over partitions by pod; the
workload table is written in the partition of the workload's key. faust commits a table
write atomically only with the offset of the event in the same partition (its transactions
are per partition), so a pod is first re-keyed by owner onto ``<group>-workload-pods``
(as many partitions as gpulens.workloads.v1, the same key hashing as every producer), and
the workload table is fed from there.

The hand-over is at least once: each pod's copies are flushed before the pod is
acknowledged, and a restart forwards again what it had not committed. Every copy says where
it came from (pods partition, offset, owner index, rising), so the workload job applies each
once (see workloads).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from gpulens.pipeline.entity_tables.exceptions import ForwardFailed
from gpulens.pipeline.state_tables import workload_chain
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import PODS, STATE_WORKLOADS, TopicSpec, entity_key

POSITION = "gpulens-forwarded-from"
"""Header of a forwarded pod: ``partition/offset/owner index`` on gpulens.pods.v1."""


def forwarded_topic(group_id: str) -> TopicSpec:
    """The app's own topic of pods keyed by owner (one per consumer group)."""
    return TopicSpec(
        f"{group_id}-workload-pods",
        PodEvent,
        "uid",
        STATE_WORKLOADS.partitions,
        retention_ms=7 * 24 * 3600 * 1000,
        doc="Internal to `gpulens tables`: gpulens.pods.v1 re-keyed by owner workload.",
    )


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where a forwarded copy came from; copies from one pods partition arrive in this order."""

    partition: int
    offset: int
    owner: int

    def header(self) -> bytes:
        return f"{self.partition}/{self.offset}/{self.owner}".encode()

    @classmethod
    def parse(cls, header: bytes) -> Position:
        partition, offset, owner = (int(part) for part in header.split(b"/"))
        return cls(partition, offset, owner)


class PodForwarder:
    """Sends a pod's copies, one per owner, and waits until the broker has them all."""

    def __init__(self, kafka: KafkaSettings, topic: TopicSpec) -> None:
        self._topic = topic.name
        self._producer = Producer(kafka.producer(**{"enable.idempotence": True, "linger.ms": 1}))
        self._failures: list[str] = []

    async def forward(self, pod: PodEvent, value: bytes, partition: int, offset: int) -> None:
        """Hand ``pod`` (its bytes as read at ``partition``/``offset`` of the pods topic) over."""
        for index, owner in enumerate(workload_chain(pod)):
            produce_with_backpressure(
                self._producer,
                self._topic,
                key=entity_key(pod.cluster, owner.uid),
                value=value,
                headers={POSITION: Position(partition, offset, index).header()},
                on_delivery=self._delivered,
            )
        left = await asyncio.to_thread(self._producer.flush, 30)
        if left or self._failures:
            failures, self._failures = self._failures, []
            raise ForwardFailed(
                f"{PODS.name}/{partition}@{offset} to {self._topic}: {left} undelivered {failures}"
            )

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._failures.append(error.str())
