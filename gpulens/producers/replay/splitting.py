"""Publishing part of a replay as a producer of its own (nodes, pods or samples).

In a cluster the node watcher, the pod watcher and the node agents publish independently,
each with its own delays. Replaying a trace as several processes, each one part under a
source name of its own, shows that the pipeline's answers do not depend on that timing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from gpulens.schemas.model.models import Event, Watermark
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODES,
    PODS,
    WORKLOADS,
    TopicSpec,
)

PARTS: dict[str, tuple[TopicSpec, ...]] = {
    "nodes": (NODES, DEVICE_INVENTORY),
    "pods": (PODS, CONTAINERS, WORKLOADS),
    "samples": (GPU_SAMPLES,),
}
"""The topics of each part, as the producers that would publish them in a cluster."""


def only(
    events: Iterable[tuple[TopicSpec, Event]], parts: Collection[str]
) -> Iterator[tuple[TopicSpec, Event]]:
    """The events of ``parts``, from source ``<source>/<part>+...``, and the replay's final watermark.

    Each part ends with the whole replay's final watermark (under its own source name), so
    the windows closed at the end are the same however the replay is split.
    """
    topics = {spec for part in parts for spec in PARTS[part]}
    suffix = "+".join(sorted(parts))
    for topic, event in events:
        if topic in topics or isinstance(event, Watermark):
            yield topic, event.model_copy(update={"source": f"{event.source}/{suffix}"})
