"""The Prometheus exporter: the newest window of every derived series, under Primus-Lens's names.

Reads the derived topics (allocation, workload usage, alerts; each node's newest GPU samples
in the per-GPU mode only) into
:class:`LatestState`, checkpointed to its state log so that a start restores it instead of
replaying history, and renders it at scrape time with :class:`StateCollector`, next to the
exporter's own health (restore, records in, batch sizes and durations, lag, dead letters).
"""

from gpulens.consumers.prometheus.collecting import StateCollector
from gpulens.consumers.prometheus.exceptions import ExporterError
from gpulens.consumers.prometheus.exporting import (
    EXPORTED_TOPICS,
    PER_GPU_TOPICS,
    Exporter,
    exported_topics,
    run_exporter,
)
from gpulens.consumers.prometheus.settings import ExporterSettings
from gpulens.consumers.prometheus.state import LatestState, Snapshot

__all__ = [
    "EXPORTED_TOPICS",
    "PER_GPU_TOPICS",
    "Exporter",
    "ExporterError",
    "ExporterSettings",
    "LatestState",
    "Snapshot",
    "StateCollector",
    "exported_topics",
    "run_exporter",
]
