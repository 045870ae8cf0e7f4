"""cluster_gpu_allocation from the replayed Alibaba trace equals the CSV, computed independently."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from allocation_oracle import expected_rows
from pod_events import leaving_at_a_window_start

from gpulens.pipeline.allocation import AllocationAggregator
from gpulens.pipeline.exceptions import LateEvent
from gpulens.pipeline.windows import TumblingWindows, to_ms
from gpulens.producers.replay import alibaba_v2023
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import ClusterGpuAllocation, NodeGpuAllocation
from gpulens.schemas.model.topics import PODS
from gpulens.testing.examples import example_events

TRACE = traces_dir() / "alibaba-gpu-v2023"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
HOUR = 3600


def aggregate(pods_csv: str, window_s: int = HOUR, *, per_node: bool) -> list:
    events = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(TRACE / "openb_node_list_gpu_node.csv"),
        alibaba_v2023.read_pods(TRACE / pods_csv),
        cluster="c",
        epoch=EPOCH,
    )
    aggregator = AllocationAggregator(TumblingWindows(window_s * 1000), per_node=per_node)
    rows = []
    for _, event in events:  # the replay ends with a final watermark: every window closes
        rows += aggregator.process(event)
    return rows


@pytest.mark.parametrize(
    ("pods_csv", "window_s"),
    [
        ("openb_pod_list_default.csv", HOUR),
        ("openb_pod_list_gpushare100.csv", HOUR),
        ("openb_pod_list_default.csv", 600),  # 7 of its windows start as a pod leaves: max differs
    ],
)
def test_cluster_rows_equal_the_csv(pods_csv: str, window_s: int) -> None:
    rows = [r for r in aggregate(pods_csv, window_s, per_node=False) if isinstance(r, ClusterGpuAllocation)]
    expected = expected_rows(TRACE / pods_csv, window_s)
    assert [to_ms(r.window_start) // 1000 - to_ms(EPOCH) // 1000 for r in rows] == [
        e.window_start for e in expected
    ]
    assert [r.gpus_allocated_avg for r in rows] == pytest.approx(
        [e.gpus_allocated_avg for e in expected], abs=1e-6
    )
    assert [r.gpus_allocated_max for r in rows] == pytest.approx(
        [e.gpus_allocated_max for e in expected], abs=1e-6
    )
    assert [r.gpus_allocated_end for r in rows] == pytest.approx(
        [e.gpus_allocated_end for e in expected], abs=1e-6
    )
    assert [r.pods_running_end for r in rows] == [e.pods_running_end for e in expected]
    assert [r.pods_pending_end for r in rows] == [e.pods_pending_end for e in expected]
    assert {r.gpu_capacity for r in rows} == {6212.0}
    assert all(r.allocation_rate_avg == pytest.approx(r.gpus_allocated_avg / 6212) for r in rows)


def test_node_rows_add_up_to_the_cluster_rows() -> None:
    rows = aggregate("openb_pod_list_default.csv", per_node=True)
    cluster = {r.window_start: r for r in rows if isinstance(r, ClusterGpuAllocation)}
    nodes: dict[datetime, list[NodeGpuAllocation]] = {}
    for r in rows:
        if isinstance(r, NodeGpuAllocation):
            nodes.setdefault(r.window_start, []).append(r)
    for start, row in cluster.items():
        per_node = nodes.get(start, [])
        assert sum(n.gpus_allocated_avg for n in per_node) == pytest.approx(row.gpus_allocated_avg, abs=1e-6)
        assert sum(n.gpus_allocated_end for n in per_node) == pytest.approx(row.gpus_allocated_end, abs=1e-6)
        assert sum(n.pods_running_end for n in per_node) == row.pods_running_end


def test_an_event_older_than_applied_time_is_late() -> None:
    aggregator = AllocationAggregator(TumblingWindows())
    pod = example_events()[PODS]
    aggregator.apply(pod)
    with pytest.raises(LateEvent, match="arrived after"):
        aggregator.apply(pod.model_copy(update={"event_time": datetime(2020, 1, 1, tzinfo=UTC)}))


def test_one_pod_leaving_as_another_arrives_never_counts_both() -> None:
    aggregator = AllocationAggregator(TumblingWindows(60_000), per_node=False)
    base = example_events(at=datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC))[PODS]
    swap = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    aggregator.apply(base)
    aggregator.apply(base.model_copy(update={"type": "DELETED", "event_time": swap}))
    aggregator.apply(base.model_copy(update={"uid": "other", "event_time": swap}))
    row = aggregator.finish(base.cluster)[0]
    assert row.gpus_allocated_max == 8.0
    assert row.gpus_allocated_avg == pytest.approx(8.0 * 50 / 60)


def test_a_pod_leaving_at_a_window_start_is_not_in_that_window() -> None:
    aggregator = AllocationAggregator(TumblingWindows(HOUR * 1000), per_node=False)
    rows = []
    for event in leaving_at_a_window_start("c"):
        rows += aggregator.apply(event)
    rows += aggregator.finish("c")
    assert [(r.gpus_allocated_max, r.gpus_allocated_end) for r in rows] == [(2.5, 2.5), (0.5, 0.5)]
    assert rows[0].gpus_allocated_avg == pytest.approx((2.0 * 3600 + 0.5 * 3500) / 3600)
