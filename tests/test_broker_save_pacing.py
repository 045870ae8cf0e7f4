"""The embedded broker's saves come ``platform.broker_save_interval_s`` apart, and a clean stop
still saves everything.

noida-db rewrites all it holds at every save, one save after another while data changes (a
second apart): at 100,000 GPUs that was a third of a core. ``make install`` builds a library
(``deploy/noida/save_pacing.c``) that ``gpulens up`` preloads into the broker to stretch that
pause. Each test runs a noida-db of its own under a stream of records and watches its state
file being replaced (each save writes a temporary file and renames it over the last).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.infra.broker import SAVE_PACING_LIBRARY, noida_argv, noida_env
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port, manager

pytestmark = pytest.mark.skipif(
    not SAVE_PACING_LIBRARY.is_file(), reason=f"{SAVE_PACING_LIBRARY} is not built (make install)"
)

TOPIC = "paced"


@contextmanager
def _broker(tmp_path: Path, save_interval_s: float) -> Iterator[tuple[ServiceManager, ServiceSpec, str]]:
    port = free_port()
    services = ServiceManager(tmp_path / "state")
    spec = ServiceSpec(
        "kafka",
        noida_argv("127.0.0.1", port, tmp_path / "kafka"),
        "127.0.0.1",
        port,
        env=noida_env(save_interval_s, os.environ),
    )
    services.start(spec)
    try:
        yield services, spec, f"127.0.0.1:{port}"
    finally:
        services.stop("kafka")


def _save_times(snapshot: Path, servers: str, seconds: float) -> list[float]:
    """When the state file was replaced while records were produced for ``seconds``."""
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    times: list[float] = []
    last = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            producer.produce(TOPIC, os.urandom(200))
        producer.poll(0)
        inode = snapshot.stat().st_ino if snapshot.exists() else None
        if inode != last and inode is not None:
            times.append(time.monotonic())
        last = inode
        time.sleep(0.02)
    assert producer.flush(10) == 0
    return times


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_paced_saves_come_the_interval_apart(tmp_path: Path) -> None:
    with _broker(tmp_path, save_interval_s=2.5) as (_, _, servers):
        saves = _save_times(tmp_path / "kafka" / "kafka.json", servers, seconds=9)
    gaps = _gaps(saves)
    assert len(gaps) >= 2, f"saves at {saves}"
    assert min(gaps) >= 2.3, f"saves {gaps} s apart, paced at 2.5 s"


def test_unpaced_saves_come_a_second_apart(tmp_path: Path) -> None:
    """noida-db's own pace, which the library stretches: the test above could not pass by chance."""
    with _broker(tmp_path, save_interval_s=1.0) as (_, spec, servers):
        assert "LD_PRELOAD" not in spec.env
        saves = _save_times(tmp_path / "kafka" / "kafka.json", servers, seconds=5)
    assert min(_gaps(saves)) < 2.0, f"saves at {saves}"


def test_a_clean_stop_saves_what_came_since_the_last_paced_save(tmp_path: Path) -> None:
    with _broker(tmp_path, save_interval_s=60.0) as (services, spec, servers):
        producer = Producer({"bootstrap.servers": servers})
        for n in range(5_000):
            producer.produce(TOPIC, b"record-%d" % n, partition=0)
        assert producer.flush(10) == 0
        started = time.monotonic()
        services.stop("kafka")
        assert time.monotonic() - started < 30, "the stop waited for the paced pause"
        services.start(spec)
        consumer = Consumer({"bootstrap.servers": servers, "group.id": "count"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        finally:
            consumer.close()
    assert high - low == 5_000


def test_a_preloaded_library_of_the_users_stays_preloaded_after_ours() -> None:
    env = noida_env(10.0, {"LD_PRELOAD": "/opt/theirs.so"})
    assert env["LD_PRELOAD"] == f"{SAVE_PACING_LIBRARY} /opt/theirs.so"
    assert env["NOIDA_SAVE_INTERVAL_MS"] == "10000"


def test_without_the_library_the_broker_runs_at_its_own_pace(tmp_path: Path) -> None:
    env = noida_env(10.0, {}, library=tmp_path / "missing.so")
    assert "LD_PRELOAD" not in env and "NOIDA_SAVE_INTERVAL_MS" not in env
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072", "the malloc bounds stay"


def test_the_platforms_broker_is_paced_by_default(platform: GPULensSettings) -> None:
    pid = manager(platform).status("kafka").pid
    assert pid is not None
    environ = dict(
        entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
    )
    assert environ["NOIDA_SAVE_INTERVAL_MS"] == str(round(platform.platform.broker_save_interval_s * 1000))
    assert str(SAVE_PACING_LIBRARY) in Path(f"/proc/{pid}/maps").read_text(), "the library is loaded"
