"""The embedded broker pauses between two saves for what the last one cost
(``platform.broker_save_share``), and a clean stop still saves everything.

noida-db rewrites all it holds at every save, one save after another while data changes (a
second apart): at 100,000 GPUs that was a third of a core. ``make install`` builds a library
(``deploy/noida/save_pacing.c``) that ``gpulens up`` preloads into the broker to stretch that
pause. The tests run noida-db brokers of their own under a stream of records and watch the state
file being replaced (each save writes a temporary file and renames it over the last); the last
test looks at the session platform's broker.
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
from worker_support import cpu_s_of, thread_named

from gpulens.config import GPULensSettings
from gpulens.infra.broker import SAVE_PACING_LIBRARY, noida_argv, noida_env
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port, manager

pytestmark = pytest.mark.skipif(
    not SAVE_PACING_LIBRARY.is_file(), reason=f"{SAVE_PACING_LIBRARY} is not built (make install)"
)

TOPIC = "paced"
PAUSE_MAX_S = 30.0


@contextmanager
def _broker(tmp_path: Path, save_share: float) -> Iterator[tuple[ServiceManager, ServiceSpec, str]]:
    port = free_port()
    services = ServiceManager(tmp_path / "state")
    spec = ServiceSpec(
        "kafka",
        noida_argv("127.0.0.1", port, tmp_path / "kafka"),
        "127.0.0.1",
        port,
        env=noida_env(save_share, PAUSE_MAX_S, os.environ),
    )
    services.start(spec)
    try:
        yield services, spec, f"127.0.0.1:{port}"
    finally:
        services.stop("kafka")


def _saves(
    services: ServiceManager, tmp_path: Path, servers: str, seconds: float, enough: int | None = None
) -> list[tuple[float, float]]:
    """(wall time, the saving thread's CPU seconds) at each save while records were produced
    for ``seconds``, or until ``enough`` saves were seen."""
    pid = services.status("kafka").pid
    assert pid is not None
    saving = thread_named(pid, "autosave")
    assert saving is not None, "noida-db has no saving thread"
    snapshot = tmp_path / "kafka" / "kafka.json"
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    saves: list[tuple[float, float]] = []
    last = snapshot.stat().st_ino if snapshot.exists() else None
    end = time.monotonic() + seconds
    while time.monotonic() < end and (enough is None or len(saves) < enough):
        for _ in range(20):
            producer.produce(TOPIC, os.urandom(200))
        producer.poll(0)
        inode = snapshot.stat().st_ino if snapshot.exists() else None
        if inode != last:
            saves.append((time.monotonic(), cpu_s_of(pid, saving)))
        last = inode
        time.sleep(0.01)
    assert producer.flush(10) == 0
    return saves


def _fill(servers: str, megabytes: int) -> None:
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20})
    for _ in range(megabytes * 2_500):
        producer.produce(TOPIC, os.urandom(400))
        producer.poll(0)
    assert producer.flush(30) == 0


def test_a_broker_holding_little_keeps_its_one_second_pace(tmp_path: Path) -> None:
    """Its saves take milliseconds: a topic just created is saved as soon as before pacing."""
    with _broker(tmp_path, save_share=0.05) as (services, spec, servers):
        assert "NOIDA_SAVE_SHARE" in spec.env
        saves = _saves(services, tmp_path, servers, seconds=5)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(saves)]
    assert len(gaps) >= 2 and max(gaps) < 2.0, f"saves {gaps} s apart"


def test_a_broker_holding_much_pauses_for_its_saves_cost(tmp_path: Path) -> None:
    """Paced at a share of 0.2, the pause after a save lasts four times the CPU it took."""
    share = 0.2
    with _broker(tmp_path, save_share=share) as (services, _, servers):
        _fill(servers, megabytes=30)  # a save then takes one to two CPU-seconds
        # Three saves are two paced pauses: up to ~8 s each where a save takes 1.5 CPU-s.
        saves = _saves(services, tmp_path, servers, seconds=60, enough=3)
    assert len(saves) >= 3, f"saves at {saves}"
    costly = 0
    for (_, before), (at, cpu), (next_at, _) in zip(saves, saves[1:], saves[2:], strict=False):
        pause = max(1.0, (cpu - before) * (1 - share) / share)
        costly += pause > 1.5
        assert next_at - at >= 0.9 * pause, (
            f"a save of {cpu - before:.2f} CPU-s, the next {next_at - at:.2f} s later"
        )
    assert costly, f"no save cost enough to be paced: {saves}"


def test_a_clean_stop_saves_what_came_since_the_last_paced_save(tmp_path: Path) -> None:
    with _broker(tmp_path, save_share=0.01) as (services, spec, servers):
        _fill(servers, megabytes=20)  # the next save is then far away
        producer = Producer({"bootstrap.servers": servers})
        before = high_of(servers)
        for n in range(5_000):
            producer.produce(TOPIC, b"record-%d" % n, partition=0)
        assert producer.flush(10) == 0
        started = time.monotonic()
        services.stop("kafka")
        assert time.monotonic() - started < PAUSE_MAX_S, "the stop waited for the paced pause"
        services.start(spec)
        after = high_of(servers)
    assert after - before == 5_000


def high_of(servers: str) -> int:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "count"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_a_preloaded_library_of_the_users_stays_preloaded_after_ours() -> None:
    env = noida_env(0.05, 30.0, {"LD_PRELOAD": "/opt/theirs.so"})
    assert env["LD_PRELOAD"] == f"{SAVE_PACING_LIBRARY} /opt/theirs.so"
    assert (env["NOIDA_SAVE_SHARE"], env["NOIDA_SAVE_PAUSE_MAX_MS"]) == ("0.05", "30000")


def test_without_the_library_the_broker_runs_at_its_own_pace(tmp_path: Path) -> None:
    env = noida_env(0.05, 30.0, {}, library=tmp_path / "missing.so")
    assert "LD_PRELOAD" not in env and "NOIDA_SAVE_SHARE" not in env
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072", "the malloc bounds stay"


def test_the_platforms_broker_is_paced_by_default(platform: GPULensSettings) -> None:
    pid = manager(platform).status("kafka").pid
    assert pid is not None
    environ = dict(
        entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
    )
    assert environ["NOIDA_SAVE_SHARE"] == f"{platform.platform.broker_save_share:g}"
    assert str(SAVE_PACING_LIBRARY) in Path(f"/proc/{pid}/maps").read_text(), "the library is loaded"
