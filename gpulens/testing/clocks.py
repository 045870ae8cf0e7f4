"""A clock the caller moves by hand, for code that takes its clock as a callable
(``time.monotonic`` by default): tests and benches step time without sleeping."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Returns ``now`` (seconds), which starts at 0 and is set or advanced by the caller."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
