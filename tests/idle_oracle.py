"""Idle GPU-hours by kind computed straight from the GenAI duty-cycle CSV, independently of the pipeline.

Each pod (``container_ip``) holds its one GPU from its first row until the end of the hour in
which the replay's last row falls (its windows close there). A row describes the GPU from its
time until the pod's next row, for at most ``valid_s``: active when its value is at or above
``idle_below``, else idle (the trace has no VRAM column: nothing is memory-idle); time no row
describes is unmeasured.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

HOUR = 3600
KINDS = ("active", "idle", "unmeasured")


def genai_hours(
    samples: Path, *, idle_below: float, valid_s: float
) -> dict[tuple[str, int], dict[str, float]]:
    """(pod, hour start in epoch seconds) -> GPU-hours per kind."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with samples.open() as handle:
        for row in csv.DictReader(handle):
            series[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    last = max(at for rows in series.values() for at, _ in rows)
    end = (int(last) // HOUR + 1) * HOUR
    found: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    for pod, rows in series.items():
        rows.sort(key=lambda r: r[0])  # stable: of one instant's rows, the file's last one counts
        for (at, value), (after, _) in zip(rows, [*rows[1:], (end, 0.0)], strict=True):
            described = min(after, at + valid_s)
            _add(found, pod, at, described, "active" if value >= idle_below else "idle")
            _add(found, pod, described, after, "unmeasured")
    return dict(found)


def _add(
    found: dict[tuple[str, int], dict[str, float]], pod: str, start: float, end: float, kind: str
) -> None:
    """Add ``[start, end)`` to ``kind``, cut at hour boundaries."""
    while start < end:
        hour = int(start) // HOUR * HOUR
        cut = min(end, hour + HOUR)
        found[(pod, hour)][kind] += (cut - start) / HOUR
        start = cut
