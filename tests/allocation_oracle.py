"""cluster_gpu_allocation computed straight from the Alibaba CSV, independently of the pipeline.

Each scheduled GPU pod holds ``amount`` GPUs over ``[scheduled_time, deletion_time)``; a
window's mean is the sum of overlaps x amounts over its length, its max the largest amount
held at its first instant or at any change inside it (an amount at an instant counts that
instant's changes: a pod leaving at a window's start is not in that window), its end the
amount held just before its end.
"""

from __future__ import annotations

import bisect
import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Expected:
    window_start: int
    gpus_allocated_avg: float
    gpus_allocated_max: float
    gpus_allocated_end: float
    pods_running_end: int
    pods_pending_end: int


def expected_rows(pods_csv: Path, window_s: int) -> list[Expected]:
    with pods_csv.open() as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["num_gpu"]) > 0]
    holds: list[tuple[int, int, float]] = []
    pendings: list[tuple[int, int]] = []
    for r in rows:
        gpus = int(r["num_gpu"])
        amount = int(r["gpu_milli"]) / 1000 if gpus == 1 and int(r["gpu_milli"]) < 1000 else float(gpus)
        created, deleted = int(r["creation_time"]), int(r["deletion_time"])
        if r["scheduled_time"]:
            scheduled = int(r["scheduled_time"])
            holds.append((scheduled, deleted, amount))
            pendings.append((created, scheduled))
        else:
            pendings.append((created, deleted))
    first = min(int(r["creation_time"]) for r in rows)
    last = max(int(r["deletion_time"]) for r in rows)
    change: dict[int, float] = defaultdict(float)
    for start, end, amount in holds:
        change[start] += amount
        change[end] -= amount
    instants = sorted(change)
    level, levels = 0.0, []
    for t in instants:
        level += change[t]
        levels.append(level)

    def held_at(t: int) -> float:
        i = bisect.bisect_right(instants, t)
        return levels[i - 1] if i else 0.0

    origin = first - first % window_s
    count = (last - origin) // window_s + 1
    integral = [0.0] * count
    running = [0] * count
    pending = [0] * count
    for held_from, held_until, amount in holds:
        for w in range(
            (held_from - origin) // window_s, min(count, (held_until - 1 - origin) // window_s + 1)
        ):
            start, end = origin + w * window_s, origin + (w + 1) * window_s
            integral[w] += amount * (min(held_until, end) - max(held_from, start))
            running[w] += held_from < end <= held_until
    for since, until in pendings:
        for w in range((since - origin) // window_s, min(count, (until - 1 - origin) // window_s + 1)):
            pending[w] += since < origin + (w + 1) * window_s <= until
    out = []
    for w in range(count):
        start, end = origin + w * window_s, origin + (w + 1) * window_s
        inside = instants[bisect.bisect_left(instants, start) : bisect.bisect_left(instants, end)]
        maximum = max([held_at(start)] + [held_at(t) for t in inside])
        out.append(
            Expected(start, integral[w] / window_s, maximum, held_at(end - 1e-9), running[w], pending[w])
        )
    return out
