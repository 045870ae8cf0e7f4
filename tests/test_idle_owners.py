"""Idle GPU-hours by owner: each GPU's hours per window and owner, split by kind, against the traces."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alert_oracle import SAMPLES
from idle_oracle import HOUR, genai_hours
from trace_slices import pods_between

from gpulens.pipeline.idle_owners import IdleOwners, IdleRules
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.replay import alibaba_v2023, genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceAssignment,
    DeviceInventory,
    DeviceKind,
    Event,
    GpuDevice,
    GpuSample,
    GpuSampleBatch,
    IdleGpuHours,
    PodEvent,
    Watermark,
)

ALIBABA = traces_dir() / "alibaba-gpu-v2023"
DAY = 86_400
GIB = 1 << 30
RULES = IdleRules(idle_below=5.0, compute_idle_below=1.0, memory_floor_bytes=GIB, sample_valid_ms=300_000)
KINDS = ("active", "idle", "memory_idle", "unmeasured", "unallocated")


def hours_of(row: IdleGpuHours) -> dict[str, float]:
    return {kind: getattr(row, f"{kind}_gpu_hours") for kind in KINDS}


def run(events: Iterable[Event], *, rules: IdleRules = RULES, window_s: int = HOUR) -> list[IdleGpuHours]:
    owners = IdleOwners(TumblingWindows(window_s * 1000), rules)
    rows: list[IdleGpuHours] = []
    for event in events:
        rows += owners.process(event)
    return rows


def test_genai_active_idle_and_unmeasured_hours_equal_the_csv() -> None:
    rows = run(event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai"))
    expected = genai_hours(SAMPLES, idle_below=RULES.idle_below, valid_s=RULES.sample_valid_ms / 1000)
    pod_of = {genai_duty.pod_uid("genai", pod): pod for pod, _ in expected}
    assert all(row.workload_uid in pod_of for row in rows), "every GPU is held from its first sample on"
    got = {(pod_of[r.workload_uid], int(r.window_start.timestamp())): hours_of(r) for r in rows}
    assert got.keys() == expected.keys()
    for key, hours in expected.items():
        assert got[key] == pytest.approx({**hours, "memory_idle": 0.0, "unallocated": 0.0}, abs=1e-9), key
    assert {r.device_id for r in rows} == {genai_duty.gpu_id(pod) for pod in pod_of.values()}
    totals = {kind: sum(h[kind] for h in expected.values()) for kind in ("active", "idle", "unmeasured")}
    assert min(totals.values()) > 1, f"every kind occurs: {totals}"


def test_gpushare_shares_add_up_to_each_gpu_every_hour(tmp_path: Path) -> None:
    pods_csv = pods_between(
        ALIBABA / "openb_pod_list_gpushare100.csv", 143 * DAY, 143 * DAY + DAY // 4, tmp_path / "pods.csv",
        gone_within_s=DAY // 2,
    )  # fmt: skip
    nodes = alibaba_v2023.read_nodes(ALIBABA / "openb_node_list_gpu_node.csv")
    epoch = datetime(2023, 1, 1, tzinfo=UTC)
    plan = alibaba_v2023.plan(
        nodes, alibaba_v2023.read_pods(pods_csv), cluster="c", epoch=epoch, devices=True
    )
    rows = run(event for _, event in plan)

    per_gpu: dict[tuple[str, datetime], float] = defaultdict(float)
    holders: dict[tuple[str, datetime], set[str]] = defaultdict(set)
    held: dict[tuple[str, int], float] = defaultdict(float)
    for row in rows:
        key = (row.device_id, row.window_start)
        per_gpu[key] += sum(hours_of(row).values())
        if row.workload_uid:
            holders[key].add(row.workload_uid)
            hour = int((row.window_start - epoch).total_seconds())
            held[(row.workload_uid, hour)] += row.unmeasured_gpu_hours  # no samples: held is unmeasured
        assert (row.active_gpu_hours, row.idle_gpu_hours, row.memory_idle_gpu_hours) == (0, 0, 0)
    windows = {row.window_start for row in rows}
    gpus = {alibaba_v2023.gpu_id(node.name, i) for node in nodes for i in range(node.gpus)}
    assert len(gpus) == 6212
    assert per_gpu.keys() == {(gpu, start) for gpu in gpus for start in windows}
    assert per_gpu == pytest.approx(dict.fromkeys(per_gpu, 1.0), abs=1e-9), (
        "holders + unallocated = 1 GPU-hour"
    )
    assert sum(len(h) > 1 for h in holders.values()) > 50, "many GPU-hours are shared by several pods"

    # each pod's share, from the CSV: its fraction of a GPU over [scheduled, deleted) in each hour
    expected: dict[tuple[str, int], float] = defaultdict(float)
    with pods_csv.open() as handle:
        for pod in csv.DictReader(handle):
            if int(pod["num_gpu"]) and pod["scheduled_time"]:
                amount = int(pod["gpu_milli"]) / 1000 if int(pod["num_gpu"]) == 1 else int(pod["num_gpu"])
                start, end = int(pod["scheduled_time"]), int(pod["deletion_time"])
                for hour in range(start // HOUR * HOUR, end, HOUR):
                    overlap = min(end, hour + HOUR) - max(start, hour)
                    if overlap > 0:
                        expected[(alibaba_v2023.pod_uid("c", pod["name"]), hour)] += amount * overlap / HOUR
    assert held == pytest.approx(expected, abs=1e-9)


T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODE = "n1"


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _pod(uid: str, amount: float, *, minutes: float = 0, labels: dict[str, str] | None = None) -> PodEvent:
    return PodEvent(
        event_id=f"pod-{uid}-{minutes}", cluster="c", event_time=_at(minutes), source="test",
        type=ChangeType.ADDED if amount else ChangeType.DELETED, uid=uid, namespace="team-a", name=uid,
        node=NODE, phase="Running", gpu_amount=amount or 1.0, creation_time=T0, labels=labels or {},
    )  # fmt: skip


def _container(uid: str, *gpus: str, minutes: float = 0) -> ContainerEvent:
    return ContainerEvent(
        event_id=f"container-{uid}-{minutes}", cluster="c", event_time=_at(minutes), source="test",
        type=ChangeType.ADDED, node=NODE, pod_uid=uid, pod_namespace="team-a", pod_name=uid,
        container_name="main",
        devices=[DeviceAssignment(resource_name="nvidia.com/gpu.shared", device_id=g, kind=DeviceKind.GPU)
                 for g in gpus],
    )  # fmt: skip


def _sample(minutes: float, utilization: float, memory_gib: float) -> GpuSampleBatch:
    return GpuSampleBatch(
        event_id=f"samples-{minutes}", cluster="c", event_time=_at(minutes), source="test", node=NODE,
        samples=[GpuSample(device_id="UUID-0", index=0, utilization_pct=utilization,
                           memory_used_bytes=round(memory_gib * GIB))],
    )  # fmt: skip


def _inventory() -> DeviceInventory:
    gpus = [
        GpuDevice(device_id="gpu-0", index=0, vendor="NVIDIA", model="H100", uuid="UUID-0"),
        GpuDevice(device_id="gpu-1", index=1, vendor="NVIDIA", model="H100"),
        GpuDevice(device_id="mig-a", index=2, vendor="NVIDIA", model="H100", parent_device_id="gpu-2",
                  partition="3g.40gb"),
        GpuDevice(device_id="mig-b", index=3, vendor="NVIDIA", model="H100", parent_device_id="gpu-2",
                  partition="1g.10gb"),
        GpuDevice(device_id="gpu-2", index=4, vendor="NVIDIA", model="H100"),
    ]  # fmt: skip
    return DeviceInventory(event_id="inv", cluster="c", event_time=T0, source="test", node=NODE, gpus=gpus)


def _time_sliced_day() -> list[Event]:
    """Two pods time-slice gpu-0 (one GPU each: half of it each), a third holds a MIG instance;
    gpu-0 is busy for 10 minutes, holds 2 GiB doing nothing for 10, then idles with 0.5 GiB
    and is sampled no more after 25 minutes; at 30 minutes the first pod leaves."""
    return [
        _inventory(),
        _container("p1", "UUID-0"), _pod("p1", 1.0, labels={"team": "vision"}),
        _container("p2", "gpu-0"), _pod("p2", 1.0),
        _container("p3", "mig-b"), _pod("p3", 1.0),
        _sample(0, 80, 20), _sample(10, 0, 2), _sample(20, 3, 0.5), _sample(25, 4, 0.5),
        _pod("p1", 0, minutes=30),
        Watermark(event_id="end", cluster="c", event_time=_at(40), source="test", final=True),
    ]  # fmt: skip


def test_kinds_shares_and_mig_instances_by_hand() -> None:
    rows = run(_time_sliced_day(), rules=replace(RULES, sample_valid_ms=600_000, owner_labels=("team",)))
    got = {(r.device_id, r.workload_uid): hours_of(r) for r in rows}

    def hours(**minutes: float) -> dict[str, float]:
        return {kind: minutes.get(kind, 0) / 60 for kind in KINDS}

    # p1: half of gpu-0 for 30 minutes: 10 active, 10 memory-idle, 10 idle
    assert got[("gpu-0", "p1")] == pytest.approx(hours(active=5, memory_idle=5, idle=5))
    # p2: the other half, then the whole GPU from 30: idle until the last sample's 10 minutes
    # run out at 35, unmeasured after, up to the end of the hour
    assert got[("gpu-0", "p2")] == pytest.approx(hours(active=5, memory_idle=5, idle=10, unmeasured=25))
    assert ("gpu-0", "") not in got, "two claims of a whole GPU each: nothing left unallocated"
    assert got[("gpu-1", "")] == pytest.approx(hours(unallocated=60))
    # gpu-2 is split by its MIG instances' compute slices: mig-a 3/4, mig-b 1/4 (held by p3)
    assert got[("mig-a", "")] == pytest.approx(hours(unallocated=45))
    assert got[("mig-b", "p3")] == pytest.approx(hours(unmeasured=15))
    assert ("gpu-2", "") not in got, "a partitioned GPU counts through its instances"
    labels = {r.workload_uid: r.owner_labels for r in rows}
    assert labels == {"p1": {"team": "vision"}, "p2": {}, "p3": {}, "": {}}


def test_a_restored_checkpoint_goes_on_to_the_same_rows() -> None:
    events = _time_sliced_day()
    straight = run(events, window_s=600)
    first = IdleOwners(TumblingWindows(600_000), RULES)
    rows: list[IdleGpuHours] = []
    for event in events[:10]:  # to minute 20: two 10-minute windows closed
        rows += first.process(event)
    saved = {json.dumps(key): json.dumps(first.dump(key)) for key in first.live()}
    second = IdleOwners(TumblingWindows(600_000), RULES)
    for key, value in saved.items():
        second.load(tuple(json.loads(key)), json.loads(value))
    for event in events[10:]:
        rows += second.process(event)
    assert len({r.window_start for r in rows}) == 5, "[0, 50): the final watermark at 40 closes its own"
    assert rows == straight
