"""Restart cost of the worker: restore from checkpointed state versus re-reading history.

    python -m bench.restart [--nodes 1250] [--histories 10,60] [--new-seconds 40] [--cold]

For each history length (simulated minutes), on a private platform of its own (noida-db
broker, registry; free ports, a temporary directory):

1. ``gpulens simulate`` publishes the history: ``--nodes`` nodes of 8 GPUs sampled every 2 s
   (1,250 nodes = 10,000 GPUs), unpaced;
2. ``gpulens worker`` (every processor, 30 s windows) runs until its committed offsets reach
   the inputs' ends (its ``gpulens_consumer_lag_records`` reads 0), and is killed with SIGKILL;
3. a second simulation publishes ``--new-seconds`` of new data right after the history (the
   history's final watermark closed the window holding its end: the new data must reach past
   that window for a new row to exist);
4. the worker is started again, and measured from its start to its first new output row (the
   first ``cluster_gpu_allocation`` row of the cluster after the restart): wall seconds, its
   CPU seconds until then, the state keys it restored, the records it read and its peak RSS
   (the catch-up's peak RSS is shown too).

``--cold`` also measures the same restart with a new consumer group (no checkpoint: it reads
every input from the beginning, as every restart did before checkpoints) for the first
history length: the baseline. Prints the figures and the ratio of the longest history's
restart to the shortest's; never asserts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from bench.e2e_probes import usage
from gpulens.config import GPULensSettings
from gpulens.platform import free_port, private_platform
from gpulens.schemas.model.topics import CLUSTER_ALLOCATION

START = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = "restart-bench"
TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Restart:
    history_min: int
    catch_up_wall_s: float
    catch_up_cpu_s: float
    catch_up_peak_mb: float
    """Peak RSS of the worker catching up on the history."""
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
            f"{self.history_min:>8} min  {self.mode:<10} {self.catch_up_wall_s:>9.1f}"
            f" {self.catch_up_cpu_s:>9.1f} {self.catch_up_peak_mb:>9,.0f} {self.to_output_s:>12.2f}"
            f" {self.cpu_s:>9.2f} {self.restored_keys:>10,} {self.records_read:>11,} {self.peak_mb:>9,.0f}"
        )


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def simulate(config: Path, nodes: int, start: datetime, seconds: float, seed: int) -> None:
    command = gpulens(
        config, "simulate", "--cluster", CLUSTER, "--nodes", str(nodes), "--interval", "2",
        "--duration", str(seconds), "--speed", "0", "--seed", str(seed),
        "--start", start.isoformat().replace("+00:00", "Z"),
    )  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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


def wait_caught_up(port: int, worker: subprocess.Popen[bytes]) -> None:
    while metrics(port).get("gpulens_consumer_lag_records", -1) != 0:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited ({worker.returncode})")
        time.sleep(0.5)


def first_new_row(settings: GPULensSettings, worker: subprocess.Popen[bytes], began: float) -> float:
    """Wall seconds from ``began`` to the first cluster row the restarted worker publishes."""
    reader = Consumer(
        settings.kafka.librdkafka(**{"group.id": "restart-bench-rows", "isolation.level": "read_committed"})
    )
    _, end = reader.get_watermark_offsets(TopicPartition(CLUSTER_ALLOCATION.name, 0), timeout=10)
    reader.assign([TopicPartition(CLUSTER_ALLOCATION.name, 0, end)])
    try:
        while time.monotonic() - began < TIMEOUT_S:
            for message in reader.consume(100, 0.05):
                if message.error() is None and message.key() == CLUSTER.encode():
                    return time.monotonic() - began
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode})")
    finally:
        reader.close()
    raise SystemExit(f"no new row within {TIMEOUT_S} s of the restart")


def measure(nodes: int, minutes: int, new_seconds: float, *, cold: bool) -> Restart:
    directory = Path(tempfile.mkdtemp(prefix=f"gpulens-restart-{minutes}-"))
    with private_platform(directory) as settings:
        config, log = directory / "gpulens.toml", directory / "worker.log"
        print(f"  {minutes} min: publishing the history ...", file=sys.stderr, flush=True)
        simulate(config, nodes, START, minutes * 60, seed=1)
        port = free_port()
        began = time.monotonic()
        worker = start_worker(config, "bench", port, log)
        wait_caught_up(port, worker)
        at_end = usage([worker.pid])
        caught_up = (
            time.monotonic() - began,
            at_end.cpu_s if at_end else float("nan"),
            at_end.hwm_kb / 1024 if at_end else float("nan"),
        )
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        print(f"  {minutes} min: caught up in {caught_up[0]:.0f} s; killed; new data ...", file=sys.stderr)
        simulate(config, nodes, START + timedelta(minutes=minutes), new_seconds, seed=2)
        port = free_port()
        began = time.monotonic()
        worker = start_worker(config, "bench-cold" if cold else "bench", port, log)
        try:
            to_output = first_new_row(settings, worker, began)
            cpu = usage([worker.pid])
            seen = metrics(port)
        finally:
            worker.terminate()
            worker.wait(30)
        return Restart(
            minutes, *caught_up, to_output, cpu.cpu_s if cpu else float("nan"),
            int(seen.get("gpulens_worker_restored_state_keys", 0)),
            int(seen.get("gpulens_worker_records_in_total", 0)),
            cpu.hwm_kb / 1024 if cpu else float("nan"),
            "cold" if cold else "checkpoint",
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of 8 GPUs (1,250 = 10,000 GPUs)")
    parser.add_argument("--histories", default="10,60", help="history lengths, simulated minutes")
    parser.add_argument(
        "--new-seconds", type=float, default=40.0, help="new data after the kill (past a 30 s window's end)"
    )
    parser.add_argument("--cold", action="store_true", help="also measure a restart without checkpoint")
    options = parser.parse_args()
    histories = [int(m) for m in options.histories.split(",")]
    results = [measure(options.nodes, m, options.new_seconds, cold=False) for m in histories]
    if options.cold:
        results.append(measure(options.nodes, histories[0], options.new_seconds, cold=True))
    gpus = options.nodes * 8
    print(f"\nrestart of `gpulens worker` at {gpus:,} GPUs ({options.nodes:,} nodes, 2 s samples)")
    print(
        f"{'history':>12}  {'restart':<10} {'catch-up':>9} {'cpu':>9} {'peak':>9} {'to output':>12}"
        f" {'cpu':>9} {'restored':>10} {'records':>11} {'peak':>9}"
    )
    print(
        f"{'':>12}  {'':<10} {'wall s':>9} {'s':>9} {'RSS MB':>9} {'wall s':>12} {'s':>9} {'keys':>10}"
        f" {'read':>11} {'RSS MB':>9}"
    )
    for result in results:
        print(result.line())
    checkpointed = [r for r in results if r.mode == "checkpoint"]
    if len(checkpointed) > 1:
        first, last = checkpointed[0], checkpointed[-1]
        print(
            f"ratio {last.history_min} min / {first.history_min} min: to output "
            f"{last.to_output_s / first.to_output_s:.2f}, cpu {last.cpu_s / first.cpu_s:.2f}"
        )


if __name__ == "__main__":
    main()
