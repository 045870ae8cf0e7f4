"""`/api/pending` says why each GPU pod waits, as recomputed here from the stored pod and node events.

The session's demo (tests/api_demo.py) replays a quarter-day of the Alibaba trace onto 40 nodes
with hourly windows. At every window end, this test rebuilds the cluster from plain rows of
``pod_events`` and ``node_events`` (each entity's newest observation before that instant),
classifies each waiting pod by the free GPUs by node (one node with room: ``unknown``,
as the replay gives no scheduler message; enough in all: ``fragmentation``; else
``insufficient_gpus``), and expects the API to show the same class for each, with its age.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

import pytest
from api_demo import ALI, Demo, instant, rfc3339, utc

HOUR = timedelta(hours=1)


def newest_before(rows: list[tuple], at: datetime) -> dict[str, tuple]:
    """Entity -> its newest row (by version, the rows' second column) with event time before ``at``."""
    newest: dict[str, tuple] = {}
    for row in rows:
        entity, version, event_time = row[0], row[1], utc(row[2])
        if event_time < at and (entity not in newest or version > newest[entity][1]):
            newest[entity] = row
    return newest


def waiting_at(pods: list[tuple], at: datetime) -> dict[str, tuple[float, datetime]]:
    """Pod uid -> (GPUs asked, created) of the pods waiting unbound at ``at``."""
    return {
        uid: (gpus, utc(created))
        for uid, (_, _, _, node, phase, kind, _, gpus, created) in newest_before(pods, at).items()
        if node is None and phase == "Pending" and kind != "DELETED" and gpus > 0
    }


def expected_classes(pods: list[tuple], nodes: list[tuple], at: datetime) -> dict[str, str]:
    """Pod uid -> reason class of the pods waiting at ``at``, from the free GPUs by node then."""
    held: dict[str, float] = defaultdict(float)
    for _, _, _, node, _, kind, holds, gpus, _ in newest_before(pods, at).values():
        if holds and kind != "DELETED" and node is not None:
            held[node] += gpus
    free = [
        max(allocatable - held[name], 0.0)
        for name, (_, _, _, kind, ready, schedulable, allocatable) in newest_before(nodes, at).items()
        if kind != "DELETED" and ready and schedulable
    ]
    expected = {}
    for uid, (gpus, _) in waiting_at(pods, at).items():
        if max(free) >= gpus - 1e-9:
            expected[uid] = "unknown"
        elif sum(free) >= gpus - 1e-9:
            expected[uid] = "fragmentation"
        else:
            expected[uid] = "insufficient_gpus"
    return expected


def test_pending_shows_each_pods_reason_class_and_age_at_every_window_end(demo: Demo) -> None:
    pods = demo.sql(
        "SELECT uid, version, event_time, node, phase, type, holds_gpus, gpu_amount, creation_time "
        "FROM pod_events WHERE cluster = {c:String}",
        c=ALI,
    )
    nodes = demo.sql(
        "SELECT node, version, event_time, type, ready, schedulable, gpus_allocatable "
        "FROM node_events WHERE cluster = {c:String}",
        c=ALI,
    )
    times = {utc(p[2]) for p in pods}
    first = min(times).replace(minute=0, second=0, microsecond=0)
    checked = 0
    for k in range(1, int((max(times) - first) / HOUR) + 1):
        at = first + k * HOUR  # a window end (hourly windows), after every event before it
        if at in times:  # asOf includes events at the instant; the window end does not
            continue
        waiting = waiting_at(pods, at)
        body = demo.get("/api/pending", cluster=ALI, asOf=rfc3339(at))
        shown = {p["uid"]: p for p in body["data"]}
        assert set(shown) == set(waiting), at
        assert {uid: p["reason_class"] for uid, p in shown.items()} == expected_classes(pods, nodes, at)
        for uid, pending in shown.items():
            assert instant(pending["judged_at"]) <= at
            assert pending["age_s"] == pytest.approx((at - waiting[uid][1]).total_seconds())
            if pending["reason_class"] in ("unknown", "insufficient_gpus"):  # it fits now; nothing can
                assert pending["fits_after_consolidation"] is (pending["reason_class"] == "unknown")
            checked += 1
    assert checked >= 2, "pods wait over window ends"


def test_gpu_pod_waits_end_when_the_pod_is_bound_or_deleted_unbound(demo: Demo) -> None:
    """The view behind the wait-time histograms, against each pod's own events."""
    events: dict[str, list[tuple]] = defaultdict(list)
    for uid, version, event_time, node, kind, created in demo.sql(
        "SELECT uid, version, event_time, node, type, creation_time FROM pod_events "
        "WHERE cluster = {c:String} AND gpu_amount > 0",
        c=ALI,
    ):
        events[uid].append((version, utc(event_time), node, kind, utc(created)))
    expected = {}
    for uid, history in events.items():
        history.sort()
        created = history[0][4]
        bound = next((t for _, t, node, _, _ in history if node is not None), None)
        if bound is not None:
            expected[uid] = ("bound", (bound - created).total_seconds())
        elif history[-1][3] == "DELETED":
            expected[uid] = ("deleted", (history[-1][1] - created).total_seconds())
        else:
            expected[uid] = ("waiting", None)
    got = {
        uid: (outcome, wait)
        for uid, outcome, wait in demo.sql(
            "SELECT uid, outcome, wait_s FROM gpu_pod_waits WHERE cluster = {c:String}", c=ALI
        )
    }
    assert {uid: outcome for uid, (outcome, _) in got.items()} == {u: o for u, (o, _) in expected.items()}
    assert {uid: wait for uid, (_, wait) in got.items()} == pytest.approx(
        {u: w for u, (_, w) in expected.items()}
    )
    assert any(wait for _, wait in got.values()), "some pods waited"
