"""`gpulens api` against real ClickHouse holding replayed data: each endpoint's numbers equal an
independent computation, from the latest-state tables, the tested "as of" SQL, plain SQL of
the windowed tables, or the trace's CSV itself. The data and the API process are the session's
``demo`` (tests/api_demo.py), asked over HTTP.
"""

from __future__ import annotations

import csv
import subprocess
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from api_demo import ALI, GEN, Demo, busiest_window_end, gpulens, instant, rfc3339, utc, wait_answering
from clickhouse_connect.driver.exceptions import DatabaseError
from idle_oracle import genai_hours

from gpulens.api.reading import READ_ONLY, open_reader
from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.exceptions import ClickHouseError
from gpulens.consumers.clickhouse.queries import GPU_ALLOCATION_AS_OF, PODS_RUNNING_AS_OF
from gpulens.platform import free_port
from gpulens.producers.replay import genai_duty


def duty_rows(demo: Demo) -> list[tuple[str, datetime, float]]:
    """The GenAI slice as the CSV says: (pod, time, utilization %)."""
    with demo.duty_csv.open() as handle:
        return [
            (r["container_ip"], datetime.fromtimestamp(float(r["timestamp_anon"]), UTC), float(r["value"]))
            for r in csv.DictReader(handle)
        ]


def bucket(at: datetime, step: int) -> datetime:
    return datetime.fromtimestamp(int(at.timestamp()) // step * step, UTC)


# --- clusters --------------------------------------------------------------------------------------


def test_clusters_have_the_nodes_and_capacity_of_the_latest_state_table(demo: Demo) -> None:
    listed = {c["name"]: c for c in demo.get("/api/clusters")["data"]}
    expected = demo.sql(
        "SELECT cluster, count(), sumIf(gpus_allocatable, ready AND schedulable) FROM nodes FINAL "
        "WHERE type != 'DELETED' AND cluster IN ({a:String}, {g:String}) GROUP BY cluster",
        a=ALI,
        g=GEN,
    )
    assert {c: (listed[c]["nodes"], listed[c]["gpu_capacity"]) for c, *_ in expected} == {
        c: (n, capacity) for c, n, capacity in expected
    }
    assert {ALI, GEN} <= listed.keys()


def test_overview_allocation_is_the_last_window_and_as_of_is_the_as_of_sql(demo: Demo) -> None:
    last = demo.sql(
        "SELECT window_start, allocation_rate_avg, gpus_allocated_avg, gpu_capacity "
        "FROM cluster_gpu_allocation FINAL WHERE cluster = {c:String} ORDER BY window_start DESC LIMIT 1",
        c=ALI,
    )[0]
    overview = demo.get(f"/api/clusters/{ALI}/overview")
    allocation = overview["allocation"]
    assert instant(allocation["window_start"]) == utc(last[0])
    assert (
        allocation["allocation_rate_avg"],
        allocation["gpus_allocated_avg"],
        allocation["gpu_capacity"],
    ) == (
        pytest.approx(last[1]),
        pytest.approx(last[2]),
        last[3],
    )
    nodes = demo.sql(
        "SELECT nodes_total, nodes_fully_idle, nodes_partially_idle, nodes_busy, gpu_utilization_avg "
        "FROM cluster_overview FINAL WHERE cluster = {c:String} ORDER BY window_start DESC LIMIT 1",
        c=GEN,
    )[0]
    shown = demo.get(f"/api/clusters/{GEN}/overview")["nodes"]
    assert (
        shown["nodes_total"],
        shown["nodes_fully_idle"],
        shown["nodes_partially_idle"],
        shown["nodes_busy"],
    ) == nodes[:4]
    assert shown["gpu_utilization_avg"] == pytest.approx(nodes[4])
    # now, without asOf: the latest-state tables
    held = demo.sql(
        "SELECT sum(gpu_amount), count() FROM pods FINAL WHERE cluster = {c:String} AND holds_gpus", c=GEN
    )[0]
    now = demo.get(f"/api/clusters/{GEN}/overview")["now"]
    assert (now["gpus_allocated"], now["pods_running"]) == (held[0], held[1])

    # as of the busiest window's end: that window, and the as-of SQL of TABLES.md at that instant
    at = busiest_window_end(demo)
    past = demo.get(f"/api/clusters/{ALI}/overview", asOf=rfc3339(at))
    assert instant(past["allocation"]["window_end"]) == at
    expected = demo.sql(GPU_ALLOCATION_AS_OF, cluster=ALI, at=at)[0]
    got = past["now"]
    assert (got["gpu_capacity"], got["gpus_allocated"], got["pods_running"], got["pods_pending"]) == (
        expected[0],
        pytest.approx(expected[1]),
        expected[2],
        expected[3],
    )
    assert got["gpus_allocated"] > 0, "the busiest instant holds GPUs"
    assert got["allocation_rate"] == pytest.approx(expected[1] / expected[0])


def test_consumers_are_the_workloads_holding_gpus_in_their_newest_window_page_by_page(demo: Demo) -> None:
    expected = demo.sql(
        "SELECT workload_uid, gpu_allocated, gpu_utilization FROM workload_statistic "
        "WHERE cluster = {c:String} AND gpu_allocated > 0 ORDER BY gpu_allocated DESC, workload_uid",
        c=GEN,
    )
    pages, page = [], 1
    while True:
        body = demo.get(f"/api/clusters/{GEN}/consumers", pageNum=page, pageSize=7)
        assert body["total"] == len(expected)
        if not body["data"]:
            break
        pages += body["data"]
        page += 1
    assert [(c["uid"], c["gpus_held"]) for c in pages] == [(uid, gpus) for uid, gpus, _ in expected]
    assert [c["utilization_avg"] for c in pages] == pytest.approx([u for *_, u in expected])
    assert len(expected) == len({pod for pod, _, _ in duty_rows(demo)})


def test_gpu_heatmap_cells_are_the_means_of_the_csv_rows(demo: Demo) -> None:
    rows = duty_rows(demo)
    start, end, step = min(r[1] for r in rows), max(r[1] for r in rows) + timedelta(seconds=1), 600
    expected: dict[tuple[str, datetime], list[float]] = defaultdict(list)
    for pod, at, value in rows:
        expected[(genai_duty.node_name(pod), bucket(at, step))].append(value)
    body = demo.get(f"/api/clusters/{GEN}/gpuHeatmap", start=rfc3339(start), end=rfc3339(end), step=step)
    cells = {(c["node"], instant(c["time"])): c for c in body["data"]}
    assert cells.keys() == expected.keys()
    for key, values in expected.items():
        assert cells[key]["samples"] == len(values), key
        assert cells[key]["utilization"] == pytest.approx(sum(values) / len(values)), key
        assert cells[key]["gpu_index"] == 0
    default = demo.get(f"/api/clusters/{GEN}/gpuHeatmap", step=step)
    assert instant(default["end"]) == max(r[1] for r in rows) + timedelta(milliseconds=1)
    assert instant(default["start"]) == instant(default["end"]) - timedelta(hours=1)


def test_idle_workloads_are_gpu_hours_held_times_the_csv_idleness_now_and_as_of(demo: Demo) -> None:
    rows = duty_rows(demo)
    utilization: dict[tuple[str, datetime], list[float]] = defaultdict(list)
    for pod, at, value in rows:
        utilization[(genai_duty.pod_uid(GEN, pod), bucket(at, 3600))].append(value)
    windows = demo.sql(
        "SELECT workload_uid, window_start, window_end, "
        "gpus_allocated_avg * dateDiff('second', window_start, window_end) / 3600 "
        "FROM workload_gpu_usage FINAL WHERE cluster = {c:String} AND gpus_allocated_avg > 0",
        c=GEN,
    )

    def expected(by: datetime) -> dict[str, tuple[float, float]]:
        """(GPU-hours held, of those idle) per workload with samples, over windows ended by ``by``:
        a window without CSV rows adds to the hours held only."""
        held: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        measured = set()
        for uid, start, end, gpu_hours in windows:
            if utc(end) > by:
                continue
            held[uid][0] += gpu_hours
            if values := utilization.get((uid, utc(start))):
                measured.add(uid)
                held[uid][1] += gpu_hours * (1 - sum(values) / len(values) / 100)
        return {uid: (total, idle) for uid, (total, idle) in held.items() if uid in measured}

    everything = expected(max(r[1] for r in rows) + timedelta(days=1))
    body = demo.get(f"/api/clusters/{GEN}/idleWorkloads", pageSize=1000)
    assert body["total"] == len(everything) == len({p for p, _, _ in rows})
    got = {w["uid"]: (w["gpu_hours"], w["idle_gpu_hours"]) for w in body["data"]}
    assert got == {uid: pytest.approx(pair) for uid, pair in everything.items()}
    idle = [w["idle_gpu_hours"] for w in body["data"]]
    assert idle == sorted(idle, reverse=True) and idle[0] > 0, "most idle first"
    top = demo.get(f"/api/clusters/{GEN}/idleWorkloads", pageSize=3)
    assert [w["uid"] for w in top["data"]] == [w["uid"] for w in body["data"][:3]]

    at = min(utc(end) for _, _, end, _ in windows)
    then = expected(at)
    assert then and then != everything, "by the first window's end, only the first windows count"
    past = demo.get(f"/api/clusters/{GEN}/idleWorkloads", pageSize=1000, asOf=rfc3339(at))["data"]
    assert {w["uid"]: (w["gpu_hours"], w["idle_gpu_hours"]) for w in past} == {
        uid: pytest.approx(pair) for uid, pair in then.items()
    }


# --- nodes ---------------------------------------------------------------------------------------


def test_nodes_hold_what_the_pods_tables_say_now_and_as_of(demo: Demo) -> None:
    listed = demo.get("/api/nodes", cluster=ALI, pageSize=1000)
    expected = demo.sql(
        "SELECT node, gpus_allocatable FROM nodes FINAL WHERE cluster = {c:String} AND type != 'DELETED' "
        "ORDER BY node",
        c=ALI,
    )
    assert listed["total"] == len(expected) == 40
    assert [(n["name"], n["gpus_allocatable"]) for n in listed["data"]] == expected
    held_now = dict(
        demo.sql(
            "SELECT node, sum(gpu_amount) FROM pods FINAL "
            "WHERE cluster = {c:String} AND holds_gpus GROUP BY node",
            c=ALI,
        )
    )
    assert {n["name"]: n["gpus_allocated"] for n in listed["data"] if n["gpus_allocated"]} == held_now

    at = busiest_window_end(demo)
    past = demo.get("/api/nodes", cluster=ALI, pageSize=1000, asOf=rfc3339(at))["data"]
    running = demo.sql(PODS_RUNNING_AS_OF, cluster=ALI, at=at)
    held: dict[str, float] = defaultdict(float)
    for _uid, _ns, _name, node, gpus in running:
        held[node] += gpus
    assert {n["name"]: n["gpus_allocated"] for n in past if n["gpus_allocated"]} == pytest.approx(dict(held))
    # pages of 15 make the same list
    pages = [demo.get("/api/nodes", cluster=ALI, pageSize=15, pageNum=p)["data"] for p in (1, 2, 3, 4)]
    assert [n["name"] for page in pages for n in page] == [n["name"] for n in listed["data"]]

    busiest = max(held, key=lambda n: (held[n], n))
    one = demo.get(f"/api/nodes/{busiest}", cluster=ALI, asOf=rfc3339(at))
    assert (one["node"], one["gpus_allocated"], one["pods_running"]) == (
        busiest,
        pytest.approx(held[busiest]),
        sum(1 for r in running if r[3] == busiest),
    )
    workloads = demo.get(f"/api/nodes/{busiest}/workloads", cluster=ALI, asOf=rfc3339(at))["data"]
    assert sorted(w["uid"] for w in workloads) == sorted(r[0] for r in running if r[3] == busiest)
    history = demo.get(f"/api/nodes/{busiest}/workloadsHistory", cluster=ALI, pageSize=1000)
    ever = demo.sql(
        "SELECT DISTINCT uid FROM pod_events WHERE cluster = {c:String} AND node = {n:String} AND holds_gpus",
        c=ALI,
        n=busiest,
    )
    assert sorted(h["pod_uid"] for h in history["data"]) == sorted(u for (u,) in ever)
    assert history["total"] == len(ever)
    assert all(h["held_until"] is None or h["held_until"] > h["held_from"] for h in history["data"])
    windows = demo.get(f"/api/nodes/{busiest}/gpuAllocation", cluster=ALI)["data"]
    expected_windows = demo.sql(
        "SELECT window_start, gpus_allocated_avg FROM node_gpu_allocation FINAL "
        "WHERE cluster = {c:String} AND node = {n:String} ORDER BY window_start",
        c=ALI,
        n=busiest,
    )
    assert [(instant(w["window_start"]), w["gpus_allocated_avg"]) for w in windows] == [
        (utc(s), pytest.approx(v)) for s, v in expected_windows
    ]
    assert demo.http.get("/api/nodes/no-such-node", params={"cluster": ALI}).status_code == 404


def test_a_genai_node_shows_its_gpu_its_holder_and_the_csv_samples(demo: Demo) -> None:
    rows = duty_rows(demo)
    pod = rows[0][0]
    node = genai_duty.node_name(pod)
    devices = demo.get(f"/api/nodes/{node}/gpuDevices", cluster=GEN)["data"]
    name = demo.sql(
        "SELECT name FROM pods FINAL WHERE cluster = {c:String} AND uid = {u:String}",
        c=GEN,
        u=genai_duty.pod_uid(GEN, pod),
    )[0][0]
    assert [(d["device_id"], d["gpu_index"], d["pod_name"]) for d in devices] == [
        (genai_duty.gpu_id(pod), 0, name)
    ]
    first = min(at for p, at, _ in rows if p == pod)
    assert (
        demo.get(f"/api/nodes/{node}/gpuDevices", cluster=GEN, asOf=rfc3339(first - timedelta(seconds=1)))[
            "data"
        ]
        == []
    ), "before its first inventory the node had no GPU"

    step = 300
    expected: dict[datetime, list[float]] = defaultdict(list)
    for p, at, value in rows:
        if p == pod:
            expected[bucket(at, step)].append(value)
    start, end = rfc3339(min(expected)), rfc3339(max(expected) + timedelta(seconds=step))
    metrics = demo.get(f"/api/nodes/{node}/gpuMetrics", cluster=GEN, start=start, end=end, step=step)["data"]
    history = demo.get(
        f"/api/nodes/{node}/gpuUtilizationHistory", cluster=GEN, start=start, end=end, step=step
    )
    for series in (metrics, history["data"]):
        assert [instant(m["time"]) for m in series] == sorted(expected)
        assert [m["utilization"] for m in series] == pytest.approx(
            [sum(v) / len(v) for _, v in sorted(expected.items())]
        )
        assert [m["samples"] for m in series] == [len(v) for _, v in sorted(expected.items())]


# --- workloads -------------------------------------------------------------------------------------


def test_workloads_filters_detail_hierarchy_metrics_and_pods(demo: Demo) -> None:
    rows = duty_rows(demo)
    pods = Counter(p for p, _, _ in rows)
    listed = demo.get("/api/workloads", cluster=GEN, pageSize=1000)
    assert listed["total"] == len(pods)
    assert {w["uid"] for w in listed["data"]} == {genai_duty.pod_uid(GEN, p) for p in pods}
    assert {(w["kind"], w["status"], w["gpus_held"], w["namespace"]) for w in listed["data"]} == {
        ("Pod", "Running", 1.0, "genai")
    }
    assert demo.get("/api/workloads", cluster=GEN, kind="Pod")["total"] == len(pods)
    assert demo.get("/api/workloads", cluster=GEN, status="Done")["total"] == 0
    assert demo.get("/api/workloads", cluster=GEN, namespace="elsewhere")["total"] == 0

    pod = rows[0][0]
    uid = genai_duty.pod_uid(GEN, pod)
    one = demo.get(f"/api/workloads/{uid}", cluster=GEN)
    assert (one["uid"], one["pods_running"], one["gpus_held"]) == (uid, 1, 1.0)
    tree = demo.get(f"/api/workloads/{uid}/hierarchy", cluster=GEN)
    assert (tree["uid"], tree["kind"], tree["children"], [p["uid"] for p in tree["pods"]]) == (
        uid,
        "Pod",
        [],
        [uid],
    )
    assert [p["uid"] for p in demo.get(f"/api/workloads/{uid}/pods", cluster=GEN)["data"]] == [uid]
    windows = demo.get(f"/api/workloads/{uid}/metrics", cluster=GEN)["data"]
    assert sum(w["samples"] for w in windows) == pods[pod], "every CSV row of the pod is a sample of it"
    expected = demo.sql(
        "SELECT window_start, utilization_avg FROM workload_gpu_usage FINAL "
        "WHERE cluster = {c:String} AND workload_uid = {u:String} ORDER BY window_start",
        c=GEN,
        u=uid,
    )
    assert [(instant(w["window_start"]), w["utilization_avg"]) for w in windows] == [
        (utc(s), pytest.approx(u)) for s, u in expected
    ]
    assert demo.http.get("/api/workloads/nope", params={"cluster": GEN}).status_code == 404

    at = busiest_window_end(demo)
    past = demo.get("/api/workloads", cluster=ALI, pageSize=1000, asOf=rfc3339(at))["data"]
    expected_alloc = demo.sql(GPU_ALLOCATION_AS_OF, cluster=ALI, at=at)[0]
    assert sum(w["gpus_held"] for w in past) == pytest.approx(expected_alloc[1])
    assert sum(w["pods_running"] for w in past) == expected_alloc[2]


# --- alerts, pending, hourly aggregation -----------------------------------------------------------


def _alerts_as_of(demo: Demo, cluster: str, at: datetime) -> dict[tuple[str, str], str]:
    """Each alert's state at ``at``, from every row of the alerts table, in Python."""
    latest: dict[tuple[str, str], tuple[datetime, str, str]] = {}
    for alert, entity, state, when, event in demo.sql(
        "SELECT alert, entity, state, event_time, event_id FROM alerts FINAL "
        "WHERE cluster = {c:String} AND event_time <= {at:DateTime64(3, 'UTC')}",
        c=cluster,
        at=at,
    ):
        if (alert, entity) not in latest or (when, event) > latest[(alert, entity)][:2]:
            latest[(alert, entity)] = (when, event, state)
    return {key: state for key, (_, _, state) in latest.items()}


def test_alerts_as_of_an_instant_are_each_alerts_newest_state_then(demo: Demo) -> None:
    rows = duty_rows(demo)
    at = min(r[1] for r in rows) + (max(r[1] for r in rows) - min(r[1] for r in rows)) / 2
    expected = _alerts_as_of(demo, GEN, at)
    assert "OPENED" in expected.values(), "idle GPUs half way through the slice"
    body = demo.get("/api/alerts", cluster=GEN, pageSize=1000, asOf=rfc3339(at))
    assert {(a["alert"], a["entity"]): a["state"] for a in body["data"]} == expected
    assert body["total"] == len(expected)
    open_now = demo.get(
        "/api/alerts", cluster=GEN, pageSize=1000, asOf=rfc3339(at), state="open", alert="GpuIdle"
    )
    assert {(a["alert"], a["entity"]) for a in open_now["data"]} == {
        key for key, state in expected.items() if state == "OPENED" and key[0] == "GpuIdle"
    }


def test_pending_pods_with_reason_age_and_free_gpus_when_they_waited(demo: Demo) -> None:
    alerts = demo.sql(
        "SELECT pod_uid, event_time, labels FROM alerts FINAL WHERE cluster = {c:String} "
        "AND alert = 'GpuPodPending' AND state = 'OPENED' ORDER BY event_time, pod_uid LIMIT 1",
        c=ALI,
    )
    assert alerts, "the slice has pods pending long enough to alert"
    alerted, opened, labels = alerts[0]
    at = utc(opened) + timedelta(milliseconds=1)
    state: dict[str, tuple] = {}
    for uid, version, node, phase, kind, gpus, created in demo.sql(
        "SELECT uid, version, node, phase, type, gpu_amount, creation_time FROM pod_events "
        "WHERE cluster = {c:String} AND event_time <= {at:DateTime64(3, 'UTC')}",
        c=ALI,
        at=at,
    ):
        if uid not in state or version > state[uid][0]:
            state[uid] = (version, node, phase, kind, gpus, utc(created))
    waiting = {
        uid: s[5]
        for uid, s in state.items()
        if s[1] is None and s[2] == "Pending" and s[3] != "DELETED" and s[4] > 0
    }
    body = demo.get("/api/pending", cluster=ALI, asOf=rfc3339(at))
    assert {p["uid"]: instant(p["created"]) for p in body["data"]} == waiting
    for pending in body["data"]:
        assert pending["age_s"] == pytest.approx((at - waiting[pending["uid"]]).total_seconds())
    shown = next(p for p in body["data"] if p["uid"] == alerted)
    assert shown["free_gpus"] == {
        key.removeprefix("free_gpus."): float(value)
        for key, value in labels.items()
        if key.startswith("free_gpus.")
    }
    assert shown["reason"] == (labels.get("reason") or shown["reason"])


def test_hourly_aggregation_per_workload_and_namespace_equals_the_csv(demo: Demo) -> None:
    rows = duty_rows(demo)
    per_pod: dict[tuple[datetime, str], list[float]] = defaultdict(list)
    per_hour: dict[datetime, list[float]] = defaultdict(list)
    for pod, at, value in rows:
        per_pod[(bucket(at, 3600), genai_duty.pod_uid(GEN, pod))].append(value)
        per_hour[bucket(at, 3600)].append(value)
    by_workload = demo.get("/api/gpu-aggregation/hourly", cluster=GEN, groupBy="workload")["data"]
    got = {(instant(r["hour"]), r["group_key"]): r for r in by_workload}
    assert {key for key, r in got.items() if r["samples"]} == per_pod.keys()
    for key, values in per_pod.items():
        assert got[key]["samples"] == len(values), key
        assert got[key]["utilization_avg"] == pytest.approx(sum(values) / len(values)), key
    held = demo.sql(
        "SELECT toStartOfHour(window_start), workload_uid, sum(gpus_allocated_avg * "
        "dateDiff('second', window_start, window_end)) / 3600 FROM workload_gpu_usage FINAL "
        "WHERE cluster = {c:String} GROUP BY 1, 2",
        c=GEN,
    )
    for hour, uid, gpu_hours in held:
        assert got[(utc(hour), uid)]["gpu_hours"] == pytest.approx(gpu_hours), (hour, uid)
    by_namespace = demo.get("/api/gpu-aggregation/hourly", cluster=GEN, groupBy="namespace")["data"]
    assert {instant(r["hour"]): (r["group_key"], r["samples"]) for r in by_namespace} == {
        hour: ("genai", len(values)) for hour, values in per_hour.items()
    }
    for row in by_namespace:
        values = sorted(per_hour[instant(row["hour"])])
        assert row["utilization_avg"] == pytest.approx(sum(values) / len(values))
        assert values[0] <= row["utilization_p50"] <= row["utilization_p95"] <= values[-1]
    by_label = demo.get("/api/gpu-aggregation/hourly", cluster=GEN, groupBy="label:app")["data"]
    assert {(instant(r["hour"]), r["group_key"], r["samples"]) for r in by_label} == {
        (hour, "stable-diffusion-serving", len(values)) for hour, values in per_hour.items()
    }


def test_idle_gpu_hours_by_owner_and_kind_are_the_csv_duty_cycles(demo: Demo) -> None:
    expected = {
        (datetime.fromtimestamp(hour, UTC), genai_duty.pod_uid(GEN, pod)): hours
        for (pod, hour), hours in genai_hours(demo.duty_csv, idle_below=5.0, valid_s=300).items()
    }
    body = demo.get(f"/api/clusters/{GEN}/idleByOwner", groupBy="workload")
    got = {(instant(r["hour"]), r["group_key"]): r for r in body["data"]}
    assert got.keys() == expected.keys()
    for key, hours in expected.items():
        row = got[key]
        assert (row["active_gpu_hours"], row["idle_gpu_hours"], row["unmeasured_gpu_hours"]) == pytest.approx(
            (hours["active"], hours["idle"], hours["unmeasured"]), abs=1e-9
        ), key
        assert (row["memory_idle_gpu_hours"], row["workloads"]) == (0, 1)
        assert row["held_gpu_hours"] == pytest.approx(sum(hours.values()))
    assert body["unallocated"] == [], "each GenAI GPU is held from the instant it is known"

    per_hour: dict[datetime, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for (hour, _), hours in expected.items():
        for i, kind in enumerate(("active", "idle", "unmeasured")):
            per_hour[hour][i] += hours[kind]
    for group_by, key in (("namespace", "genai"), ("label:app", "stable-diffusion-serving")):
        rows = demo.get(f"/api/clusters/{GEN}/idleByOwner", groupBy=group_by)["data"]
        assert {
            (instant(r["hour"]), r["group_key"]): (
                r["active_gpu_hours"],
                r["idle_gpu_hours"],
                r["unmeasured_gpu_hours"],
            )
            for r in rows
        } == {(hour, key): pytest.approx(tuple(sums)) for hour, sums in per_hour.items()}, group_by
    second = sorted(per_hour)[1]
    one = demo.get(
        f"/api/clusters/{GEN}/idleByOwner", groupBy="namespace", start=rfc3339(second),
        end=rfc3339(second + timedelta(hours=1)),
    )["data"]  # fmt: skip
    assert [instant(r["hour"]) for r in one] == [second]


def test_idle_gpu_hours_of_pods_with_no_devices_known_are_the_gpus_they_held(demo: Demo) -> None:
    """The Alibaba slice is replayed without devices: its GPU-hours held are all unmeasured, and
    per hour they are what cluster_gpu_allocation says was held."""
    held = demo.sql(
        "SELECT window_start, gpus_allocated_avg FROM cluster_gpu_allocation FINAL "
        "WHERE cluster = {c:String} AND gpus_allocated_avg > 0",
        c=ALI,
    )
    body = demo.get(f"/api/clusters/{ALI}/idleByOwner", groupBy="namespace")
    got = {instant(r["hour"]): r for r in body["data"]}
    assert got.keys() == {utc(start) for start, _ in held}
    for start, gpus in held:
        assert got[utc(start)]["unmeasured_gpu_hours"] == pytest.approx(gpus), start
        assert got[utc(start)]["held_gpu_hours"] == pytest.approx(gpus), start
    assert body["unallocated"] == [], "no agent reported GPUs: nothing is known unallocated"


# --- the contract: parameters, token, read-only ----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "named"),
    [
        ("/api/nodes", {}, "cluster"),
        ("/api/nodes", {"cluster": ALI, "pageSize": 0}, "pageSize"),
        ("/api/nodes", {"cluster": ALI, "pageSize": 100_000}, "pageSize"),
        ("/api/nodes", {"cluster": ALI, "pageNum": "first"}, "pageNum"),
        ("/api/clusters", {"asOf": "yesterday"}, "asOf"),
        (f"/api/clusters/{GEN}/gpuHeatmap", {"step": 0}, "step"),
        (f"/api/clusters/{GEN}/gpuHeatmap", {"step": 1, "start": "2022-01-01T00:00:00Z"}, "step"),
        ("/api/workloads", {"cluster": GEN, "status": "Sleeping"}, "status"),
        ("/api/alerts", {"cluster": GEN, "state": "maybe"}, "state"),
        ("/api/gpu-aggregation/hourly", {"cluster": GEN, "groupBy": "colour"}, "groupBy"),
        (f"/api/clusters/{GEN}/idleByOwner", {"groupBy": "team"}, "groupBy"),
        ("/api/gpu-aggregation/hourly", {"cluster": GEN, "start": "2024-01-02", "end": "2024-01-01"}, "end"),
    ],
)
def test_a_bad_parameter_is_a_400_that_names_it(demo: Demo, path: str, params: dict, named: str) -> None:
    response = demo.http.get(path, params=params)
    assert response.status_code == 400, response.text
    body = response.json()
    assert named in body["error"] and [p["name"] for p in body["parameters"]] == [named], body


def test_the_token_is_required_where_configured_and_openapi_lists_every_route(demo: Demo) -> None:
    refused = httpx.get(f"{demo.base}/api/clusters")
    assert refused.status_code == 401 and "token" in refused.json()["error"]
    wrong = httpx.get(f"{demo.base}/api/clusters", headers={"Authorization": "Bearer guess"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{demo.base}/healthz").status_code == 200
    document = httpx.get(f"{demo.base}/openapi.json").json()
    paths = set(document["paths"])
    responses = document["paths"]["/api/nodes"]["get"]["responses"]
    assert {"200", "400", "401"} <= responses.keys() and "422" not in responses, responses
    assert responses["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Paged_Node_"
    }
    assert {
        "/api/clusters",
        "/api/clusters/{cluster}/overview",
        "/api/clusters/{cluster}/consumers",
        "/api/clusters/{cluster}/gpuHeatmap",
        "/api/clusters/{cluster}/idleWorkloads",
        "/api/clusters/{cluster}/idleByOwner",
        "/api/nodes",
        "/api/nodes/{name}",
        "/api/nodes/{name}/gpuDevices",
        "/api/nodes/{name}/gpuMetrics",
        "/api/nodes/{name}/workloads",
        "/api/nodes/{name}/workloadsHistory",
        "/api/nodes/{name}/gpuAllocation",
        "/api/nodes/{name}/gpuUtilizationHistory",
        "/api/workloads",
        "/api/workloads/{uid}",
        "/api/workloads/{uid}/hierarchy",
        "/api/workloads/{uid}/metrics",
        "/api/workloads/{uid}/pods",
        "/api/alerts",
        "/api/pending",
        "/api/gpu-aggregation/hourly",
    } <= paths
    assert httpx.get(f"{demo.base}/").status_code == 200, "the console's mount point serves its index"


def test_the_reader_runs_every_statement_read_only(demo: Demo) -> None:
    reader = open_reader(demo.settings.clickhouse, timeout_s=10)
    try:
        assert reader.rows("SELECT getSetting('readonly') AS level", {}) == [{"level": READ_ONLY}]
        with pytest.raises(ClickHouseError) as refused:
            reader.rows("CREATE TABLE api_write_probe (id UInt8) ENGINE = Memory", {})
        assert refused.value.code == 164, refused.value  # READONLY
    finally:
        reader.close()
    assert demo.sql("EXISTS TABLE api_write_probe") == [(0,)]
    # what that level refuses: every write and every DDL, with ClickHouse's READONLY
    writer = get_client(demo.settings.clickhouse, database="default")
    client = get_client(demo.settings.clickhouse, database="default", query_settings={"readonly": READ_ONLY})
    try:
        writer.command("CREATE TABLE api_write_target (id UInt8) ENGINE = MergeTree ORDER BY id")
        for statement in (
            "CREATE TABLE api_write_probe (id UInt8) ENGINE = Memory",
            "INSERT INTO api_write_target VALUES (1)",
            "INSERT INTO api_write_target SELECT 2",
            "ALTER TABLE api_write_target DELETE WHERE 1",
            "DROP TABLE api_write_target",
        ):
            with pytest.raises(DatabaseError) as refused:
                client.command(statement)
            assert "READONLY" in str(refused.value), statement
        assert writer.command("SELECT count() FROM api_write_target") == 0
    finally:
        writer.command("DROP TABLE IF EXISTS api_write_target")
        client.close()
        writer.close()


def test_a_taken_port_is_one_clear_error_and_sigterm_stops_the_api(demo: Demo, spawned) -> None:
    taken = subprocess.run(gpulens(demo.config, "api"), capture_output=True, text=True, timeout=60)
    assert taken.returncode == 1 and "is the port taken" in taken.stderr, taken.stderr
    port = free_port()
    api = subprocess.Popen(gpulens(demo.config, "api", "--port", str(port)), stderr=subprocess.DEVNULL)
    spawned.append(api)
    wait_answering(f"http://127.0.0.1:{port}", api)
    api.terminate()
    assert api.wait(30) == 0
