"""Publishing a planned replay in event-time order, as fast as possible or N times real time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from gpulens.producers.publishing import EventPublisher
from gpulens.producers.watermarking import WatermarkCadence
from gpulens.schemas.model.models import Event
from gpulens.schemas.model.topics import TopicSpec


def replay(
    events: Iterable[tuple[TopicSpec, Event]],
    publisher: EventPublisher,
    *,
    speed: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Publish ``events`` in order; ``speed`` None means as fast as possible. Returns the count.

    With a speed, the wall time between two events is their event-time gap divided by it.
    Watermarks tell consumers how far the replay has come, every second of wall time.
    """
    count = 0
    cadence = WatermarkCadence(publisher)
    origin: tuple[float, float] | None = None
    for topic, event in events:
        if speed is not None:
            event_s = event.event_time.timestamp()
            if origin is None:
                origin = (event_s, time.monotonic())
            wait = origin[1] + (event_s - origin[0]) / speed - time.monotonic()
            if wait > 0:
                publisher.flush()
                time.sleep(wait)
        cadence.before(event)
        publisher.publish(topic, event)
        count += 1
        if progress is not None:
            progress(1)
    publisher.flush()
    return count
