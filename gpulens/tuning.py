"""Interpreter settings of the long-running consumers (worker, sink, exporter).

They build and drop thousands of small objects a second (records, rows, window state).
CPython runs a young-generation collection every 700 net allocations, and each one walks
the young objects: measured in the worker on the fleet sample path
(``python -m bench.worker_throughput``), collecting every 10,000 instead gave 1.5x the
records per CPU-second, the same as turning collection off. Our objects rarely form cycles;
reference counting frees them. Startup objects (modules, schemas, generated readers) are
frozen out of every later collection.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations between two young-generation collections (CPython's default: 700)."""


def tune_for_throughput() -> None:
    """Collect cycles less often, and never re-scan what exists at startup."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
