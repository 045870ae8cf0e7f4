"""What the exporter reads: a module of its own, so that what only needs the list (the retention
job, `gpulens down`'s drain) does not load the exporter, its codec and the schema-registry client
(`gpulens retention` held 69 MB with them)."""

from __future__ import annotations

from gpulens.consumers.prometheus.settings import ExporterSettings
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    IDLE_GPU_HOURS,
    NODE_ALLOCATION,
    STATE_GPU_SAMPLES,
    WORKLOAD_USAGE,
    TopicSpec,
)

EXPORTED_TOPICS: tuple[TopicSpec, ...] = (
    *(CLUSTER_ALLOCATION, NODE_ALLOCATION, WORKLOAD_USAGE, ALERTS, IDLE_GPU_HOURS),
)
"""What the exporter reads by default: the worker's aggregates, alerts and idle GPU-hours."""
PER_GPU_TOPICS: tuple[TopicSpec, ...] = (*EXPORTED_TOPICS, STATE_GPU_SAMPLES)
"""What it reads in the per-GPU mode: also each node's newest sample batch."""


def exported_topics(settings: ExporterSettings) -> tuple[TopicSpec, ...]:
    """The catalog topics an exporter with ``settings`` reads."""
    return PER_GPU_TOPICS if settings.per_gpu else EXPORTED_TOPICS
