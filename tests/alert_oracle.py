"""GpuIdle alerts computed straight from the GenAI duty-cycle CSV, independently of the pipeline."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from gpulens.producers.replay.locating import traces_dir

SAMPLES = traces_dir() / "alibaba-genai-2026" / "pod_gpu_duty_cycle_48pods.csv"


def idle_alerts_from_csv(
    threshold: float, duration_s: float, samples: Path = SAMPLES
) -> set[tuple[str, str, float]]:
    """(pod, OPENED|RESOLVED, time) straight from the CSV by the rule's own words."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with samples.open() as handle:
        for row in csv.DictReader(handle):
            series[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    found = set()
    for pod, samples in series.items():
        run_start, opened = None, False
        for at, value in sorted(samples, key=lambda s: s[0]):
            if value < threshold:
                run_start = at if run_start is None else run_start
                if not opened and at - run_start >= duration_s:
                    opened = True
                    found.add((pod, "OPENED", at))
            else:
                if opened:
                    found.add((pod, "RESOLVED", at))
                run_start, opened = None, False
    return found


def stale_alerts_from_csv(stale_s: float, samples: Path = SAMPLES) -> set[tuple[str, str, float, float]]:
    """GpuTelemetryStale as (pod, OPENED|RESOLVED, time, since) straight from the CSV: each pod
    has a node of its own and holds its GPU from its first sample on (the replay never ends a
    pod), so its node is stale after every gap of more than ``stale_s`` between two of its
    samples (opened at the first plus ``stale_s``, resolved at the second), and after its last
    sample if the trace goes on more than ``stale_s`` beyond it (opened only)."""
    times: dict[str, set[float]] = defaultdict(set)
    with samples.open() as handle:
        for row in csv.DictReader(handle):
            times[row["container_ip"]].add(float(row["timestamp_anon"]))
    end = max(max(seen) for seen in times.values())
    found = set()
    for pod, seen in times.items():
        ordered = sorted(seen)
        for last, after in zip(ordered, [*ordered[1:], None], strict=True):
            if (after if after is not None else end) - last > stale_s:
                found.add((pod, "OPENED", last + stale_s, last))
                if after is not None:
                    found.add((pod, "RESOLVED", after, last))
    return found
