"""Events/s of the Kubernetes watcher pipeline: watch JSON -> translate -> Avro -> broker.

    python -m bench.watcher_throughput [--pods N]

Starts a private platform and the fake API server of the tests (gpulens/testing/fake_kube.py), then
measures two paths of the real watcher code: the initial LIST of N GPU pods (``run_once``:
restore from the topics, list, translate, reconcile, encode, produce, flush) and N pods
created while it WATCHes (streamed as newline-delimited JSON, decoded, translated, encoded,
produced, flushed). The fake server runs in the same process and shares the cores, so the
figures are a floor. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes.client import Configuration

from gpulens.config import GPULensSettings
from gpulens.platform import private_platform
from gpulens.producers.kubernetes import (
    GpuCatalog,
    KubeApi,
    LeaseSettings,
    Translator,
    Watcher,
    WatcherSettings,
    read_published,
)
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.fake_kube import FakeKube


def _pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p{i}", "namespace": "bench", "labels": {"app": "train", "i": str(i)}},
        "spec": {
            "nodeName": f"n{i % 100}",
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "qosClass": "Burstable"},
    }


def _watcher(
    kube: FakeKube, settings: GPULensSettings, codec: AvroCodec, cluster: str
) -> tuple[Watcher, EventPublisher, KubeApi]:
    watcher_settings = WatcherSettings(lease=LeaseSettings(enabled=False))
    api = KubeApi(Configuration(host=kube.url))
    publisher = EventPublisher(settings.kafka, codec)
    watcher = Watcher(
        api=api,
        settings=watcher_settings,
        translator=Translator(cluster, watcher_settings.source, GpuCatalog.from_settings(watcher_settings)),
        publisher=publisher,
        restore=lambda: read_published(
            settings.kafka, codec, cluster=cluster, source=watcher_settings.source
        ),
    )
    return watcher, publisher, api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20_000)
    n = parser.parse_args().pods
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        with FakeKube() as kube:
            for i in range(n):
                kube.create("pods", _pod(i))
            watcher, publisher, api = _watcher(kube, settings, codec, "bench-list")
            start = time.perf_counter()
            watcher.run_once()
            listed = time.perf_counter() - start
            api.close()
            print(
                f"list  {n:>7,} GPU pods  {publisher.published / listed:>10,.0f} events/s  ({listed:.1f} s)"
            )

        with FakeKube() as kube:
            watcher, publisher, api = _watcher(kube, settings, codec, "bench-watch")
            stop = threading.Event()
            thread = threading.Thread(target=watcher.run, args=(stop,))
            thread.start()
            while not kube.count("GET", "pods", watch=True):
                time.sleep(0.01)
            start = time.perf_counter()
            for i in range(n):
                kube.create("pods", _pod(i))
            while publisher.published < n:
                time.sleep(0.01)
            stop.set()
            thread.join()
            watched = time.perf_counter() - start
            api.close()
            print(f"watch {n:>7,} GPU pods  {n / watched:>10,.0f} events/s  ({watched:.1f} s with creation)")


if __name__ == "__main__":
    main()
