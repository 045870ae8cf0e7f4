"""The GenAI duty-cycle replay: one one-GPU pod per container, one sample per CSV row."""

from __future__ import annotations

import csv
from collections import Counter

from gpulens.producers.replay import genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import (
    ContainerEvent,
    DeviceInventory,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
    Watermark,
)

SAMPLES = traces_dir() / "alibaba-genai-2026" / "pod_gpu_duty_cycle_48pods.csv"


def test_every_row_becomes_a_sample_of_its_pods_gpu() -> None:
    with SAMPLES.open() as handle:
        rows = list(csv.DictReader(handle))
    events = [event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="g")]
    batches = [e for e in events if isinstance(e, GpuSampleBatch)]
    assert len(batches) == len(rows)
    expected = Counter((r["container_ip"], float(r["timestamp_anon"]), float(r["value"])) for r in rows)
    by_gpu = {genai_duty.gpu_id(ip): ip for ip in {r["container_ip"] for r in rows}}
    published = Counter(
        (by_gpu[b.samples[0].device_id], b.event_time.timestamp(), b.samples[0].utilization_pct)
        for b in batches
    )
    assert published == expected
    assert [b.event_time for b in batches] == sorted(b.event_time for b in batches)


def test_each_container_is_a_one_gpu_pod_on_its_own_node_before_its_first_sample() -> None:
    events = [event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="g")]
    pods = [e for e in events if isinstance(e, PodEvent)]
    assert len(pods) == 48
    assert all(p.gpu_amount == 1.0 and p.holds_gpus for p in pods)
    assert len({p.node for p in pods}) == 48
    assert sum(isinstance(e, NodeEvent) for e in events) == 48
    assert sum(isinstance(e, DeviceInventory) for e in events) == 48
    containers = [e for e in events if isinstance(e, ContainerEvent)]
    assert {c.pod_uid for c in containers} == {p.uid for p in pods}
    first_sample = {}
    for index, event in enumerate(events):
        if isinstance(event, GpuSampleBatch):
            first_sample.setdefault(event.node, index)
    pod_index = {p.node: events.index(p) for p in pods}
    assert all(pod_index[node] < first_sample[node] for node in first_sample)


def test_the_replay_ends_with_a_final_watermark_at_the_last_sample() -> None:
    events = [event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="g")]
    last = events[-1]
    assert isinstance(last, Watermark)
    assert last.final
    assert last.event_time == max(e.event_time for e in events if isinstance(e, GpuSampleBatch))
