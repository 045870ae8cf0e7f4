"""Faults in turn on one running pipeline, and ClickHouse still equals the trace.

A private platform runs the sink, the allocation worker and the exporter under a real
supervisor while the Alibaba trace is replayed at a speed that spreads it over about a
minute. Meanwhile the ClickHouse engine's disk fills up and is freed again, the broker is killed
with SIGKILL and restarted (it comes back from its last save, having lost what it acknowledged
since), then each of the others is killed with SIGKILL, then the broker is stopped (SIGSTOP) for
30 s. Afterwards: ClickHouse's allocation rows (FINAL) equal the CSV's oracle, raw rows are not
multiplied, no record was dead-lettered, and no process crash-looped.

The engine's data directory sits on a tmpfs of its own (mounted as root; the test is skipped,
saying why, where mounting is not allowed), so a ballast file fills exactly that disk: the
engine answers NOT_ENOUGH_SPACE (243, HTTP 507) and the sink retries until the ballast is gone.

The broker's SIGKILL used to stop the pipeline for good: the restarted broker took the
worker's queued records on partitions whose sequence was in step, opening a transaction it has
no coordinator state for, the worker died of the out-of-sequence batches on the others, and
that transaction stayed open (the sink read 1,177 of 4,338 offsets of the allocation topic,
ClickHouse stopped at 838 of the trace's windows). The worker now aborts such transactions
(:mod:`gpulens.pipeline.hanging_transactions`).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, TopicPartition
from hostile_support import metric, wait
from worker_support import PODS_CSV, gpulens, replay

from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.infra.launching import ServiceManager, ServiceSpec, State
from gpulens.infra.supervising import Supervisor
from gpulens.main_job import EXPORTER, SINK, WORKER, pipeline_specs
from gpulens.platform import BROKER, free_port, manager, service_specs
from gpulens.schemas.model.topics import DLQ

EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
SPEED = "200000"
"""The trace's five months in about a minute: the faults hit it while it flows."""
STALL_S = 15.0
"""Three of the worker's per-call timeouts (5 s): its transactional calls time out and are
repeated while the broker is stopped."""
HANGING_S = 20.0
"""The worker's ``--hanging-transaction``: a transaction the restarted broker forgot is aborted
after this long instead of the default 75 s (the same code path, a shorter wait)."""
MAX_RESTARTS = {WORKER: 2, SINK: 1, EXPORTER: 1}
"""Per process: its kill, and nothing after it; the worker may also exit once after the
broker's SIGKILL (its producer's fatal out-of-sequence error, or a transactional call wedged
in librdkafka: a restart fences it and redoes the cycle)."""
DISK_MB = 256
"""The engine's disk: room for the migrations and the trace's rows, filled by a ballast file."""


class Disk:
    """A size-limited filesystem (tmpfs) mounted at ``path``, and a ballast file to fill it."""

    def __init__(self, path: Path) -> None:
        self.path, self._ballast = path, path / "ballast"

    def fill(self) -> None:
        """Write the ballast until the disk has no byte left (unbuffered: a short write takes
        the last bytes, the next one fails)."""
        with self._ballast.open("wb", buffering=0) as ballast:
            try:
                while True:
                    ballast.write(bytes(1 << 20))
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise

    def free(self) -> None:
        self._ballast.unlink()


@pytest.fixture
def clickhouse_disk(tmp_path: Path) -> Iterator[Disk]:
    """The engine's data directory of the private platform under ``tmp_path``, on its own tmpfs."""
    path = tmp_path / "state" / "clickhouse"  # where write_private_config puts the engine's data
    path.mkdir(parents=True)
    mounting = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}M", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounting.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount, not allowed here: {mounting.stderr.strip()}")
    try:
        yield Disk(path)
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.fixture
def own_platform(clickhouse_disk: Disk, own_platform):
    """conftest's private platform, started on top of the engine's own small disk."""
    return own_platform


def _specs(settings: GPULensSettings, config, sink_metrics: int) -> list[ServiceSpec]:
    specs = pipeline_specs(settings, config)
    allocation = ["--window", "3600", "--no-nodes", "--processors", "allocation"]
    hanging = ["--hanging-transaction", str(HANGING_S)]
    worker = ServiceSpec(WORKER, gpulens(config, "worker", *allocation, *hanging))
    sink = ServiceSpec(SINK, [*specs[SINK].argv, "--metrics-port", str(sink_metrics)])
    return [worker, sink, specs[EXPORTER]]


def _kill(services: ServiceManager, name: str) -> None:
    """SIGKILL ``name``'s process group and wait until that process is gone (the supervisor
    may already run its successor)."""
    pid = services.status(name).pid
    assert pid is not None, f"{name} is not running"
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (now := services.status(name)).state is State.RUNNING and now.pid == pid:
        assert time.monotonic() < deadline, f"{name} outlived SIGKILL"
        time.sleep(0.05)


def _restarted(supervisor: Supervisor, name: str) -> Callable[[], bool]:
    return lambda: any(r.name == name for r in supervisor.restarts)


def test_every_fault_in_turn_leaves_clickhouse_equal_to_the_trace(
    clickhouse_disk, own_platform, unique, spawned
) -> None:
    settings, config = own_platform
    cluster, sink_metrics = f"faults-{unique}", free_port()
    services = manager(settings)
    migrate(settings.clickhouse, samples_ttl_days=30)  # the tables exist before anything is counted
    supervisor = Supervisor(services, _specs(settings, config, sink_metrics), backoff_s=0.5, stable_s=5.0)
    stop = threading.Event()
    supervising = threading.Thread(target=supervisor.run, args=(stop,), name="supervisor")
    supervising.start()
    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    expected = expected_rows(PODS_CSV, 3600)

    def stored(final: str) -> int:
        return int(
            client.query(
                f"SELECT count() FROM cluster_gpu_allocation {final} WHERE cluster = {{c:String}}",
                parameters={"c": cluster},
            ).result_rows[0][0]
        )

    try:
        wait(lambda: all(services.status(n).state is State.RUNNING for n in (WORKER, SINK, EXPORTER)), 120,
             "the pipeline up")  # fmt: skip
        source = replay(config, cluster, "--speed", SPEED)
        spawned.append(source)
        wait(lambda: stored("FINAL") > 0, 120, "the first allocation rows in ClickHouse", source)
        retried = metric(sink_metrics, "gpulens_sink_retries_total")
        clickhouse_disk.fill()
        try:  # the sink's writes fail (243 NOT_ENOUGH_SPACE) and are retried, not fatal
            wait(lambda: metric(sink_metrics, "gpulens_sink_retries_total") >= retried + 3, 60,
                 "the sink retrying against the full disk")  # fmt: skip
        finally:
            clickhouse_disk.free()
        full = stored("")
        wait(lambda: stored("") > full, 60, "rows stored once the disk has room again")
        # while the worker publishes (a tenth of the windows in): its transaction is open
        wait(lambda: stored("") >= len(expected) // 10, 120, "the worker publishing", source)
        before = stored("")
        _kill_broker(settings, config, services)
        # through the restarted broker before any other fault: a transaction it forgot holds
        # the sink back until the worker aborts it (HANGING_S held back, checked every 10 s)
        wait(lambda: stored("") > before, 150, "rows published after the broker's restart")
        for name in (SINK, WORKER, EXPORTER):
            _kill(services, name)
            wait(_restarted(supervisor, name), 30, f"{name} restarted")
        broker = services.status(BROKER).pid
        assert broker is not None
        os.killpg(broker, signal.SIGSTOP)
        stopped = time.monotonic()
        try:  # the fault itself lasts this long; nothing may exit meanwhile
            wait(lambda: time.monotonic() - stopped >= STALL_S, STALL_S + 5, "the stall to last")
        finally:
            os.killpg(broker, signal.SIGCONT)
        assert source.wait(180) == 0, "the replay finished"
        wait(lambda: stored("FINAL") == len(expected), 180, "every window in ClickHouse")
        rows = client.query(
            "SELECT toUnixTimestamp(window_start) - {e:Int64}, gpus_allocated_avg, gpus_allocated_max,"
            " gpus_allocated_end, pods_running_end, pods_pending_end FROM cluster_gpu_allocation FINAL"
            " WHERE cluster = {c:String} ORDER BY window_start",
            parameters={"c": cluster, "e": int(EPOCH.timestamp())},
        ).result_rows
        raw = stored("")
        # A start while the broker is stopped fails at once with 69 (EX_UNAVAILABLE) and is
        # retried: not a crash.
        restarts = [r.name for r in supervisor.restarts if r.exit_status != "exit code 69"]
    finally:
        stop.set()
        supervising.join(120)
    oracle = [
        (e.window_start, e.gpus_allocated_avg, e.gpus_allocated_max, e.gpus_allocated_end,
         e.pods_running_end, e.pods_pending_end)
        for e in expected
    ]  # fmt: skip
    assert [r[0] for r in rows] == [o[0] for o in oracle]
    for row, want in zip(rows, oracle, strict=True):
        assert row[1:4] == pytest.approx(want[1:4]) and row[4:] == want[4:], (row, want)
    assert raw <= 2 * len(expected), f"raw rows multiplied: {raw} for {len(expected)} windows"
    assert _dead_letters(settings) == 0, "clean data: nothing dead-lettered"
    assert all(restarts.count(n) <= most for n, most in MAX_RESTARTS.items()), restarts


def _kill_broker(settings: GPULensSettings, config, services: ServiceManager) -> None:
    """SIGKILL the broker while the worker writes, and start it again from its last save."""
    pid = services.status(BROKER).pid
    assert pid is not None, "the broker is not running"
    os.killpg(pid, signal.SIGKILL)
    wait(lambda: services.status(BROKER).state is not State.RUNNING, 10, "the broker gone")
    services.reap(BROKER)
    services.start(service_specs(settings, config)[BROKER])


def _dead_letters(settings: GPULensSettings) -> int:
    consumer = Consumer(settings.kafka.librdkafka(**{"group.id": "dlq-count"}))
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(DLQ.name, p), timeout=30)[1]
            for p in range(DLQ.partitions)
        )
    finally:
        consumer.close()
