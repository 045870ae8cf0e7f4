"""Window definitions (apart from the code that runs them): tumbling, epoch-aligned, half-open."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gpulens.schemas.model.models import Event
from gpulens.schemas.wire.sample_columns import SampleColumns


@dataclass(frozen=True, slots=True)
class TumblingWindows:
    """Windows ``[k*size, (k+1)*size)`` in epoch milliseconds (DESIGN.md: default 30 s)."""

    size_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"window size must be positive, got {self.size_ms} ms")

    def start_of(self, at_ms: int) -> int:
        """Start of the window holding ``at_ms`` (an event at a window's end opens the next one)."""
        return at_ms - at_ms % self.size_ms


def to_ms(moment: datetime) -> int:
    """Epoch milliseconds of an aware datetime (exact: our timestamps have millisecond precision)."""
    return round(moment.timestamp() * 1000)


def event_time_ms(event: Event | SampleColumns) -> int:
    """Epoch milliseconds of an event's time (a batch read by column holds them as read)."""
    return event.event_ms if isinstance(event, SampleColumns) else to_ms(event.event_time)


def from_ms(at_ms: int) -> datetime:
    """The aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(at_ms / 1000, UTC)


MILLI = 1000
"""Amounts are counted in thousandths of a GPU, as integers: sums of shares stay exact."""


def milli(amount: float) -> int:
    """``amount`` GPUs in thousandths."""
    return round(amount * MILLI)


@dataclass(slots=True)
class HeldAmount:
    """An amount (milli-GPUs held by a cluster, node or workload) integrated over the current window.

    ``value`` holds from instant ``since`` on; ``maximum`` is the largest amount at the window's
    instants before ``since``. The value at ``since`` stays open until time moves past it: a
    second settle at the same instant replaces it, because the amount at an instant is the one
    after all of that instant's events (DESIGN.md). So the level carried into a window counts
    toward its maximum only if nothing changes it at the window's first instant.
    """

    since: int
    value: int = 0
    integral: int = 0
    maximum: int = 0

    def settle(self, at: int, value: int) -> None:
        """``value`` holds from instant ``at`` on (after all of that instant's events)."""
        if at > self.since:
            self.integral += self.value * (at - self.since)
            self.maximum = max(self.maximum, self.value)
            self.since = at
        self.value = value

    @property
    def peak(self) -> int:
        """The largest amount at any instant of the window so far."""
        return max(self.maximum, self.value)

    def close(self, end: int, size: int) -> tuple[float, float, float]:
        """(mean, max, end value) in GPUs of the window ending at ``end``; then start the next,
        whose first instant holds the carried value until an event at ``end`` replaces it."""
        self.integral += self.value * (end - self.since)
        result = (self.integral / size / MILLI, self.peak / MILLI, self.value / MILLI)
        self.since, self.integral, self.maximum = end, 0, 0
        return result
