"""The Kubernetes watchers end to end: fake API server over HTTP -> watcher -> real broker -> decode.

Each test uses its own cluster name, so it reads back only its own records from the shared
topics. Records are read after the watchers stopped (which flushes them), so the assertions
are on the exact list of what was published: no duplicates, no gaps.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kubernetes.client import Configuration

from gpulens.config import GPULensSettings
from gpulens.producers.kubernetes import (
    CustomWorkloadKind,
    GpuCatalog,
    KubeApi,
    LeaseElector,
    LeaseSettings,
    Translator,
    Watcher,
    WatcherSettings,
    read_published,
)
from gpulens.producers.kubernetes.resources import TOPICS
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.model.models import ChangeType, Event, NodeEvent, PodEvent, WorkloadEvent
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.fake_kube import FakeKube

PYTORCHJOB = CustomWorkloadKind(group="kubeflow.org", version="v1", plural="pytorchjobs", kind="PyTorchJob")
TIMEOUT = 20.0


def wait_for(condition: Callable[[], Any], *, timeout: float = TIMEOUT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


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


def node(name: str, *, ready: str = "True") -> dict:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": "2025-01-01T00:00:00Z"}],
            "capacity": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "63", "memory": "500Gi"},
        },
    }


def template(gpus: str) -> dict:
    return {"spec": {"containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]}}


def set_ready(value: str) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        obj["status"]["conditions"][0]["status"] = value

    return change


def heartbeat(obj: dict) -> None:
    obj["status"]["conditions"][0]["lastHeartbeatTime"] = f"2025-01-01T00:00:{time.time_ns() % 60:02d}Z"
    obj["metadata"]["managedFields"] = [{"manager": "kubelet", "time": str(time.time_ns())}]


# --- reading back --------------------------------------------------------------------------------


class Published:
    """What the watchers of one cluster published since this reader was made."""

    def __init__(self, settings: GPULensSettings, codec: AvroCodec, cluster: str) -> None:
        self._codec = codec
        self._cluster = cluster
        self._consumer = Consumer(
            settings.kafka.librdkafka(**{"group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False})
        )
        self._specs = {spec.name: spec for spec in TOPICS.values()}
        metadata = self._consumer.list_topics(timeout=10).topics
        self._partitions = [TopicPartition(t, p) for t in self._specs for p in metadata[t].partitions]
        starts = [
            TopicPartition(tp.topic, tp.partition, self._consumer.get_watermark_offsets(tp, timeout=10)[1])
            for tp in self._partitions
        ]
        self._positions = {(tp.topic, tp.partition): tp.offset for tp in starts}
        self._consumer.assign(starts)
        self.events: list[Event] = []

    def close(self) -> None:
        self._consumer.close()

    def drain(self) -> list[Event]:
        """Everything published up to now (the current end of every partition)."""
        ends = {
            (tp.topic, tp.partition): self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in self._partitions
        }
        while any(self._positions[k] < end for k, end in ends.items()):
            for msg in self._consumer.consume(500, timeout=0.2):
                assert not msg.error(), msg.error()
                self._positions[(msg.topic(), msg.partition())] = msg.offset() + 1
                event = self._codec.decode(self._specs[msg.topic()], msg.value())
                if event.cluster == self._cluster:
                    self.events.append(event)
        return self.events

    def wait(self, *expected: tuple[str, str, ChangeType]) -> list[Event]:
        """Wait until every ``(event class, name, type)`` in ``expected`` has been published."""

        def arrived() -> bool:
            seen = {summary(e) for e in self.drain()}
            return all(x in seen for x in expected)

        wait_for(arrived, what=f"{expected}")
        return self.events


def summary(event: Event) -> tuple[str, str, ChangeType]:
    name = event.node if isinstance(event, NodeEvent) else event.name  # type: ignore[attr-defined]
    return (type(event).__name__, name, event.type)  # type: ignore[attr-defined]


# --- running watchers ----------------------------------------------------------------------------


class RunningWatcher:
    def __init__(self, watcher: Watcher, api: KubeApi, elector: LeaseElector | None) -> None:
        self.elector = elector
        self._api = api
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(watcher,), name="test-watcher")
        self._thread.start()

    def _run(self, watcher: Watcher) -> None:
        try:
            watcher.run(self._stop)
        except BaseException as err:
            self._error = err

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the watcher did not stop within 30s"
        self._api.close()
        if self._error is not None:
            raise self._error


@pytest.fixture(params=["status"])
def kube(request: pytest.FixtureRequest) -> Iterator[FakeKube]:
    with FakeKube(gone_as=request.param) as fake:
        yield fake


@pytest.fixture
def cluster(unique: str) -> str:
    return f"test-{unique}"


@pytest.fixture
def published(platform: GPULensSettings, codec: AvroCodec, cluster: str) -> Iterator[Published]:
    reader = Published(platform, codec, cluster)
    yield reader
    reader.close()


def watcher_settings(*, identity: str | None = None, watch_timeout_s: int = 5) -> WatcherSettings:
    return WatcherSettings(
        custom_workloads=(PYTORCHJOB,),
        watch_timeout_s=watch_timeout_s,
        request_timeout_s=5,
        backoff_s=(0.05,) * 60,
        lease=LeaseSettings(
            enabled=identity is not None, identity=identity or "solo", duration_s=2, renew_interval_s=0.1
        ),
    )


@pytest.fixture
def start_watcher(
    platform: GPULensSettings, codec: AvroCodec, kube: FakeKube, cluster: str
) -> Iterator[Callable[..., RunningWatcher]]:
    running: list[RunningWatcher] = []

    def start(*, identity: str | None = None, watch_timeout_s: int = 5) -> RunningWatcher:
        settings = watcher_settings(identity=identity, watch_timeout_s=watch_timeout_s)
        api = KubeApi(Configuration(host=kube.url), request_timeout_s=settings.request_timeout_s)
        elector = LeaseElector(api, settings.lease) if settings.lease.enabled else None
        watcher = Watcher(
            api=api,
            settings=settings,
            translator=Translator(cluster, settings.source, GpuCatalog.from_settings(settings)),
            publisher=EventPublisher(platform.kafka, codec),
            restore=lambda: read_published(platform.kafka, codec, cluster=cluster, source=settings.source),
            elector=elector,
        )
        running.append(RunningWatcher(watcher, api, elector))
        return running[-1]

    yield start
    for watcher in running:
        watcher.halt()


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


def test_watch_once_on_the_command_line_publishes_the_cluster_and_exits(
    kube, config_file, tmp_path, cluster, published
) -> None:
    from click.testing import CliRunner

    from gpulens.cli import cli

    kubeconfig = tmp_path / "kubeconfig"
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
    assert "2 events published" in result.output
    assert sorted(summary(e) for e in published.drain()) == [
        ("NodeEvent", "n1", ChangeType.ADDED),
        ("PodEvent", "p1", ChangeType.ADDED),
    ]
