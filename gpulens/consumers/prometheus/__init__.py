"""The Prometheus exporter: the newest window of every derived series, under Primus-Lens's names.

Reads the derived topics (allocation, workload usage, alerts; each node's newest GPU samples
in the per-GPU mode only) into
:class:`LatestState`, checkpointed to its state log so that a start restores it instead of
replaying history, and renders it at scrape time with :class:`StateCollector`, next to the
exporter's own health (restore, records in, batch sizes and durations, lag, dead letters).

Names load on first use (PEP 562): every GPULens process imports
``gpulens.consumers.prometheus.settings`` for its configuration, and that must not load the
exporter, its codec and the schema-registry client with it (27 MB of RSS and 0.16 s in each, measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.schemas.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gpulens.consumers.prometheus.collecting import StateCollector
    from gpulens.consumers.prometheus.exceptions import ExporterError
    from gpulens.consumers.prometheus.exporting import Exporter, run_exporter
    from gpulens.consumers.prometheus.settings import ExporterSettings
    from gpulens.consumers.prometheus.state import LatestState, Snapshot
    from gpulens.consumers.prometheus.topics import EXPORTED_TOPICS, PER_GPU_TOPICS, exported_topics

_EXPORTS: dict[str, str] = {
    "EXPORTED_TOPICS": "topics",
    "Exporter": "exporting",
    "ExporterError": "exceptions",
    "ExporterSettings": "settings",
    "LatestState": "state",
    "PER_GPU_TOPICS": "topics",
    "Snapshot": "state",
    "StateCollector": "collecting",
    "exported_topics": "topics",
    "run_exporter": "exporting",
}
"""Public name -> the submodule defining it."""

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
