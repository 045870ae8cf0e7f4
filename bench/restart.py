"""Restart cost of the worker: restore from checkpointed state versus re-reading history.

    python -m bench.restart [--nodes 1250] [--histories 10,60] [--history-speed 1.5]
                            [--new-seconds 40] [--keep-s 60] [--cold] [--profile]

For each history length (simulated minutes), on a private platform of its own (noida-db
broker, registry; free ports, a temporary directory):

1. ``gpulens worker`` (every processor, 30 s windows) starts on the empty inputs; once it
   has measured its lag, ``gpulens simulate`` publishes the history beside it, paced at
   ``--history-speed`` times real time: ``--nodes`` nodes of 8 GPUs sampled every 2 s (1,250
   nodes = 10,000 GPUs).
   A worker that keeps up keeps its lag, hence every fetch, small. An unpaced history
   caught up on afterwards cannot be built at 10,000 GPUs: noida-db ignores
   ``fetch.max.bytes`` and ``max.partition.fetch.bytes`` and answers a fetch with everything
   from its offset on, and a new group's first fetch of 60 minutes of it is a response of more
   than 2 GiB, which no client can receive. The speed must be one the worker keeps up with on
   the machine: the largest lag seen while following is printed (``max lag``). At 10,000 GPUs
   on the shared 2 cores (load 8-13) it followed about 1.4 times real time: at 2 its lag
   reached 120,000 records in 10 minutes, and 640,000 in 60 (after which noida-db, 7.8 GB
   resident, stopped answering);
2. the simulation goes on for ``--new-seconds`` past the history, one run with no break in it,
   as a cluster's sources go on publishing through a worker's crash; once the worker has
   published the ``cluster_gpu_allocation`` row of the window that ends where the history does,
   it is killed with SIGKILL (mid-stream: whatever its cycle held is aborted);
3. the rest of the simulation is published while the worker is down, at the same pace, with a
   watermark every wall second (the cadence of `gpulens simulate`'s sources);
4. the worker is started again, and measured from its start to its state restored (``restored``:
   its ``gpulens_worker_restored_state_keys`` is set; it then reads on) and to its first new
   output row (the first ``cluster_gpu_allocation`` row of the cluster after the restart: the
   window after the history's, which waits for the backlog to be read past its end, 30 of the
   40 s by default): wall seconds, its
   CPU seconds until then, the state keys it restored, the records it read and its peak RSS
   (the history's wall and CPU seconds and peak RSS are shown too). The restart only reads
   the new records (it restores its state from the changelogs), so its fetches stay small.

Beside the worker, the broker's retention runs as `gpulens up` runs it (a pass every 10 s,
``--keep-s`` of records kept once the worker's group has consumed them), the worker's group the
only one that holds records back. The broker's memory then follows the live state, not the
history (noida-db holds every retained record: 7.8 GB after 60 minutes without it), and a
restart can only rebuild from the checkpoints: the history is gone from the inputs.

``--cold`` also measures the same restart with a new consumer group (no checkpoint: it reads
every input from the beginning, as every restart did before checkpoints) for the first
history length: the baseline (on noida-db, only for a history short enough for one fetch).
Prints the figures and the ratio of the longest history's restart to the shortest's; never
asserts.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from bench.e2e_probes import usage
from bench.e2e_profiling import Profiler
from gpulens.config import GPULensSettings
from gpulens.infra.retaining import Retainer, RetentionMetrics, RetentionPolicy, run_retention
from gpulens.platform import free_port, private_platform
from gpulens.schemas.model.models import ClusterGpuAllocation
from gpulens.schemas.model.topics import CATALOG, CLUSTER_ALLOCATION
from gpulens.schemas.wire.codec import AvroCodec, registry_client

START = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = "restart-bench"
TIMEOUT_S = 600
RETENTION_EVERY_S = 10.0
"""As `gpulens up` runs retention (``retention.interval_s``)."""


@dataclass(frozen=True, slots=True)
class Restart:
    history_min: int
    history_wall_s: float
    """Worker start to its kill (its row of the history's last window published)."""
    history_cpu_s: float
    history_peak_mb: float
    """Peak RSS of the worker following the history."""
    max_lag: int
    """Largest lag (records) the worker read while following the history."""
    restored_s: float
    """Worker start to its state restored (``gpulens_worker_restored_state_keys`` set)."""
    to_output_s: float
    """Worker start to its first new output row."""
    cpu_s: float
    restored_keys: int
    records_read: int
    peak_mb: float
    """Peak RSS of the restarted worker until its first new row."""
    mode: str = "checkpoint"

    def line(self) -> str:
        return (
            f"{self.history_min:>8} min  {self.mode:<10} {self.history_wall_s:>9.1f}"
            f" {self.history_cpu_s:>9.1f} {self.history_peak_mb:>9,.0f} {self.max_lag:>9,}"
            f" {self.restored_s:>9.2f} {self.to_output_s:>10.2f}"
            f" {self.cpu_s:>9.2f} {self.restored_keys:>10,} {self.records_read:>11,} {self.peak_mb:>9,.0f}"
        )


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def simulate(
    config: Path, nodes: int, start: datetime, seconds: float, seed: int, speed: float
) -> subprocess.Popen[bytes]:
    """Start ``gpulens simulate`` at ``speed`` times real time (0: unpaced)."""
    command = gpulens(
        config, "simulate", "--cluster", CLUSTER, "--nodes", str(nodes), "--interval", "2",
        "--duration", str(seconds), "--speed", f"{speed:g}", "--seed", str(seed),
        "--start", start.isoformat().replace("+00:00", "Z"),
    )  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finished(process: subprocess.Popen[bytes]) -> None:
    if process.wait() != 0:
        raise SystemExit(f"{process.args!r} exited ({process.returncode})")


def metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def start_worker(config: Path, group: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = gpulens(config, "worker", "--group", group, "--metrics-port", str(port))
    with log.open("ab") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


def lag(port: int, worker: subprocess.Popen[bytes]) -> float:
    """The worker's last lag reading; -1 while it has none."""
    if worker.poll() is not None:
        raise SystemExit(f"the worker exited ({worker.returncode})")
    return metrics(port).get("gpulens_consumer_lag_records", -1)


def follow(
    settings: GPULensSettings,
    port: int,
    worker: subprocess.Popen[bytes],
    history: subprocess.Popen[bytes],
    minutes: int,
) -> int:
    """Wait, the paced ``history`` running with the worker beside it, for the worker's row of the
    window that ends ``minutes`` into the history; the largest lag read meanwhile."""
    end = START + timedelta(minutes=minutes)
    codec = AvroCodec(registry_client(settings.registry.url))
    reader = Consumer(
        settings.kafka.librdkafka(**{"group.id": "restart-bench-follow", "isolation.level": "read_committed"})
    )
    reader.assign([TopicPartition(CLUSTER_ALLOCATION.name, 0, OFFSET_BEGINNING)])
    largest, shown = 0, time.monotonic()
    try:
        while True:
            if history.poll() is not None:
                raise SystemExit(f"the history ended before the worker's row of the window ending at {end}")
            largest = max(largest, int(lag(port, worker)))
            for message in reader.consume(1_000, 1.0):
                if message.error() is None and message.key() == CLUSTER.encode():
                    row = codec.decode(CLUSTER_ALLOCATION, message.value() or b"", ClusterGpuAllocation)
                    if row.window_end >= end:
                        return largest
            if time.monotonic() - shown >= 60:
                shown = time.monotonic()
                print(
                    f"  {minutes} min: following, lag {largest:,} records at most",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        reader.close()


def first_new_row(
    settings: GPULensSettings, worker: subprocess.Popen[bytes], port: int, began: float
) -> tuple[float, float]:
    """Wall seconds from ``began`` to the restarted worker's state restored (its /metrics on
    ``port`` says how many keys), and to the first cluster row it publishes."""
    reader = Consumer(
        settings.kafka.librdkafka(**{"group.id": "restart-bench-rows", "isolation.level": "read_committed"})
    )
    _, end = reader.get_watermark_offsets(TopicPartition(CLUSTER_ALLOCATION.name, 0), timeout=10)
    reader.assign([TopicPartition(CLUSTER_ALLOCATION.name, 0, end)])
    restored = float("nan")
    try:
        while time.monotonic() - began < TIMEOUT_S:
            if math.isnan(restored) and metrics(port).get("gpulens_worker_restored_state_keys", 0) > 0:
                restored = time.monotonic() - began
            for message in reader.consume(100, 0.05):
                if message.error() is None and message.key() == CLUSTER.encode():
                    return restored, time.monotonic() - began
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode})")
    finally:
        reader.close()
    raise SystemExit(f"no new row within {TIMEOUT_S} s of the restart")


@contextmanager
def retention(settings: GPULensSettings, group: str, keep_s: float) -> Iterator[None]:
    """The broker's retention in a thread, ``group`` the only one holding records back (none
    when ``keep_s`` is negative)."""
    if keep_s < 0:
        yield
        return
    policy = RetentionPolicy(topics=CATALOG, keep_ms=round(keep_s * 1000), required={group: ()})
    metrics, stop = RetentionMetrics(), threading.Event()
    passes = threading.Thread(
        target=run_retention,
        args=(Retainer(settings.kafka, policy, metrics=metrics), metrics),
        kwargs={"interval_s": RETENTION_EVERY_S, "stop": stop},
        daemon=True,
    )
    passes.start()
    try:
        yield
    finally:
        stop.set()
        passes.join()


def measure(
    nodes: int,
    minutes: int,
    speed: float,
    new_seconds: float,
    keep_s: float,
    *,
    cold: bool,
    profiler: Profiler | None = None,
) -> Restart:
    directory = Path(tempfile.mkdtemp(prefix=f"gpulens-restart-{minutes}-"))
    with private_platform(directory) as settings, retention(settings, "bench", keep_s):
        config, log = directory / "gpulens.toml", directory / "worker.log"
        print(
            f"  {minutes} min: the worker follows the history at {speed:g}x ...", file=sys.stderr, flush=True
        )
        port = free_port()
        began = time.monotonic()
        worker = start_worker(config, "bench", port, log)
        while lag(port, worker) < 0:  # not measured yet: the worker is still starting
            time.sleep(0.5)
        simulation = simulate(config, nodes, START, minutes * 60 + new_seconds, 1, speed)
        try:
            largest = follow(settings, port, worker, simulation, minutes)
        except BaseException:  # leave no process behind the platform (Ctrl-C included)
            worker.kill()
            simulation.kill()
            raise
        at_end = usage([worker.pid])
        history = (
            time.monotonic() - began,
            at_end.cpu_s if at_end else float("nan"),
            at_end.hwm_kb / 1024 if at_end else float("nan"),
            largest,
        )
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        print(
            f"  {minutes} min: its last window out after {history[0]:.0f} s; killed; new data ...",
            file=sys.stderr,
        )
        finished(simulation)
        port = free_port()
        began = time.monotonic()
        worker = start_worker(config, "bench-cold" if cold else "bench", port, log)
        sampler = profiler.start(f"restart-{minutes}", worker.pid) if profiler else None
        try:
            restored, to_output = first_new_row(settings, worker, port, began)
            cpu = usage([worker.pid])
            seen = metrics(port)
        finally:
            Profiler.stop(sampler)
            worker.terminate()
            worker.wait(30)
        result = Restart(
            minutes, *history, restored, to_output, cpu.cpu_s if cpu else float("nan"),
            int(seen.get("gpulens_worker_restored_state_keys", 0)),
            int(seen.get("gpulens_worker_records_in_total", 0)),
            cpu.hwm_kb / 1024 if cpu else float("nan"),
            "cold" if cold else "checkpoint",
        )  # fmt: skip
        print(result.line(), file=sys.stderr, flush=True)  # kept should a later history fail
        return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of 8 GPUs (1,250 = 10,000 GPUs)")
    parser.add_argument("--histories", default="10,60", help="history lengths, simulated minutes")
    parser.add_argument(
        "--history-speed",
        type=float,
        default=1.5,
        help="history's pace, times real time (the worker must keep up: 1.5 at 10,000 GPUs, quiet)",
    )
    parser.add_argument(
        "--new-seconds",
        type=float,
        default=40.0,
        help="data published while the worker is down (past a 30 s window)",
    )
    parser.add_argument(
        "--keep-s",
        type=float,
        default=60.0,
        help="seconds the broker keeps a record the worker has consumed (negative: no retention)",
    )
    parser.add_argument("--cold", action="store_true", help="also measure a restart without checkpoint")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the restarted worker to its first new row (pip install py-spy)",
    )
    options = parser.parse_args()
    histories = [int(m) for m in options.histories.split(",")]
    speed, new_seconds = options.history_speed, options.new_seconds
    keep_s = options.keep_s
    profiler = Profiler(Path(tempfile.mkdtemp(prefix="gpulens-restart-py-spy-"))) if options.profile else None
    results = [
        measure(options.nodes, m, speed, new_seconds, keep_s, cold=False, profiler=profiler)
        for m in histories
    ]
    if options.cold:
        results.append(measure(options.nodes, histories[0], speed, new_seconds, -1.0, cold=True))
    gpus = options.nodes * 8
    print(f"\nrestart of `gpulens worker` at {gpus:,} GPUs ({options.nodes:,} nodes, 2 s samples)")
    print(
        f"{'history':>12}  {'restart':<10} {'history':>9} {'cpu':>9} {'peak':>9} {'max':>9}"
        f" {'restored':>9} {'to output':>10}"
        f" {'cpu':>9} {'restored':>10} {'records':>11} {'peak':>9}"
    )
    print(
        f"{'':>12}  {'':<10} {'wall s':>9} {'s':>9} {'RSS MB':>9} {'lag':>9} {'wall s':>9} {'wall s':>10}"
        f" {'s':>9}"
        f" {'keys':>10} {'read':>11} {'RSS MB':>9}"
    )
    for result in results:
        print(result.line())
    checkpointed = [r for r in results if r.mode == "checkpoint"]
    if len(checkpointed) > 1:
        first, last = checkpointed[0], checkpointed[-1]
        print(
            f"ratio {last.history_min} min / {first.history_min} min: to output "
            f"{last.to_output_s / first.to_output_s:.2f}, cpu {last.cpu_s / first.cpu_s:.2f}, "
            f"restored {last.restored_s / first.restored_s:.2f}"
        )
    for name, summary in (profiler.summaries() if profiler else {}).items():
        print(f"\npy-spy of the restarted worker, {name}, from its start to its first new row:\n{summary}")


if __name__ == "__main__":
    main()
