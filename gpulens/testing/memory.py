"""Python memory that a built object holds, for the tests and benches that compare holders."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def traced_bytes(make: Callable[[], T]) -> tuple[int, T]:
    """Bytes of Python memory (``tracemalloc``, after a full collection) that ``make()`` left
    allocated, and what it returned. Traces only while ``make`` runs unless tracing already."""
    started = not tracemalloc.is_tracing()
    gc.collect()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = make()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, made
    finally:
        if started:
            tracemalloc.stop()
