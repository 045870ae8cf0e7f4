"""GPU health from the node agent: fixtures of NVML's XID events and amdsmi's RAS counts, through the
real collectors and agent, to gpulens.gpu.health.v1 on a real broker; the gauges that clear; the
gpu_health table and the API's answer from it; GpuUnhealthy through the worker process.

Expected events are written out by hand from the fixtures' story (what happened to which GPU
when), never computed by the code under test.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pynvml
from confluent_kafka import Consumer, TopicPartition
from fastapi.testclient import TestClient
from sink_support import SinkThread
from test_agent_publishing import Clock, make_agent, read_topic
from worker_support import gpulens, spawn

from gpulens.api.app import build_app
from gpulens.api.reading import Reader
from gpulens.api.settings import ApiSettings
from gpulens.producers.agent import AgentMetrics, AgentSettings, build_agent
from gpulens.producers.agent.amd import AmdCollector
from gpulens.producers.agent.nvidia import NvidiaCollector
from gpulens.schemas.model.models import Alert, GpuHealthEvent
from gpulens.schemas.model.topics import ALERTS, GPU_HEALTH, entity_key
from gpulens.testing.fake_amdsmi import (
    MI300X_RAS_BLOCKS,
    MI300X_UMC_UNCORRECTABLE,
    FakeAmdSmi,
    mi300x,
    ras_counts,
)
from gpulens.testing.fake_nvml import XID_INCIDENT, FakeNvml, a100_mig, h100

T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
HEALTHY_H100 = {
    "ecc_volatile_corrected": 0,
    "ecc_volatile_uncorrected": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
}
"""An H100's counters at rest: no retired pages (NOT_SUPPORTED since Ampere: rows are remapped)."""


def story(events: list[GpuHealthEvent], t0: datetime) -> list[tuple]:
    """(seconds after t0, GPU index, cause, xid, healthy, conditions) of each event."""
    return [
        ((e.event_time - t0).total_seconds(), e.index, e.cause, e.xid, e.healthy, e.conditions)
        for e in events
    ]


def gauge(metrics: AgentMetrics, name: str, node: str, index: int, device_id: str) -> float | None:
    labels = {"cluster": "agent-test", "node": node, "gpu_id": str(index), "device_id": device_id}
    return metrics.registry.get_sample_value(name, labels)


def test_an_h100_xid_incident_reaches_the_topic_and_its_gauges_clear(platform, codec, unique, tmp_path):
    library = FakeNvml([h100(i) for i in range(8)])
    settings = AgentSettings(node=f"h100-{unique}", spool_dir=tmp_path / "spool", collectors=("nvidia",))
    clock, metrics = Clock(), AgentMetrics()
    agent = make_agent(
        settings, platform.kafka, codec, [NvidiaCollector(library)], clock=clock, metrics=metrics
    )
    agent.start()
    sick = library.gpus[2]
    seen: dict[int, tuple[float | None, float | None]] = {}

    def tick(seconds: int) -> None:
        clock.now = T0 + timedelta(seconds=seconds)
        agent.tick()
        seen[seconds] = (
            gauge(metrics, "gpu_unhealthy", settings.node, 2, sick.uuid),
            gauge(metrics, "gpu_xid_critical", settings.node, 2, sick.uuid),
        )

    tick(0)  # every GPU's first state
    library.happen(2, XID_INCIDENT[0][1])  # XID 13: the application's fault, the GPU is fine
    tick(5)
    library.happen(2, XID_INCIDENT[1][1])  # XID 94, then 63: an HBM row fails, remapped at reset
    library.happen(2, XID_INCIDENT[2][1])
    sick.ecc_volatile_uncorrected, sick.remapped_rows = 1, (0, 1, 1, 0)
    tick(10)
    tick(15)  # nothing changed: nothing published
    sick.ecc_volatile_uncorrected, sick.remapped_rows = 0, (0, 1, 0, 0)  # the GPU was reset
    tick(60)
    tick(610)  # 600 s after the last critical XID: it no longer holds
    agent.close()

    key = entity_key("agent-test", settings.node)
    events = [codec.decode(GPU_HEALTH, v) for v in read_topic(platform.kafka, GPU_HEALTH, key, 13)]
    sick_now = ["xid-63", "xid-94", "ecc-uncorrectable", "row-remap-pending"]
    assert story(events, T0) == [
        *((0.0, i, "counters", None, True, []) for i in range(8)),
        (5.0, 2, "xid", 13, True, []),
        (10.0, 2, "xid", 94, False, sick_now),
        (10.0, 2, "xid", 63, False, sick_now),
        (60.0, 2, "counters", None, False, ["xid-63", "xid-94"]),
        (610.0, 2, "cleared", None, True, []),
    ]
    assert all(e.device_id == library.gpus[e.index].uuid and e.vendor == "NVIDIA" for e in events)
    assert events[0].counters == HEALTHY_H100
    assert events[9].counters == {
        **HEALTHY_H100,
        "ecc_volatile_uncorrected": 1,
        "remapped_rows_uncorrectable": 1,
        "remapped_rows_pending": 1,
    }
    assert events[11].counters == {**HEALTHY_H100, "remapped_rows_uncorrectable": 1}
    assert len({e.event_id for e in events}) == 13
    # dcgm-exporter keeps the last XID forever; these go back to 0 once the condition is gone.
    assert seen == {
        0: (0.0, 0.0),
        5: (0.0, 0.0),
        10: (1.0, 94.0),
        15: (1.0, 94.0),
        60: (1.0, 94.0),
        610: (0.0, 0.0),
    }


def test_an_mi300x_uncorrectable_hbm_error_reaches_the_topic_until_the_driver_reloads(
    platform, codec, unique, tmp_path
):
    library = FakeAmdSmi([mi300x(i) for i in range(8)])
    settings = AgentSettings(node=f"mi300x-{unique}", spool_dir=tmp_path / "spool", collectors=("amd",))
    clock = Clock()
    agent = make_agent(settings, platform.kafka, codec, [AmdCollector(library)], clock=clock)
    agent.start()
    agent.tick()
    sick = library.gpus[3]
    sick["ecc"] = MI300X_UMC_UNCORRECTABLE["total"]
    sick["ras"] = {**sick["ras"], "UMC": MI300X_UMC_UNCORRECTABLE["UMC"]}
    clock.now = T0 + timedelta(seconds=5)
    agent.tick()
    sick["ecc"] = ras_counts()  # driver reloaded: amdsmi counts from zero again
    sick["ras"] = {block: ras_counts() for block in MI300X_RAS_BLOCKS}
    clock.now = T0 + timedelta(seconds=10)
    agent.tick()
    agent.close()

    key = entity_key("agent-test", settings.node)
    events = [codec.decode(GPU_HEALTH, v) for v in read_topic(platform.kafka, GPU_HEALTH, key, 10)]
    assert story(events, T0) == [
        *((0.0, i, "counters", None, True, []) for i in range(8)),
        (5.0, 3, "counters", None, False, ["ras-uncorrectable.umc"]),
        (10.0, 3, "counters", None, True, []),
    ]
    at_rest = {"correctable_count": 3, "uncorrectable_count": 0, "deferred_count": 0}
    blocks = ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")
    assert events[0].counters == {
        **at_rest,
        **{f"{b}.{k}": (3 if (b, k) == ("umc", "correctable_count") else 0) for b in blocks for k in at_rest},
    }
    assert {k: v for k, v in events[8].counters.items() if v} == {
        "correctable_count": 12,
        "uncorrectable_count": 1,
        "deferred_count": 1,
        "umc.correctable_count": 12,
        "umc.uncorrectable_count": 1,
        "umc.deferred_count": 1,
    }
    assert not any(events[9].counters.values())


def test_health_is_read_per_whole_gpu_and_without_an_event_set_the_counters_still_are() -> None:
    library = FakeNvml([a100_mig(0), a100_mig(1)])
    collector = NvidiaCollector(library)
    collector.start()
    assert len(collector.gpus()) == 6  # two A100s, two MIG instances each
    readings = collector.health()
    assert [(r.device_id, r.index) for r in readings] == [(g.uuid, i) for i, g in enumerate(library.gpus)]
    assert set(library.registered) == {g.uuid for g in library.gpus}

    class NoEvents(FakeNvml):
        def nvmlEventSetCreate(self) -> object:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # A V100 retires pages (two, one pending a reboot); an A100 remaps rows, and one remap failed.
    v100, a100 = h100(0), a100_mig(1)
    v100.retired_pages = ([0x1A2B3000], [0x3C4D5000], pynvml.NVML_FEATURE_ENABLED)
    a100.migs, a100.remapped_rows = [], (2, 1, 0, 1)
    collector = NvidiaCollector(FakeNvml([v100, a100]))
    collector.start()
    collector.gpus()
    old, new = collector.health()
    assert (old.counters["retired_pages_sbe"], old.counters["retired_pages_dbe"]) == (1, 1)
    assert old.conditions == ("retired-pages-pending",)
    assert "retired_pages_sbe" not in new.counters  # NOT_SUPPORTED since Ampere
    assert new.conditions == ("row-remap-failure",)
    assert [
        new.counters[f"remapped_rows_{k}"] for k in ("correctable", "uncorrectable", "pending", "failure")
    ] == [
        2,
        1,
        0,
        1,
    ]

    bare = NoEvents([h100(0)])
    bare.gpus[0].ecc_volatile_uncorrected = 2
    collector = NvidiaCollector(bare)
    collector.start()
    collector.gpus()
    [reading] = collector.health()
    assert reading.xids == () and reading.conditions == ("ecc-uncorrectable",)
    assert reading.counters["ecc_volatile_uncorrected"] == 2


def test_health_events_land_in_gpu_health_and_the_api_answers_each_gpus_newest(platform, codec, unique):
    sink = SinkThread(platform, codec, unique).start()
    try:
        cluster, node = f"health-{unique}", "gpu-node-3"
        common = {"cluster": cluster, "source": "node-agent", "node": node, "vendor": "NVIDIA"}

        def event(
            seconds: int, index: int, healthy: bool, conditions: list[str], cause: str
        ) -> GpuHealthEvent:
            return GpuHealthEvent(
                event_id=f"{unique}-{seconds}-{index}",
                event_time=T0 + timedelta(seconds=seconds),
                device_id=f"GPU-{index}",
                index=index,
                healthy=healthy,
                conditions=conditions,
                cause=cause,
                xid=79 if cause == "xid" else None,
                counters={"ecc_volatile_uncorrected": 0},
                message=f"event at {seconds}",
                **common,
            )

        events = [
            event(0, 0, True, [], "counters"),
            event(0, 1, True, [], "counters"),
            event(30, 1, False, ["xid-79"], "xid"),
            event(90, 0, False, ["ecc-uncorrectable"], "counters"),
        ]
        sink.publish(GPU_HEALTH, events)
        sink.wait_rows("gpu_health", 4, f"cluster = '{cluster}'")
        client = sink.client()

        api = TestClient(build_app(ApiSettings(), Reader(client)))

        def newest(seconds: int) -> list[tuple]:
            as_of = (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
            answer = api.get(f"/api/nodes/{node}/gpuHealth", params={"cluster": cluster, "asOf": as_of})
            assert answer.status_code == 200, answer.text
            keys = ("device_id", "gpu_index", "healthy", "conditions", "cause", "xid", "message")
            return [tuple(row[k] for k in keys) for row in answer.json()["data"]]

        assert newest(60) == [
            ("GPU-0", 0, True, [], "counters", None, "event at 0"),
            ("GPU-1", 1, False, ["xid-79"], "xid", 79, "event at 30"),
        ]
        assert newest(3600)[0] == ("GPU-0", 0, False, ["ecc-uncorrectable"], "counters", None, "event at 90")
        history = client.query(
            "SELECT gpu_index, healthy, counters FROM gpu_health FINAL WHERE cluster = {c:String} "
            "ORDER BY event_time, gpu_index",
            parameters={"c": cluster},
        ).result_rows
        assert history == [
            (0, True, {"ecc_volatile_uncorrected": 0}),
            (1, True, {"ecc_volatile_uncorrected": 0}),
            (1, False, {"ecc_volatile_uncorrected": 0}),
            (0, False, {"ecc_volatile_uncorrected": 0}),
        ]
    finally:
        sink.stop()


def test_an_xid_from_the_agent_opens_and_clears_gpu_unhealthy_through_the_worker(
    platform, codec, config_file, unique, spawned, tmp_path
):
    # XID 79 (the GPU fell off the bus) on GPU 1 at 5 s: unhealthy from 5 s; held 600 s, the
    # round at 605 s finds it expired: GpuUnhealthy opens at 5 s and resolves at 605 s, since 5 s.
    cluster = f"health-e2e-{unique}"
    library = FakeNvml([h100(0), h100(1)])
    settings = AgentSettings(node="h100-node", spool_dir=tmp_path / "spool", collectors=("nvidia",))
    clock = Clock()
    agent = build_agent(
        settings,
        cluster=cluster,
        kafka=platform.kafka,
        codec=codec,
        collectors=[NvidiaCollector(library)],
        clock=clock,
    )
    agent.start()
    for seconds in (0, 5, 10, 605):
        clock.now = T0 + timedelta(seconds=seconds)
        if seconds == 5:
            library.happen(1, {"eventType": pynvml.nvmlEventTypeXidCriticalError, "eventData": 79})
        agent.tick()
    agent.close()

    command = gpulens(
        config_file, "worker", "--processors", "alerts", "--group", f"health-{unique}", "--idle-ms", "1000",
        "--source-timeout", "1",
    )  # fmt: skip
    spawned.append(spawn(command, config_file.parent / f"worker-health-{unique}.log"))
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"alerts-{cluster}", "isolation.level": "read_committed"})
    )
    consumer.assign([TopicPartition(ALERTS.name, p, 0) for p in range(ALERTS.partitions)])
    alerts: list[Alert] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and len(alerts) < 2:
            for message in consumer.consume(1000, 0.5):
                if (
                    message.error() is None
                    and (alert := codec.decode(ALERTS, message.value())).cluster == cluster
                ):
                    alerts.append(alert)
    finally:
        consumer.close()
    gpu = library.gpus[1].uuid
    assert [(a.alert, a.entity, a.state.value, a.event_time, a.since) for a in alerts] == [
        ("GpuUnhealthy", gpu, "OPENED", T0 + timedelta(seconds=5), T0 + timedelta(seconds=5)),
        ("GpuUnhealthy", gpu, "RESOLVED", T0 + timedelta(seconds=605), T0 + timedelta(seconds=5)),
    ]
    assert alerts[0].labels["xid"] == "79" and alerts[0].labels["conditions"] == "xid-79"
