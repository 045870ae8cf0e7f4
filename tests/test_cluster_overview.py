"""cluster_overview: node health and idleness at window end, allocation and utilization."""

from __future__ import annotations

import csv
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from alert_oracle import SAMPLES

from gpulens.pipeline.allocation import AllocationAggregator
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.replay import genai_duty
from gpulens.schemas.model.models import ClusterOverview
from gpulens.schemas.model.topics import GPU_SAMPLES, NODES, PODS
from gpulens.testing.examples import example_events

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_nodes_are_classified_at_window_end() -> None:
    aggregator = AllocationAggregator(TumblingWindows(60_000), per_node=False, overview=True)
    events = example_events(at=T0)
    node, pod, samples = events[NODES], events[PODS], events[GPU_SAMPLES]
    aggregator.process(node)  # gpu-node-07: 8 GPUs
    aggregator.process(node.model_copy(update={"node": "half"}))
    aggregator.process(node.model_copy(update={"node": "idle"}))
    aggregator.process(node.model_copy(update={"node": "down", "ready": False}))
    aggregator.process(node.model_copy(update={"node": "cordoned", "schedulable": False}))
    aggregator.process(pod)  # 8 GPUs on gpu-node-07
    aggregator.process(pod.model_copy(update={"uid": "p2", "node": "half", "gpu_amount": 2.0}))
    aggregator.process(samples)  # 97 % and 96 %
    rows = aggregator.process(node.model_copy(update={"event_time": T0 + timedelta(minutes=1)}))
    overview = next(r for r in rows if isinstance(r, ClusterOverview))
    counts = (
        overview.nodes_total,
        overview.nodes_healthy,
        overview.nodes_not_ready,
        overview.nodes_cordoned,
        overview.nodes_fully_idle,
        overview.nodes_partially_idle,
        overview.nodes_busy,
    )
    assert counts == (5, 3, 1, 1, 1, 1, 1)
    assert overview.gpu_capacity == 24.0
    assert overview.gpus_allocated_avg == pytest.approx(10.0)
    assert overview.gpu_utilization_avg == pytest.approx(96.5)
    assert overview.gpu_samples == 2


def test_genai_hourly_utilization_is_the_mean_of_the_csv_samples() -> None:
    aggregator = AllocationAggregator(TumblingWindows(3_600_000), per_node=False, overview=True)
    rows = []
    for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai"):
        rows += aggregator.process(event)
    values: dict[int, list[float]] = defaultdict(list)
    with SAMPLES.open() as handle:
        for row in csv.DictReader(handle):
            values[int(float(row["timestamp_anon"])) // 3600 * 3600].append(float(row["value"]))
    overview = {int(r.window_start.timestamp()): r for r in rows if isinstance(r, ClusterOverview)}
    assert overview.keys() == values.keys()
    for hour, samples in values.items():
        assert overview[hour].gpu_samples == len(samples)
        assert overview[hour].gpu_utilization_avg == pytest.approx(sum(samples) / len(samples))
