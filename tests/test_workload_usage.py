"""Workload GPU usage: GPUs held and utilization per workload and window."""

from __future__ import annotations

import csv
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from alert_oracle import SAMPLES

from gpulens.pipeline.windows import TumblingWindows
from gpulens.pipeline.workload_usage import WorkloadUsage
from gpulens.producers.replay import genai_duty
from gpulens.schemas.model.models import OwnerReference, WorkloadGpuUsage
from gpulens.schemas.model.topics import PODS
from gpulens.testing.examples import example_events

HOUR = 3600


def test_genai_pod_utilization_per_hour_equals_the_csv() -> None:
    usage = WorkloadUsage(TumblingWindows(HOUR * 1000))
    rows: list[WorkloadGpuUsage] = []
    for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai"):
        rows += usage.process(event)
    values: dict[tuple[str, int], list[float]] = defaultdict(list)
    first: dict[str, float] = {}
    with SAMPLES.open() as handle:
        for row in csv.DictReader(handle):
            at = float(row["timestamp_anon"])
            values[(row["container_ip"], int(at) // HOUR * HOUR)].append(float(row["value"]))
            first[row["container_ip"]] = min(at, first.get(row["container_ip"], at))
    by_name = {f"sd-serving-{ip[:8]}": ip for ip in first}
    published = {(by_name[r.workload_name], int(r.window_start.timestamp())): r for r in rows}
    assert published.keys() >= values.keys()
    for key in published.keys() - values.keys():  # held but not sampled in that hour
        row = published[key]
        assert (row.samples, row.utilization_avg, row.gpus_allocated_avg) == (0, None, 1.0)
    for key, samples in values.items():
        row = published[key]
        assert row.samples == len(samples)
        assert row.utilization_avg == pytest.approx(sum(samples) / len(samples))
        assert row.utilization_max == pytest.approx(max(samples))
        held_from = max(first[key[0]], key[1])
        assert row.gpus_allocated_avg == pytest.approx((key[1] + HOUR - held_from) / HOUR)
        assert (row.workload_kind, row.pods_active_end) == ("Pod", 1)


def test_pods_count_for_the_top_of_their_owner_chain() -> None:
    usage = WorkloadUsage(TumblingWindows(60_000))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    pod = example_events(at=t0)[PODS].model_copy(
        update={
            "owners": [
                OwnerReference(kind="ReplicaSet", api_version="apps/v1", name="web-5d8f", uid="rs"),
                OwnerReference(kind="Deployment", api_version="apps/v1", name="web", uid="deploy"),
            ],
            "gpu_amount": 2.0,
        }
    )
    usage.process(pod)
    usage.process(pod.model_copy(update={"uid": "second", "event_time": t0 + timedelta(seconds=30)}))
    rows = usage.process(pod.model_copy(update={"event_time": t0 + timedelta(minutes=1), "type": "DELETED"}))
    assert [(r.workload_kind, r.workload_name, r.workload_uid) for r in rows] == [
        ("Deployment", "web", "deploy")
    ]
    assert rows[0].gpus_allocated_avg == pytest.approx(3.0)
    assert (rows[0].gpus_allocated_max, rows[0].gpus_allocated_end, rows[0].pods_active_end) == (4.0, 4.0, 2)
