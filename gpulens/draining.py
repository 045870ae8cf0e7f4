"""Whether the pipeline has drained: every consumer group of it has consumed every record.

A group has drained when its lag in records (:mod:`gpulens.schemas.kafka.lag`: committed offsets against
the partitions' ends, transaction markers excluded) is 0 on every partition it reads. The
partitions the worker reads are the ones it committed on; the sink and the exporter read every
partition of their topics (a partition never committed on counts from its first offset: data
it has not reached yet), and only those (an exporter of an older release also committed on the
GPU sample stream, which it no longer reads). A group that committed nothing has not started:
not drained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.rows import SINK_TOPICS
from gpulens.consumers.prometheus.topics import exported_topics
from gpulens.schemas.kafka.lag import LagError, RecordLag, per_topic
from gpulens.schemas.model.topics import TopicSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupLag:
    """One consumer group's lag in records, per topic (empty: it committed nothing yet)."""

    group: str
    topics: dict[str, int]

    @property
    def records(self) -> int:
        return sum(self.topics.values())

    @property
    def drained(self) -> bool:
        return bool(self.topics) and self.records == 0


def pipeline_groups(settings: GPULensSettings) -> dict[str, tuple[TopicSpec, ...]]:
    """The pipeline's consumer groups (as `gpulens up` runs them) and the topics each reads
    besides those it committed on (the worker commits on every input when it starts)."""
    return {
        settings.pipeline.consumer_group: (),
        settings.sink.group_id: SINK_TOPICS,
        settings.exporter.group_id: exported_topics(settings.exporter),
    }


def measure(settings: GPULensSettings, lag: RecordLag) -> list[GroupLag]:
    """Every pipeline group's lag now."""
    groups = []
    for group, topics in pipeline_groups(settings).items():
        committed = {(tp.topic, tp.partition) for tp in lag.committed(group)}
        if not committed:
            groups.append(GroupLag(group, {}))
            continue
        declared = {(t.name, p) for t in topics for p in range(t.partitions)}
        groups.append(GroupLag(group, per_topic(lag.measure(group, declared or committed))))
    return groups


def wait_drained(
    settings: GPULensSettings,
    *,
    timeout_s: float,
    progress: Callable[[list[GroupLag]], None] = lambda _groups: None,
    every_s: float = 1.0,
) -> list[GroupLag] | None:
    """Wait until every pipeline group has drained; the lags then, or None after ``timeout_s``.

    ``progress`` hears each measurement. Drained must hold twice in a row ``every_s`` apart: a
    record the worker publishes while the sink commits would otherwise slip between them. A
    broker that does not answer in time (busy saving, on a loaded machine) is asked again.
    """
    lag = RecordLag(settings.kafka)
    deadline = time.monotonic() + timeout_s
    confirmed = False
    try:
        while True:
            try:
                groups = measure(settings, lag)
            except LagError as err:
                log.warning("the pipeline's lag is unknown for now, asking again: %s", err)
                confirmed = False
            else:
                progress(groups)
                if all(g.drained for g in groups):
                    if confirmed:
                        return groups
                    confirmed = True
                else:
                    confirmed = False
            if time.monotonic() >= deadline:
                return None
            time.sleep(every_s)
    finally:
        lag.close()
