"""Per-workload reports (`gpulens report workload`, /api/workloads/{uid}/report) on the session's
replayed demo data (tests/api_demo.py): every number equals the same quantity computed straight
from the trace slices' CSVs, by the report's definitions (README, "Per-workload reports").

GenAI duty cycles: one-GPU pods held from their first sample until the slice's last instant
(the cluster's newest event), sampled about once a minute. Alibaba v2023: pods pending from
creation to scheduling (or to deletion, when never scheduled), holding their GPUs (shares as
fractions) from scheduling to deletion, without samples.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from api_demo import ALI, GEN, Demo, gpulens
from sink_support import SinkThread

from gpulens.api.workload_report import IDLE_BELOW, SPAN_MAX_S
from gpulens.producers.replay import alibaba_v2023, genai_duty
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    ContainerState,
    DeviceAssignment,
    DeviceKind,
    GpuSample,
    GpuSampleBatch,
    OwnerReference,
    PodCondition,
    PodEvent,
)
from gpulens.schemas.model.topics import CONTAINERS, GPU_SAMPLES, PODS


@dataclass(frozen=True)
class Expected:
    gpu_hours: float
    pending_s: float
    first_to_last_s: float
    samples: int = 0
    utilization_avg: float | None = None
    utilization_p95: float | None = None
    measured_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    failed: bool = False


def genai_expected(duty_csv: Path) -> dict[str, Expected]:
    """Per pod of the GenAI slice (by its uid in the replay), from the CSV alone."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with duty_csv.open() as handle:
        for row in csv.DictReader(handle):
            series[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    now = max(at for samples in series.values() for at, _ in samples)
    expected = {}
    for pod, samples in series.items():
        samples.sort()
        times, values = [at for at, _ in samples], [value for _, value in samples]
        measured = idle = 0.0
        for i, (at, value) in enumerate(samples):
            ends = min(times[i + 1] if i + 1 < len(times) else now, at + SPAN_MAX_S, now)
            measured += ends - at
            idle += (ends - at) if value < IDLE_BELOW else 0.0
        expected[genai_duty.pod_uid(GEN, pod)] = Expected(
            gpu_hours=(now - times[0]) / 3600,
            pending_s=0.0,
            first_to_last_s=times[-1] - times[0],
            samples=len(values),
            utilization_avg=statistics.fmean(values),
            utilization_p95=statistics.quantiles(values, n=20, method="inclusive")[18],
            measured_gpu_hours=measured / 3600,
            idle_gpu_hours=idle / 3600,
        )
    return expected


def alibaba_expected(pods_csv: Path) -> dict[str, Expected]:
    """Per GPU pod of the Alibaba slice (by its uid in the replay), from the CSV alone."""
    expected = {}
    with pods_csv.open() as handle:
        for row in csv.DictReader(handle):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            amount = milli / 1000 if gpus == 1 and milli < 1000 else float(gpus)
            if amount == 0:
                continue
            created, deleted = int(row["creation_time"]), int(row["deletion_time"])
            scheduled = int(row["scheduled_time"]) if row["scheduled_time"] else None
            expected[alibaba_v2023.pod_uid(ALI, row["name"])] = Expected(
                gpu_hours=0.0 if scheduled is None else amount * (deleted - scheduled) / 3600,
                pending_s=(deleted if scheduled is None else scheduled) - created,
                first_to_last_s=deleted - created,
                failed=row["pod_phase"] == "Failed",
            )
    return expected


def assert_report(got: dict[str, Any], want: Expected) -> None:
    seen = datetime.fromisoformat(got["last_seen"]) - datetime.fromisoformat(got["first_seen"])
    assert seen.total_seconds() == pytest.approx(want.first_to_last_s)
    assert got["gpu_hours"] == pytest.approx(want.gpu_hours, abs=1e-9)
    assert got["pending_s"] == pytest.approx(want.pending_s, abs=1e-6)
    assert got["samples"] == want.samples
    assert got["utilization_avg"] == pytest.approx(want.utilization_avg)
    assert got["utilization_p95"] == pytest.approx(want.utilization_p95)
    assert got["measured_gpu_hours"] == pytest.approx(want.measured_gpu_hours, abs=1e-9)
    assert got["idle_gpu_hours"] == pytest.approx(want.idle_gpu_hours, abs=1e-9)
    assert got["pods_failed"] == int(want.failed)
    assert (got["pods"], got["restarts"], got["pods_disrupted"], got["energy_j"]) == (1, 0, 0, None)


def test_genai_reports_equal_the_duty_cycle_csv(demo: Demo) -> None:
    expected = genai_expected(demo.duty_csv)
    assert len(expected) == 41
    idle_pods = 0
    for uid, want in expected.items():
        got = demo.get(f"/api/workloads/{uid}/report", cluster=GEN)
        assert_report(got, want)
        assert (got["kind"], got["status"], got["namespace"]) == ("Pod", "Running", "genai")
        [gpu] = got["gpu_list"]
        assert (gpu["samples"], gpu["utilization_p95"]) == (want.samples, pytest.approx(want.utilization_p95))
        assert gpu["idle_gpu_hours"] == pytest.approx(want.idle_gpu_hours, abs=1e-9)
        idle_pods += want.idle_gpu_hours > 0
    assert idle_pods > 10  # the slice has idle stretches: the idle numbers are not all zero


def test_alibaba_reports_equal_the_pod_list_csv(demo: Demo) -> None:
    expected = alibaba_expected(demo.duty_csv.parent / "pods.csv")
    assert len(expected) == 84
    assert any(w.pending_s > 0 and w.gpu_hours > 0 for w in expected.values())  # waited, then ran
    assert any(w.gpu_hours == 0 and w.pending_s > 0 for w in expected.values())  # never scheduled
    assert any(w.failed for w in expected.values())
    for uid, want in expected.items():
        got = demo.get(f"/api/workloads/{uid}/report", cluster=ALI)
        assert_report(got, want)
        assert got["status"] == ("Failed" if want.failed else "Done")
        assert got["gpu_list"] == []


def test_a_stricter_idle_threshold_counts_more_idle_time(demo: Demo) -> None:
    uid = next(iter(genai_expected(demo.duty_csv)))
    loose = demo.get(f"/api/workloads/{uid}/report", cluster=GEN, idleBelow=50)
    strict = demo.get(f"/api/workloads/{uid}/report", cluster=GEN, idleBelow=0)
    assert strict["idle_gpu_hours"] == 0
    assert loose["idle_gpu_hours"] >= demo.get(f"/api/workloads/{uid}/report", cluster=GEN)["idle_gpu_hours"]
    assert loose["idle_below"] == 50


def test_unknown_workload_is_404(demo: Demo) -> None:
    response = demo.http.get("/api/workloads/no-such-uid/report", params={"cluster": GEN})
    assert response.status_code == 404
    assert "no workload 'no-such-uid'" in response.json()["error"]


def report_cli(demo: Demo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpulens(demo.config, "report", "workload", *args), capture_output=True, text=True, timeout=120
    )


def test_cli_prints_the_report_as_json_and_text(demo: Demo) -> None:
    expected = genai_expected(demo.duty_csv)
    uid = max(expected, key=lambda u: expected[u].idle_gpu_hours)
    want = expected[uid]
    done = report_cli(demo, uid, "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert_report(got, want)
    assert got["cluster"] == GEN  # found without --cluster: the uid is in one cluster only

    text = report_cli(demo, uid, "--cluster", GEN)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert f"uid {uid}  cluster {GEN}" in lines[0]
    summary = {line[:12].strip(): line[13:] for line in lines if line[:1].isupper() and line[12:13] == " "}
    assert summary["GPU-hours"].startswith(
        f"{want.gpu_hours:.3f} held, {want.measured_gpu_hours:.3f} measured"
    )
    assert summary["Utilization"].startswith(
        f"mean {want.utilization_avg:.1f} %, p95 {want.utilization_p95:.1f} %  ({want.samples} samples)"
    )
    assert summary["Idle held"].startswith(f"{want.idle_gpu_hours:.3f} GPU-hours under 5 %")
    assert summary["Pending"] == "0 s"
    assert summary["Energy"] == "n/a (no sample carries power)"


def test_cli_unknown_uid_is_one_line_and_exit_1(demo: Demo) -> None:
    done = report_cli(demo, "no-such-uid")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: no workload 'no-such-uid' in any cluster of database {demo.settings.clickhouse.database}"
    ]
    in_cluster = report_cli(demo, "no-such-uid", "--cluster", ALI)
    assert (in_cluster.returncode, in_cluster.stderr.splitlines()) == (
        1,
        [f"error: no workload 'no-such-uid' in cluster '{ALI}'"],
    )


# --- a workload of two pods, through the real sink: shares, power, restarts, interruptions ------

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = OwnerReference(kind="PyTorchJob", api_version="kubeflow.org/v1", name="train", uid="job-1")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pod(
    uid: str, name: str, when: float, kind: ChangeType, phase: str, node: str | None, **fields: Any
) -> PodEvent:
    return PodEvent(
        event_id=f"{uid}-{when}-{kind}",
        cluster="c1",
        event_time=at(when),
        source="test",
        type=kind,
        uid=uid,
        namespace="ml",
        name=name,
        phase=phase,
        node=node,
        owners=[OWNER],
        creation_time=T0,
        **fields,
    )


def container(pod_name: str, node: str, devices: list[str]) -> ContainerEvent:
    return ContainerEvent(
        event_id=f"{pod_name}-container",
        cluster="c1",
        event_time=T0,
        source="test",
        type=ChangeType.ADDED,
        node=node,
        pod_namespace="ml",
        pod_name=pod_name,
        container_name="main",
        devices=[
            DeviceAssignment(resource_name="nvidia.com/gpu", device_id=d, kind=DeviceKind.GPU)
            for d in devices
        ],
    )


def samples(
    node: str, device: str, rows: list[tuple[float, float | None, float | None]]
) -> list[GpuSampleBatch]:
    return [
        GpuSampleBatch(
            event_id=f"{device}-{when}",
            cluster="c1",
            event_time=at(when),
            source="test",
            node=node,
            samples=[GpuSample(device_id=device, index=0, utilization_pct=util, power_watts=power)],
        )
        for when, util, power in rows
    ]


def two_pods() -> tuple[list[PodEvent], list[ContainerEvent], list[GpuSampleBatch]]:
    """train-0: pending 60 s, then 2 GPUs of n1 until it fails at 1200 s (OOMKilled, 2 restarts),
        deleted at 1300 s. train-1: half a GPU of n2 from 0 s until preempted at 500 s. An unrelated
        pod at 5000 s is the cluster's newest event. A pod of a workload with the same uid in cluster c2
    makes the uid ambiguous without --cluster."""
    running = ContainerState(name="main", gpu_amount=2, state="running")
    whole = {"gpu_resources": {"nvidia.com/gpu": 2.0}, "gpu_amount": 2.0}
    oom = ContainerState(
        name="main", gpu_amount=2, state="terminated", reason="OOMKilled", restart_count=2, exit_code=137
    )
    preempted = PodCondition(type="DisruptionTarget", status="True", reason="PreemptionByScheduler")
    share = {"gpu_resources": {"alibabacloud.com/gpu-milli": 500.0}, "gpu_amount": 0.5}
    added, modified, deleted = ChangeType.ADDED, ChangeType.MODIFIED, ChangeType.DELETED
    restarted = [running.model_copy(update={"restart_count": 2})]
    pods = [
        pod("pa", "train-0", 0, added, "Pending", None, containers=[running], **whole),
        pod("pa", "train-0", 60, modified, "Running", "n1", containers=[running], **whole),
        pod("pa", "train-0", 600, modified, "Running", "n1", containers=restarted, **whole),
        pod("pa", "train-0", 1200, modified, "Failed", "n1", containers=[oom], **whole),
        pod("pa", "train-0", 1300, deleted, "Failed", "n1", containers=[oom], **whole),
        pod("pb", "train-1", 0, added, "Running", "n2", **share),
        pod("pb", "train-1", 500, modified, "Failed", "n2", conditions=[preempted], **share),
        pod("other", "other", 5000, added, "Pending", None, **share).model_copy(update={"owners": []}),
        pod("pc", "train-0", 0, added, "Pending", None, **share).model_copy(update={"cluster": "c2"}),
    ]
    containers = [container("train-0", "n1", ["g0", "g1"]), container("train-1", "n2", ["g9"])]
    batches = [
        *samples("n1", "g0", [(30, 10, 50), (100, 50, 200), (400, 0, 100), (1000, 2, 80), (1190, 90, 300)]),
        *samples("n1", "g1", [(100, None, 150), (200, 3, None)]),
        *samples("n2", "g9", [(0, 4, 100), (250, 80, 200)]),
    ]
    return pods, containers, batches


def test_a_two_pod_workload_through_the_sink(platform, codec, unique: str, config_file: Path) -> None:
    """Worked by hand from the events (spans: to the next sample, 300 s at most, inside the hold):
    g0 (share 1): 40 s at 10 %, 300 s at 50 %, 300 s at 0 %, 190 s at 2 %, 10 s at 90 %;
    g1 (share 1): 100 s without utilization (150 W), 300 s at 3 %; g9 (share 0.5): 250 s at 4 %
    and 250 s at 80 %. Samples taken inside the holds: 50, 0, 2, 90, 3, 4, 80 %."""
    pods, containers, batches = two_pods()
    sink = SinkThread(platform, codec, unique).start()
    try:
        sink.publish(PODS, pods)
        sink.publish(CONTAINERS, containers)
        sink.publish(GPU_SAMPLES, batches)
        sink.wait_rows("pod_events", len(pods))
        sink.wait_rows("container_events", len(containers))
        sink.wait_rows("gpu_samples", len(batches))
        sink.wait_rows("workload_pods", 3)
    finally:
        sink.stop()
    env = {**os.environ, "GPULENS_CLICKHOUSE__DATABASE": sink.clickhouse.database}
    command = [sys.executable, "-m", "gpulens", "--config", str(config_file), "report", "workload", "job-1"]
    ambiguous = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert (ambiguous.returncode, ambiguous.stderr.splitlines()) == (
        1,
        ["error: workload 'job-1' is in clusters c1, c2: choose with --cluster"],
    )
    done = subprocess.run(
        [*command, "--cluster", "c1", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["kind"], got["name"], got["namespace"], got["status"]) == (
        "PyTorchJob",
        "train",
        "ml",
        "Failed",
    )
    assert got["gpu_hours"] == pytest.approx((2 * 1140 + 0.5 * 500) / 3600)
    assert got["pending_s"] == 60
    assert got["measured_gpu_hours"] == pytest.approx((40 + 300 + 300 + 190 + 10 + 300 + 0.5 * 500) / 3600)
    assert got["idle_gpu_hours"] == pytest.approx((300 + 190 + 300 + 0.5 * 250) / 3600)
    inside = [50, 0, 2, 90, 3, 4, 80]
    assert (got["samples"], got["utilization_avg"]) == (7, pytest.approx(statistics.fmean(inside)))
    assert got["utilization_p95"] == pytest.approx(statistics.quantiles(inside, n=20, method="inclusive")[18])
    g0 = 50 * 40 + 200 * 300 + 100 * 300 + 80 * 190 + 300 * 10
    joules = g0 + 150 * 100 + 0.5 * (100 * 250 + 200 * 250)
    assert got["energy_j"] == pytest.approx(joules)
    counts = ("pods", "pods_failed", "pods_disrupted", "restarts", "container_exits")
    assert [got[name] for name in counts] == [2, 2, 1, 2, 1]
    assert (got["first_seen"], got["last_seen"]) == ("2026-01-01T00:00:00Z", "2026-01-01T00:21:40Z")
    by_pod = {p["name"]: p for p in got["pod_list"]}
    assert by_pod["train-0"]["exits"] == [{"container": "main", "reason": "OOMKilled", "exit_code": 137}]
    assert by_pod["train-1"]["disruptions"] == ["PreemptionByScheduler"]
    assert {(g["device_id"], g["samples"]) for g in got["gpu_list"]} == {("g0", 4), ("g1", 1), ("g9", 2)}

    text = subprocess.run([*command, "--cluster", "c1"], capture_output=True, text=True, timeout=120, env=env)
    assert text.returncode == 0, text.stderr
    assert "Energy       0.045 kWh (162,700 J)" in text.stdout.splitlines()
    assert {"main exited 137 OOMKilled", "PreemptionByScheduler"} <= {
        line.split("  ")[-1].strip() for line in text.stdout.splitlines() if line.startswith("train-")
    }
    waiting = subprocess.run(
        [*command, "--cluster", "c2", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert json.loads(waiting.stdout)["status"] == "Pending"
