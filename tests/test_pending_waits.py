"""Why GPU pods wait: pending_gpu_pods from the replayed Alibaba trace equal the CSV, recomputed here.

The trace says when each pod was created, scheduled and deleted; it does not say where, so the
replayer binds pods to nodes (gpulens.producers.replay.binding) and this oracle takes only that,
each pod's node, from the replay's events. Everything else it computes from the CSV: at a window
end T (after every event before T) a pod is pending if created before T and neither scheduled
nor deleted before T; a node's pods hold GPUs if scheduled before T and not deleted before T;
a node's free GPUs are its GPUs minus those, never below zero. A pod is then ``unknown`` if one
node has room for it (the replay gives no scheduler message), ``fragmentation`` if the free GPUs
add up to enough, ``insufficient_gpus`` otherwise (every node is Ready, no pod names a model).

On the first 20 nodes of the trace (40 P100s) and 5-minute windows all three classes occur.
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gpulens.pipeline.pending_waits import WAIT_BUCKETS_S, PendingWaits
from gpulens.pipeline.waiting_reasons import GATED, ClusterRoom, NodeRoom, Waiting, WaitReason
from gpulens.pipeline.windows import TumblingWindows, to_ms
from gpulens.producers.replay import alibaba_v2023
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import PendingGpuPod, PodEvent

TRACE = traces_dir() / "alibaba-gpu-v2023"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
WINDOW_S = 300
NODES = 20


def pipeline_rows() -> tuple[list[PendingGpuPod], dict[str, str]]:
    """The rows of the replay, and the node the replay bound each pod to (by pod name)."""
    events = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(TRACE / "openb_node_list_gpu_node.csv")[:NODES],
        alibaba_v2023.read_pods(TRACE / "openb_pod_list_default.csv"),
        cluster="c",
        epoch=EPOCH,
    )
    waits, rows, placed = PendingWaits(TumblingWindows(WINDOW_S * 1000)), [], {}
    for _, event in events:  # ends with a final watermark
        for window in waits.advance(event):
            rows += window
        rows += waits.process(event)
        if isinstance(event, PodEvent) and event.node is not None:
            placed[event.name] = event.node
    return rows, placed


def csv_pods() -> list[dict[str, int | None]]:
    with (TRACE / "openb_pod_list_default.csv").open() as handle:
        out = []
        for r in csv.DictReader(handle):
            gpus, share = int(r["num_gpu"]), int(r["gpu_milli"])
            milli = share if gpus == 1 and share < 1000 else gpus * 1000
            if milli == 0:  # no GPU: not a GPU pod
                continue
            out.append(
                {
                    "name": r["name"],  # type: ignore[dict-item]
                    "milli": milli,
                    "created": int(r["creation_time"]),
                    "scheduled": int(r["scheduled_time"]) if r["scheduled_time"] else None,
                    "deleted": int(r["deletion_time"]),
                }
            )
        return out


def csv_nodes() -> dict[str, int]:
    with (TRACE / "openb_node_list_gpu_node.csv").open() as handle:
        return {r["sn"]: int(r["gpu"]) * 1000 for r in list(csv.DictReader(handle))[:NODES]}


def expected_at(t: int, pods: list, nodes: dict[str, int], placed: dict[str, str]) -> dict[str, tuple]:
    """Pod name -> (class, created, free total, most free on one node) at window end ``t``."""
    held: dict[str, int] = defaultdict(int)
    waiting = []
    for p in pods:
        if p["deleted"] < t or p["created"] >= t:
            continue
        if p["scheduled"] is not None and p["scheduled"] < t:
            held[placed[p["name"]]] += p["milli"]
        else:
            waiting.append(p)
    free = [max(capacity - held[name], 0) for name, capacity in nodes.items()]
    total, most = sum(free), max(free)
    out = {}
    for p in waiting:
        if most >= p["milli"]:
            reason = "unknown"
        elif total >= p["milli"]:
            reason = "fragmentation"
        else:
            reason = "insufficient_gpus"
        out[p["name"]] = (reason, p["created"], total / 1000, most / 1000)
    return out


def test_ended_waits_are_observed_by_outcome_as_the_csv_times_them() -> None:
    """The wait histogram: each GPU pod of the trace waits from its creation to its binding
    (``bound``) or, never scheduled, to its deletion (``deleted``)."""
    registry = CollectorRegistry()
    histogram = Histogram(
        "waits", "test", ("cluster", "namespace", "outcome"), buckets=WAIT_BUCKETS_S, registry=registry
    )
    waits = PendingWaits(TumblingWindows(WINDOW_S * 1000), waits=histogram)
    for _, event in alibaba_v2023.plan(
        alibaba_v2023.read_nodes(TRACE / "openb_node_list_gpu_node.csv")[:NODES],
        alibaba_v2023.read_pods(TRACE / "openb_pod_list_default.csv"),
        cluster="c",
        epoch=EPOCH,
    ):
        waits.advance(event)
        waits.process(event)
    expected: dict[str, list[int]] = {"bound": [], "deleted": []}
    for p in csv_pods():
        if p["scheduled"] is not None:
            expected["bound"].append(p["scheduled"] - p["created"])  # type: ignore[operator]
        else:
            expected["deleted"].append(p["deleted"] - p["created"])  # type: ignore[operator]
    assert expected["bound"] and expected["deleted"]
    for outcome, waited in expected.items():
        labels = {"cluster": "c", "namespace": "default", "outcome": outcome}
        assert registry.get_sample_value("waits_count", labels) == len(waited)
        assert registry.get_sample_value("waits_sum", labels) == pytest.approx(sum(waited))
        for bound in WAIT_BUCKETS_S:
            below = sum(1 for w in waited if w <= bound)
            assert registry.get_sample_value("waits_bucket", {**labels, "le": str(float(bound))}) == below


def test_pending_pods_are_classified_as_the_csv_says_at_every_window_end_they_wait_over() -> None:
    rows, placed = pipeline_rows()
    pods, nodes = csv_pods(), csv_nodes()
    origin = to_ms(EPOCH) // 1000
    # The instants: each window end some pod waits over, chosen from the CSV alone.
    instants = sorted(
        {
            end
            for p in pods
            for end in [(p["created"] // WINDOW_S + 1) * WINDOW_S]
            if end <= p["deleted"] and (p["scheduled"] is None or p["scheduled"] >= end)
        }
    )
    assert len(instants) > 500
    by_pod: dict[str, list[PendingGpuPod]] = defaultdict(list)
    for row in rows:
        by_pod[row.name].append(row)
    seen: Counter[str] = Counter()
    for t in instants:
        expected = expected_at(t, pods, nodes, placed)
        at = datetime.fromtimestamp(origin + t, UTC)
        verdicts = {}
        for name in expected:
            newest = [r for r in by_pod.get(name, ()) if r.event_time <= at]
            if newest:
                verdicts[name] = newest[-1]
        assert set(verdicts) == set(expected), t  # every pod waiting there has its verdict
        for name, row in verdicts.items():
            reason, created, total, most = expected[name]
            assert row.reason_class == reason, (t, name)
            assert row.created == datetime.fromtimestamp(origin + created, UTC)
            assert (at - row.created).total_seconds() == t - created  # its age at t
            if row.event_time == at:  # judged right there: the free GPUs it saw
                assert (row.gpus_free, row.max_free_on_one_node) == pytest.approx((total, most))
                assert row.waited_s == t - created
            seen[reason] += 1
    assert seen["fragmentation"] > 10 and seen["insufficient_gpus"] > 10 and seen["unknown"] > 10, seen


def test_a_row_is_written_only_when_the_verdict_changes() -> None:
    rows, _ = pipeline_rows()
    history: dict[str, list[PendingGpuPod]] = defaultdict(list)
    for row in rows:
        history[row.uid].append(row)
    for pod_rows in history.values():
        verdicts = [(r.reason_class, r.fits_after_consolidation) for r in pod_rows]
        assert all(a != b for a, b in itertools.pairwise(verdicts))
        assert [r.event_time for r in pod_rows] == sorted({r.event_time for r in pod_rows})


def node(name: str, gpus: int, *held: int, model: str = "H100", available: bool = True) -> NodeRoom:
    return NodeRoom(name, model, gpus * 1000, [h * 1000 for h in held], available)


def pod(
    gpus: int, *, models: tuple[str, ...] = (), condition: str | None = None, message: str = ""
) -> Waiting:
    return Waiting(gpus * 1000, models, condition, message or None)


def test_consolidation_frees_a_node_when_its_pods_fit_elsewhere() -> None:
    # 8 free in all, at most 4 on a node: moving b's two 2-GPU pods onto a and c frees b whole.
    room = ClusterRoom([node("a", 8, 4, 2), node("b", 8, 2, 2), node("c", 8, 4, 2)])
    verdict = room.judge(pod(8))
    assert (verdict.reason, verdict.free, verdict.max_free_on_one_node) == (
        WaitReason.FRAGMENTATION,
        8000,
        4000,
    )
    assert verdict.fits_after_consolidation
    # Same free GPUs, but every pod holds 6 of 8: none can move anywhere.
    stuck = ClusterRoom([node(n, 8, 6) for n in "abcd"]).judge(pod(8))
    assert stuck.reason is WaitReason.FRAGMENTATION and not stuck.fits_after_consolidation
    # Pods move only between nodes of one model: the free T4 does not take an H100's pod of 5.
    h100s = [node("a", 8, 5), node("b", 8, 5), node("c", 4, 2), node("t", 8, model="T4")]
    models = ClusterRoom(h100s).judge(pod(8, models=("H100",)))
    assert models.reason is WaitReason.FRAGMENTATION and not models.fits_after_consolidation


@pytest.mark.parametrize(
    ("nodes", "waiting", "reason"),
    [
        ([node("a", 8, 8)], pod(1), WaitReason.INSUFFICIENT_GPUS),
        ([node("a", 8)], pod(1, condition=GATED), WaitReason.NOT_ADMITTED),
        (
            [node("a", 8, 8)],
            pod(1, message="exceeded quota: team-a, requested: nvidia.com/gpu=1"),
            WaitReason.QUOTA,
        ),
        (
            [node("a", 8)],
            pod(1, message="0/1 nodes are available: 1 node(s) had untolerated taint {gpu: true}."),
            WaitReason.TAINT_OR_AFFINITY,
        ),
        (
            [node("a", 8)],
            pod(1, message="0/1 nodes are available: 1 node(s) were unschedulable."),
            WaitReason.NODE_UNAVAILABLE,
        ),
        (
            [node("a", 8)],
            pod(
                1,
                message="0/1 nodes are available: 1 node(s) had untolerated taint "
                "{node.kubernetes.io/not-ready: }.",
            ),
            WaitReason.NODE_UNAVAILABLE,
        ),
        ([node("a", 8)], pod(1, message="0/1 nodes are available: 1 Insufficient cpu."), WaitReason.UNKNOWN),
        ([node("a", 8, 8), node("b", 8, available=False)], pod(4), WaitReason.NODE_UNAVAILABLE),
        ([node("a", 8, 8), node("t", 8, model="T4")], pod(4, models=("H100",)), WaitReason.TAINT_OR_AFFINITY),
        ([node("a", 8, 6), node("b", 8, 6)], pod(4), WaitReason.FRAGMENTATION),
    ],
)
def test_reason_classes(nodes: list[NodeRoom], waiting: Waiting, reason: WaitReason) -> None:
    assert ClusterRoom(nodes).judge(waiting).reason is reason
