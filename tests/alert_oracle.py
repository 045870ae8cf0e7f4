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
