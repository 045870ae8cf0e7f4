"""Interpreter settings of the long-running processes (worker, sink, exporter, load generator).

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

YOUNG_THRESHOLD = 50_000
"""Net allocations between two young-generation collections (CPython's default: 700)."""
OLDER_THRESHOLD = 100
"""Young collections per middle-generation one, and middle per full one (CPython's default: 10).
The worker's live state (records held for event time, holders, windows) reaches the older
generations, and each of their collections walks all of it. On the fleet sample path (five
processors, ``bench.worker_throughput``) the worker took 5.8-6.1 CPU-s with 10,000/10/10,
5.1-5.3 with 50,000/100/100 and 4.85-5.0 with collection off. The load generator keeps the
records of the last two minutes to resend (``EventPublisher``): with CPython's defaults at
100,000 GPUs, a third of its main thread's time went to collections (py-spy), and these
thresholds took it from 22-23.5 % of a core to 14.3-15.1 % in a probe over 50 s of steady load
(``bench.simulate_cost``: 24.8 % before, 19.0 % after, in two runs of the same day)."""


def tune_for_throughput() -> None:
    """Collect cycles less often, and never re-scan what exists at startup."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)
