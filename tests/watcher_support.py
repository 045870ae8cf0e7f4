"""The Kubernetes watchers' test harness, a pytest plugin (tests/conftest.py): the fake API
server (``kube``, overridable by a module), a watcher of a cluster of the test's own
(``start_watcher``) and what it published (``published``), read back from the real broker."""

from __future__ import annotations

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
from gpulens.schemas.model.models import ChangeType, Event, NodeEvent, Watermark
from gpulens.schemas.model.topics import TopicSpec
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


# --- reading back --------------------------------------------------------------------------------


class Published:
    """What the watchers of one cluster published since this reader was made, on the watchers'
    topics (and on ``more``), with each record's produce time (ms) in ``created``."""

    def __init__(
        self, settings: GPULensSettings, codec: AvroCodec, cluster: str, more: tuple[TopicSpec, ...] = ()
    ) -> None:
        self._codec = codec
        self._cluster = cluster
        self._consumer = Consumer(
            settings.kafka.librdkafka(**{"group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False})
        )
        self._specs = {spec.name: spec for spec in (*TOPICS.values(), *more)}
        metadata = self._consumer.list_topics(timeout=10).topics
        self._partitions = [TopicPartition(t, p) for t in self._specs for p in metadata[t].partitions]
        starts = [
            TopicPartition(tp.topic, tp.partition, self._consumer.get_watermark_offsets(tp, timeout=10)[1])
            for tp in self._partitions
        ]
        self._positions = {(tp.topic, tp.partition): tp.offset for tp in starts}
        self._consumer.assign(starts)
        self.events: list[Event] = []
        self.created: list[int] = []

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
                    self.created.append(msg.timestamp()[1])
        return self.events

    def wait(self, *expected: tuple[str, str, ChangeType]) -> list[Event]:
        """Wait until every ``(event class, name, type)`` in ``expected`` has been published."""

        def arrived() -> bool:
            seen = {summary(e) for e in self.drain() if not isinstance(e, Watermark)}
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


def make_watcher(
    platform: GPULensSettings, codec: AvroCodec, kube: FakeKube, cluster: str, settings: WatcherSettings
) -> tuple[Watcher, KubeApi, LeaseElector | None]:
    """A watcher of ``cluster`` on the fake API server, publishing to the platform's broker."""
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
    return watcher, api, elector


@pytest.fixture
def start_watcher(
    platform: GPULensSettings, codec: AvroCodec, kube: FakeKube, cluster: str
) -> Iterator[Callable[..., RunningWatcher]]:
    running: list[RunningWatcher] = []

    def start(
        *, identity: str | None = None, watch_timeout_s: int = 5, settings: WatcherSettings | None = None
    ) -> RunningWatcher:
        """``settings``: these instead of :func:`watcher_settings`'s."""
        chosen = settings or watcher_settings(identity=identity, watch_timeout_s=watch_timeout_s)
        running.append(RunningWatcher(*make_watcher(platform, codec, kube, cluster, chosen)))
        return running[-1]

    yield start
    for watcher in running:
        watcher.halt()
