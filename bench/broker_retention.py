"""The embedded broker's memory and CPU in a steady run, with and without the retention job.

    python -m bench.broker_retention [--gpus 20000] [--duration 300] [--modes off,on] [--keep 30]

Per mode, on a private platform of its own (noida-db, registry, chDB holder: free ports, a
temporary directory), `gpulens simulate` publishes a cluster of ``--gpus`` GPUs (8 a node, one
GpuSampleBatch a node every 2 s, plus its pods, containers and inventories) at real time for
``--duration`` s, while one consumer group, standing in for the pipeline's groups, reads every
topic the simulator writes and commits every second. In mode ``on`` a
:class:`gpulens.infra.retaining.Retainer` runs a pass every ``--interval`` s with that group required
and ``--keep`` s of consumed records kept (what `gpulens retention` does for the pipeline's
groups); ``off`` runs none. Every 10 s it prints the broker's RSS, its data directory on disk,
the records consumed and the broker's CPU seconds; at the end, the broker's peak and last RSS
and its CPU per 10,000 records consumed. Prints the figures; never asserts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer

from gpulens.config import GPULensSettings
from gpulens.infra.retaining import Retainer, RetentionError, RetentionPolicy
from gpulens.platform import BROKER, manager, private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import CATALOG

GROUP = "bench-retention"
TOPICS = tuple(t for t in CATALOG if not t.compacted)


def _proc(pid: int) -> tuple[int, float]:
    """RSS in MB and CPU seconds (user + system) of ``pid``."""
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss // 1024, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _disk_mb(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) // 1_000_000


def _consume(settings: GPULensSettings, stop: threading.Event, counted: list[int]) -> None:
    consumer = Consumer(
        settings.kafka.librdkafka(
            **{"group.id": GROUP, "auto.offset.reset": "earliest", "auto.commit.interval.ms": 1000}
        )
    )
    consumer.subscribe([t.name for t in TOPICS])
    while not stop.is_set():
        counted[0] += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
    consumer.close()


def _retain(settings: GPULensSettings, keep_s: float, interval_s: float, stop: threading.Event) -> None:
    policy = RetentionPolicy(topics=CATALOG, keep_ms=round(keep_s * 1000), required={GROUP: TOPICS})
    retainer = Retainer(settings.kafka, policy)
    while not stop.wait(interval_s):
        try:
            retainer.run_once()
        except RetentionError as err:
            print(f"  retention pass failed: {err}", flush=True)


def run_mode(mode: str, args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix=f"retention-{mode}-") as tmp,
        private_platform(Path(tmp)) as settings,
    ):
        config = Path(tmp) / "gpulens.toml"
        create_topics(settings.kafka)
        broker = manager(settings).status(BROKER).pid
        assert broker is not None
        stop, counted = threading.Event(), [0]
        threads = [threading.Thread(target=_consume, args=(settings, stop, counted))]
        if mode == "on":
            threads.append(threading.Thread(target=_retain, args=(settings, args.keep, args.interval, stop)))
        simulate = subprocess.Popen(
            [sys.executable, "-m", "gpulens", "--config", str(config), "simulate", "--churn", "0",
             "--nodes", str(args.gpus // 8), "--interval", "2", "--duration", str(args.duration)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for thread in threads:
            thread.start()
        began, (_rss, cpu0) = time.monotonic(), _proc(broker)
        peak = 0
        print(f"mode {mode}: {args.gpus:,} GPUs for {args.duration:g} s", flush=True)
        print(f"  {'t s':>5} {'RSS MB':>7} {'disk MB':>8} {'consumed':>10} {'CPU s':>7}", flush=True)
        try:
            while simulate.poll() is None:
                rss, cpu = _proc(broker)
                peak = max(peak, rss)
                print(
                    f"  {time.monotonic() - began:5.0f} {rss:7,} {_disk_mb(Path(tmp) / 'state'):8,} "
                    f"{counted[0]:10,} {cpu - cpu0:7.1f}",
                    flush=True,
                )
                time.sleep(10)
        finally:
            simulate.terminate()
            simulate.wait()
            stop.set()
            for thread in threads:
                thread.join()
        rss, cpu = _proc(broker)
        per_10k = (cpu - cpu0) / max(counted[0], 1) * 10_000
        print(
            f"  end: RSS {rss:,} MB (peak {max(peak, rss):,} MB), {counted[0]:,} records consumed, "
            f"broker CPU {cpu - cpu0:.1f} s = {per_10k:.2f} s per 10,000 records consumed",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=20_000)
    parser.add_argument("--duration", type=float, default=300.0, help="Seconds of publishing.")
    parser.add_argument("--modes", default="off,on", help="off: no retention; on: the retention job.")
    parser.add_argument("--keep", type=float, default=30.0, help="Seconds consumed records are kept.")
    parser.add_argument("--interval", type=float, default=10.0, help="Seconds between retention passes.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the platform on the way out
    for mode in args.modes.split(","):
        run_mode(mode, args)


if __name__ == "__main__":
    main()
