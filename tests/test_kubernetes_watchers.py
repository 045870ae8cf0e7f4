"""The Kubernetes watchers end to end: fake API server over HTTP -> watcher -> real broker -> decode.

Each test uses its own cluster name, so it reads back only its own records from the shared
topics. Records are read after the watchers stopped (which flushes them), so the assertions
are on the exact list of what was published: no duplicates, no gaps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kubernetes.client import Configuration
from watcher_support import (
    Published,
    node,
    summary,
    template,
    wait_for,
    watcher_settings,
)

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port
from gpulens.producers.kubernetes import (
    KubeApi,
    LeaseElector,
)
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.watermarking import WallClockWatermarks, progress_mark
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import ChangeType, PodEvent, Watermark, WorkloadEvent
from gpulens.schemas.model.topics import WATERMARKS

# --- objects -------------------------------------------------------------------------------------


def owner(kind: str, api_version: str, obj: dict) -> list[dict]:
    meta = obj["metadata"]
    return [
        {
            "kind": kind,
            "apiVersion": api_version,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
    ]


def gpu_pod(name: str, *, gpus: str = "1", owners: list[dict] | None = None, **status: Any) -> dict:
    resources = {"requests": {"nvidia.com/gpu": gpus}} if gpus else {"requests": {"cpu": "1"}}
    return {
        "metadata": {"name": name, "namespace": "ml", "ownerReferences": owners or []},
        "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}]},
        "status": {"phase": "Running", **status},
    }


def set_ready(value: str) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        obj["status"]["conditions"][0]["status"] = value

    return change


def heartbeat(obj: dict) -> None:
    obj["status"]["conditions"][0]["lastHeartbeatTime"] = f"2025-01-01T00:00:{time.time_ns() % 60:02d}Z"
    obj["metadata"]["managedFields"] = [{"manager": "kubelet", "time": str(time.time_ns())}]


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    wait_for(lambda: set(threading.enumerate()) <= before, timeout=5, what="the test's threads to end")


# --- behaviours ----------------------------------------------------------------------------------


def test_restart_resumes_without_gaps_or_duplicates(kube, start_watcher, published) -> None:
    kube.create("nodes", node("n1"))
    kube.create("pods", gpu_pod("p1", phase="Pending"))
    kube.create("pods", gpu_pod("p2"))
    first = start_watcher()
    published.wait(("PodEvent", "p2", ChangeType.ADDED), ("NodeEvent", "n1", ChangeType.ADDED))
    kube.update("pods", "p1", lambda o: o["status"].update(phase="Running"), namespace="ml")
    published.wait(("PodEvent", "p1", ChangeType.MODIFIED))
    first.halt()

    kube.delete("pods", "p2", namespace="ml")  # while no watcher runs
    kube.update("pods", "p1", lambda o: o["status"].update(phase="Failed"), namespace="ml")
    kube.create("pods", gpu_pod("p3"))
    kube.update("nodes", "n1", heartbeat, namespace="")
    second = start_watcher()
    published.wait(("PodEvent", "p2", ChangeType.DELETED), ("PodEvent", "p3", ChangeType.ADDED))
    second.halt()

    events = published.drain()
    assert sorted(summary(e) for e in events) == sorted(
        [
            ("NodeEvent", "n1", ChangeType.ADDED),
            ("PodEvent", "p1", ChangeType.ADDED),
            ("PodEvent", "p2", ChangeType.ADDED),
            ("PodEvent", "p1", ChangeType.MODIFIED),  # Running, seen live
            ("PodEvent", "p2", ChangeType.DELETED),  # deleted while away
            ("PodEvent", "p1", ChangeType.MODIFIED),  # Failed, changed while away
            ("PodEvent", "p3", ChangeType.ADDED),  # created while away
        ]
    )
    assert [e.phase for e in events if isinstance(e, PodEvent) and e.name == "p1"] == [
        "Pending",
        "Running",
        "Failed",
    ]
    assert len({e.event_id for e in events}) == len(events)


def test_each_watch_resumes_from_the_last_bookmark_without_relisting(kube, start_watcher, published) -> None:
    last_pod_version = int(kube.create("pods", gpu_pod("p1"))["metadata"]["resourceVersion"])
    watcher = start_watcher(watch_timeout_s=1)
    published.wait(("PodEvent", "p1", ChangeType.ADDED))
    kube.create("nodes", node("n1"))  # moves the global resourceVersion past the pods' last one
    bookmark = kube.bookmark()

    def resumed_from_bookmark() -> bool:
        return any(
            m == "GET" and p == "pods" and int(q.get("resourceVersion", 0)) >= bookmark > last_pod_version
            for m, p, q in list(kube.requests)
            if q.get("watch") == "true"
        )

    wait_for(resumed_from_bookmark, what="a pods watch from the bookmark's resourceVersion")
    wait_for(lambda: kube.count("GET", "pods", watch=True) >= 3, what="a third pods watch stream")
    kube.create("pods", gpu_pod("p2"))
    published.wait(("PodEvent", "p2", ChangeType.ADDED))
    watcher.halt()
    assert kube.count("GET", "pods") == 1  # never relisted
    assert sorted(summary(e) for e in published.drain() if isinstance(e, PodEvent)) == [
        ("PodEvent", "p1", ChangeType.ADDED),
        ("PodEvent", "p2", ChangeType.ADDED),
    ]


@pytest.mark.parametrize("kube", ["status", "event"], indirect=True)
def test_410_relist_publishes_exactly_the_vanished_deletes(kube, start_watcher, published) -> None:
    for name in ("p1", "p2", "p3"):
        kube.create("pods", gpu_pod(name))
    watcher = start_watcher()
    published.wait(*[("PodEvent", name, ChangeType.ADDED) for name in ("p1", "p2", "p3")])
    with kube.outage():
        kube.delete("pods", "p1", namespace="ml")
        kube.update("pods", "p2", heartbeat_pod, namespace="ml")  # a new resourceVersion, same content
        kube.compact()
    published.wait(("PodEvent", "p1", ChangeType.DELETED))
    wait_for(lambda: kube.count("GET", "pods") == 2, what="the relist")
    kube.create("pods", gpu_pod("p4"))  # after the relist, in the same stream: its event comes last
    published.wait(("PodEvent", "p4", ChangeType.ADDED))
    watcher.halt()
    assert sorted(summary(e) for e in published.drain()) == sorted(
        [("PodEvent", n, ChangeType.ADDED) for n in ("p1", "p2", "p3", "p4")]
        + [("PodEvent", "p1", ChangeType.DELETED)]
    )


def heartbeat_pod(obj: dict) -> None:
    obj["metadata"]["managedFields"] = [{"manager": "kubelet", "time": str(time.time_ns())}]


def test_owner_chains_reach_the_top_workload(kube, start_watcher, published) -> None:
    deployment = kube.create(
        "deployments",
        {"metadata": {"name": "web", "namespace": "ml"}, "spec": {"replicas": 2, "template": template("1")}},
    )
    rs = kube.create(
        "replicasets",
        {
            "metadata": {
                "name": "web-1",
                "namespace": "ml",
                "ownerReferences": owner("Deployment", "apps/v1", deployment),
            },
            "spec": {"replicas": 2, "template": template("1")},
        },
    )
    cron = kube.create(
        "cronjobs",
        {
            "metadata": {"name": "nightly", "namespace": "ml"},
            "spec": {"jobTemplate": {"spec": {"template": template("2")}}},
        },
    )
    job = kube.create(
        "jobs",
        {
            "metadata": {
                "name": "nightly-1",
                "namespace": "ml",
                "ownerReferences": owner("CronJob", "batch/v1", cron),
            },
            "spec": {"parallelism": 1, "template": template("2")},
        },
    )
    torch = kube.create(
        "pytorchjobs",
        {
            "metadata": {"name": "llm", "namespace": "ml"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": template("8")},
                    "Worker": {"replicas": 3, "template": template("8")},
                }
            },
        },
    )
    kube.create("pods", gpu_pod("web-1-a", owners=owner("ReplicaSet", "apps/v1", rs)))
    kube.create("pods", gpu_pod("nightly-1-a", gpus="2", owners=owner("Job", "batch/v1", job)))
    kube.create(
        "pods", gpu_pod("llm-master-0", gpus="8", owners=owner("PyTorchJob", "kubeflow.org/v1", torch))
    )
    watcher = start_watcher()
    events = published.wait(
        *[("PodEvent", n, ChangeType.ADDED) for n in ("web-1-a", "nightly-1-a", "llm-master-0")],
        ("WorkloadEvent", "llm", ChangeType.ADDED),
        ("WorkloadEvent", "web-1", ChangeType.ADDED),
        ("WorkloadEvent", "nightly-1", ChangeType.ADDED),
    )
    watcher.halt()
    chains = {e.name: [(o.kind, o.name) for o in e.owners] for e in events if isinstance(e, PodEvent)}
    assert chains == {
        "web-1-a": [("ReplicaSet", "web-1"), ("Deployment", "web")],
        "nightly-1-a": [("Job", "nightly-1"), ("CronJob", "nightly")],
        "llm-master-0": [("PyTorchJob", "llm")],
    }
    workloads = {e.name: e for e in events if isinstance(e, WorkloadEvent)}
    assert workloads["web-1"].parent_uid == deployment["metadata"]["uid"]
    assert workloads["nightly-1"].parent_uid == cron["metadata"]["uid"]
    assert (workloads["llm"].group, workloads["llm"].kind, workloads["llm"].gpu_request) == (
        "kubeflow.org",
        "PyTorchJob",
        32,
    )


def test_an_unschedulable_gpu_pod_carries_the_scheduler_reason_and_message(
    kube, start_watcher, published
) -> None:
    message = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."
    watcher = start_watcher()
    wait_for(lambda: kube.count("GET", "pods", watch=True), what="the pods watch")
    kube.create(
        "pods",
        gpu_pod(
            "big",
            gpus="16",
            phase="Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
        ),
    )
    events = published.wait(("PodEvent", "big", ChangeType.ADDED))
    watcher.halt()
    (pod,) = events
    assert (pod.phase, pod.node, pod.gpu_amount) == ("Pending", None, 16)
    assert (pod.unschedulable_reason, pod.unschedulable_message) == ("Unschedulable", message)


def test_two_replicas_with_leader_election_publish_each_change_once(kube, start_watcher, published) -> None:
    a, b = start_watcher(identity="a"), start_watcher(identity="b")
    leader = wait_for(lambda: next((w for w in (a, b) if w.elector.leading), None), what="a leader")
    follower = b if leader is a else a
    kube.create("pods", gpu_pod("p1"))
    published.wait(("PodEvent", "p1", ChangeType.ADDED))
    assert not follower.elector.leading
    leader.halt()  # releases the lease: the follower takes over at once
    wait_for(lambda: follower.elector.leading, what="the follower to lead")
    kube.create("pods", gpu_pod("p2"))
    kube.update("pods", "p1", lambda o: o["status"].update(phase="Succeeded"), namespace="ml")
    published.wait(("PodEvent", "p2", ChangeType.ADDED), ("PodEvent", "p1", ChangeType.MODIFIED))
    follower.halt()
    assert sorted(summary(e) for e in published.drain()) == [
        ("PodEvent", "p1", ChangeType.ADDED),
        ("PodEvent", "p1", ChangeType.MODIFIED),
        ("PodEvent", "p2", ChangeType.ADDED),
    ]
    assert kube.get("leases", "gpulens-watcher", namespace="gpulens")["spec"]["holderIdentity"] is None


def test_a_stale_lease_is_taken_over_after_its_duration(kube) -> None:
    kube.create(
        "leases",
        {
            "metadata": {"name": "gpulens-watcher", "namespace": "gpulens"},
            "spec": {
                "holderIdentity": "ghost",
                "leaseDurationSeconds": 1,
                "renewTime": "2025-01-01T00:00:00.000000Z",
            },
        },
    )
    api = KubeApi(Configuration(host=kube.url))
    elector = LeaseElector(api, watcher_settings(identity="me").lease)
    rival = LeaseElector(api, watcher_settings(identity="rival").lease)
    try:
        assert not elector.try_acquire_or_renew()  # held, as far as it has seen
        wait_for(elector.try_acquire_or_renew, timeout=5, what="the takeover")
        assert not rival.try_acquire_or_renew()
        spec = kube.get("leases", "gpulens-watcher", namespace="gpulens")["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("me", 1)
    finally:
        api.close()


def test_a_node_going_not_ready_and_back_yields_two_node_events(kube, start_watcher, published) -> None:
    kube.create("nodes", node("n1"))
    watcher = start_watcher()
    published.wait(("NodeEvent", "n1", ChangeType.ADDED))
    kube.update("nodes", "n1", set_ready("False"), namespace="")
    kube.update("nodes", "n1", set_ready("True"), namespace="")
    events = wait_for(lambda: len(published.drain()) >= 3 and published.events, what="two node changes")
    watcher.halt()
    assert [(e.type, e.ready) for e in published.drain()] == [
        (ChangeType.ADDED, True),
        (ChangeType.MODIFIED, False),
        (ChangeType.MODIFIED, True),
    ]
    assert events[0].gpu_model == "NVIDIA-H100-80GB-HBM3"


def test_heartbeat_only_node_updates_yield_no_event(kube, start_watcher, published) -> None:
    kube.create("nodes", node("n1"))
    watcher = start_watcher()
    published.wait(("NodeEvent", "n1", ChangeType.ADDED))
    for _ in range(5):
        kube.update("nodes", "n1", heartbeat, namespace="")
    kube.update(
        "nodes", "n1", lambda o: o["metadata"]["labels"].update(zone="b"), namespace=""
    )  # in order, last
    published.wait(("NodeEvent", "n1", ChangeType.MODIFIED))
    watcher.halt()
    assert [(e.type, e.labels.get("zone")) for e in published.drain()] == [
        (ChangeType.ADDED, None),
        (ChangeType.MODIFIED, "b"),
    ]


def test_pods_without_gpus_are_ignored(kube, start_watcher, published) -> None:
    kube.create("pods", gpu_pod("cpu-1", gpus=""))
    watcher = start_watcher()
    wait_for(lambda: kube.count("GET", "pods", watch=True), what="the pods watch")
    kube.create("pods", gpu_pod("cpu-2", gpus=""))
    kube.update("pods", "cpu-1", lambda o: o["status"].update(phase="Succeeded"), namespace="ml")
    kube.delete("pods", "cpu-2", namespace="ml")
    kube.create("pods", gpu_pod("gpu-1"))  # in the same stream, after the others
    published.wait(("PodEvent", "gpu-1", ChangeType.ADDED))
    watcher.halt()
    assert [summary(e) for e in published.drain()] == [("PodEvent", "gpu-1", ChangeType.ADDED)]


def kubeconfig_of(kube, directory: Path) -> Path:
    """A kubeconfig file pointing at the fake API server."""
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
                "users": [{"name": "me", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return kubeconfig


def test_watch_once_on_the_command_line_publishes_the_cluster_and_exits(
    kube, config_file, tmp_path, cluster, published
) -> None:
    from click.testing import CliRunner

    from gpulens.cli import cli

    kubeconfig = kubeconfig_of(kube, tmp_path)
    kube.create("nodes", node("n1"))
    kube.create("pods", gpu_pod("p1"))
    args = [
        "--config",
        str(config_file),
        "watch",
        "--once",
        "--cluster",
        cluster,
        "--kubeconfig",
        str(kubeconfig),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "2 changes published, then a watermark" in result.output
    assert sorted(summary(e) for e in published.drain()) == [
        ("NodeEvent", "n1", ChangeType.ADDED),
        ("PodEvent", "p1", ChangeType.ADDED),
    ]


def test_watch_once_ends_with_a_watermark_produced_after_what_it_listed(
    kube, platform, codec, config_file, tmp_path, cluster
) -> None:
    """A cron of `watch --once` moves its cluster's event time: its last record is a watermark
    of its source, produced after the changes it published, vouching for the wall clock less
    watermark_lag_s (2 s)."""
    published = Published(platform, codec, cluster, more=(WATERMARKS,))
    try:
        kube.create("nodes", node("n1"))
        kube.create("pods", gpu_pod("p1"))
        command = [
            "watch",
            "--once",
            "--cluster",
            cluster,
            "--kubeconfig",
            str(kubeconfig_of(kube, tmp_path)),
        ]
        began = datetime.now(UTC)
        run = subprocess.run(
            [sys.executable, "-m", "gpulens", "--config", str(config_file), *command],
            capture_output=True,
            timeout=120,
        )
        ended = datetime.now(UTC)
        assert run.returncode == 0, run.stderr.decode()[-2000:]
        published.drain()  # it flushed before exiting: everything is on the broker
        pairs = list(zip(published.created, published.events, strict=True))
        marks = [(c, e) for c, e in pairs if isinstance(e, Watermark)]
        changes = [(c, e) for c, e in pairs if not isinstance(e, Watermark)]
        assert len(marks) == 1 and len(changes) == 2
        created, mark = marks[0]
        assert mark.source == "k8s-watcher" and not mark.final
        assert created >= max(c for c, _ in changes), "produced after every change it vouches for"
        lag = timedelta(seconds=2)
        assert began - lag <= mark.event_time <= ended - lag
    finally:
        published.close()


def test_a_watcher_vouches_for_the_wall_clock_only_after_publishing_what_came_before(
    kube, platform, codec, config_file, cluster, tmp_path, spawned
) -> None:
    """`gpulens watch`, quiet or not, publishes a watermark every interval; none vouches for a
    change it had not published (produce times read back from the broker) and they follow the
    wall clock, less its lag."""
    published = Published(platform, codec, cluster, more=(WATERMARKS,))
    try:
        kube.create("nodes", node("n1"))
        env = {
            **os.environ,
            "GPULENS_WATCHER__LEASE__ENABLED": "false",
            "GPULENS_WATCHER__WATERMARK_INTERVAL_S": "0.3",
        }
        command = ["watch", "--cluster", cluster, "--kubeconfig", str(kubeconfig_of(kube, tmp_path))]
        spawned.append(
            subprocess.Popen(
                [sys.executable, "-m", "gpulens", "--config", str(config_file), *command], env=env
            )
        )

        def marks() -> list[tuple[int, Watermark]]:
            published.drain()
            pairs = zip(published.created, published.events, strict=True)
            return [(created, e) for created, e in pairs if isinstance(e, Watermark)]

        wait_for(lambda: len(marks()) >= 3, what="three watermarks while nothing changes")
        quiet = [m.event_time for _, m in marks()]
        assert quiet == sorted(set(quiet)), "each watermark vouches for a later instant"
        assert all(m.source == "k8s-watcher" and not m.final for _, m in marks())
        kube.create("pods", gpu_pod("p1"))
        published.wait(("PodEvent", "p1", ChangeType.ADDED))
        pairs = zip(published.created, published.events, strict=True)
        created, pod = next((c, e) for c, e in pairs if isinstance(e, PodEvent))
        wait_for(
            lambda: any(m.event_time > pod.event_time for _, m in marks()), what="a watermark past the pod"
        )
        vouching = [c for c, m in marks() if m.event_time > pod.event_time]
        assert min(vouching) >= created, "no watermark past the pod was produced before the pod"
        newest = marks()[-1][1].event_time
        assert abs((datetime.now(UTC) - newest).total_seconds()) < 5, "the watermarks follow the wall clock"
    finally:
        published.close()


def test_no_watermark_is_published_while_the_broker_does_not_acknowledge(codec, tmp_path) -> None:
    """The watcher's watermarks (WallClockWatermarks, a real publisher) while its broker is away,
    then once one listens there: only instants after its return are vouched for."""
    port = free_port()
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        extra={"reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "200"},
    )
    publisher = EventPublisher(kafka, codec)
    ticks = iter(range(1_000_000))  # each tick a second later: every one is due
    marks = WallClockWatermarks(
        publisher, cluster="away", source="k8s-watcher", every_s=0.2, clock=lambda: float(next(ticks))
    )
    publisher.publish(WATERMARKS, progress_mark("away", "k8s-watcher", datetime(2026, 1, 1, tzinfo=UTC)))
    for _ in range(3):
        marks.tick()  # each waits 0.05 s for the broker, in vain
    assert publisher.published == 1, "nothing vouched for while the first record is unacknowledged"
    back = datetime.now(UTC)
    services = ServiceManager(tmp_path / "broker")
    services.start(ServiceSpec("kafka", noida_argv("127.0.0.1", port, tmp_path / "data"), "127.0.0.1", port))
    try:
        create_topics(kafka, [WATERMARKS])
        wait_for(lambda: marks.tick() or publisher.published > 1, what="a watermark once the broker is back")
        publisher.flush(30)
        consumer = Consumer(kafka.librdkafka(**{"group.id": "away", "auto.offset.reset": "earliest"}))
        consumer.assign([TopicPartition(WATERMARKS.name, 0, 0)])
        read = [codec.decode(WATERMARKS, m.value()) for m in consumer.consume(publisher.published, 10)]
        consumer.close()
    finally:
        services.stop("kafka")
    assert len(read) == publisher.published == 2
    assert read[1].event_time >= back, "the instant vouched for was taken after the broker came back"
