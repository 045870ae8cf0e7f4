"""Idle cost of the pipeline: CPU per process over a minute once the demo's data is processed.

    python -m bench.idle_cost [--idle-s 60] [--probes 5]

On a private platform of its own (noida-db broker, registry, ClickHouse; free ports, a
temporary directory):

1. ``gpulens up`` starts everything as a user's does and replays the demo's traces;
2. the benchmark waits until every consumer group of the pipeline has drained (lag 0 in
   records, transaction markers excluded: :mod:`gpulens.draining`);
3. it reads the CPU seconds (utime + stime of ``/proc/PID/stat``) of every process ``up``
   started, the broker included, over ``--idle-s`` seconds;
4. latency when data resumes: it publishes one node record at a time and times how long the
   sink's group takes to commit past it (the sink writes node rows within
   ``state_batch_seconds``, 5 s by default, of the batch's first record), ``--probes`` times
   after a quiet spell of 5 s (the consumers' idle delay at its longest) and as many times as
   soon as the sink committed past the previous one;
5. the baseline: with the pipeline stopped, a bare confluent-kafka consumer assigned every
   partition of the catalog at its end (no pausing, librdkafka's defaults) idles on the same
   broker for as long, and the broker's and its CPU are read the same way;
6. ``gpulens down``.

Prints a table of CPU % of one core per process and the machine's load average; never asserts.
The machine is shared: run it when the load is low, and say the load with the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from bench.e2e_probes import descendants, usage
from gpulens.config import GPULensSettings, load_settings
from gpulens.draining import wait_drained
from gpulens.main_job import SUPERVISOR, stop_pipeline
from gpulens.platform import manager, write_private_config
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.kafka.lag import RecordLag
from gpulens.schemas.model.topics import CATALOG, NODES
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def process_trees(settings: GPULensSettings) -> dict[str, list[int]]:
    """Every process `up` started, by service name (the supervisor without its children: they
    are the pipeline's processes, counted by their own names)."""
    trees = {}
    for pidfile in sorted((settings.platform.state_dir / "run").glob("*.pid")):
        pid = int(json.loads(pidfile.read_text())["pid"])
        trees[pidfile.stem] = [pid] if pidfile.stem == SUPERVISOR else [pid, *descendants(pid)]
    return trees


def cpu_percent(trees: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """CPU % of one core of each tree over the next ``seconds``."""
    before = {name: usage(pids) for name, pids in trees.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = {name: usage(pids) for name, pids in trees.items()}
    return {
        name: 100 * (a.cpu_s - b.cpu_s) / elapsed
        for name in trees
        if (a := after[name]) is not None and (b := before[name]) is not None
    }


def resume_latency(settings: GPULensSettings, group: str, *, quiet_s: float, probes: int) -> list[float]:
    """Seconds from a node record's acknowledgement to ``group`` committing past it, ``probes``
    times, each after ``quiet_s`` of silence."""
    publisher = EventPublisher(settings.kafka, AvroCodec(registry_client(settings.registry.url)))
    lag = RecordLag(settings.kafka)
    partitions = [(NODES.name, p) for p in range(NODES.partitions)]
    at = datetime.now(UTC) - timedelta(hours=1)
    waited = []
    try:
        for probe in range(probes):
            time.sleep(quiet_s)
            node = example_events(cluster="idle-bench", source=f"probe-{quiet_s}-{probe}", at=at)[NODES]
            publisher.publish(NODES, node)
            publisher.flush(10)
            sent = time.monotonic()
            while any(lag.measure(group, partitions).values()):
                if time.monotonic() - sent > 30:
                    raise SystemExit(f"{group} did not take the probe record within 30 s")
                time.sleep(0.01)
            waited.append(time.monotonic() - sent)
    finally:
        publisher.close()
        lag.close()
    return waited


def bare_consumer(config: Path) -> None:
    """A consumer of every catalog partition at its end, polling forever (the baseline)."""
    settings = load_settings(config)
    consumer = Consumer(settings.kafka.librdkafka(**{"group.id": "idle-bench-bare"}))
    consumer.assign([TopicPartition(t.name, p, OFFSET_END) for t in CATALOG for p in range(t.partitions)])
    while True:
        consumer.consume(500, 1.0)


def table(title: str, figures: dict[str, float]) -> None:
    print(f"\n{title}")
    for name, percent in sorted(figures.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<12} {percent:6.2f} %")
    print(f"  {'total':<12} {sum(figures.values()):6.2f} % of one core")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--idle-s", type=float, default=60.0, help="seconds of idle measured")
    parser.add_argument("--probes", type=int, default=5, help="latency probes per case")
    parser.add_argument("--bare-consumer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_consumer is not None:
        bare_consumer(args.bare_consumer)
        return
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp:
        config = write_private_config(Path(tmp))
        settings = load_settings(config)
        try:
            print(f"gpulens up (private platform under {tmp}) ...", flush=True)
            started = time.monotonic()
            up = subprocess.run(gpulens(config, "up"), capture_output=True, text=True, check=False)
            if up.returncode != 0:
                raise SystemExit(f"gpulens up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
            drained = wait_drained(settings, timeout_s=600)
            if drained is None:
                raise SystemExit("the pipeline did not drain within 600 s")
            print(f"up and drained in {time.monotonic() - started:.0f} s", flush=True)
            trees = process_trees(settings)
            pipeline = cpu_percent(trees, args.idle_s)
            load = os.getloadavg()
            table(f"idle pipeline, {args.idle_s:.0f} s after draining (load {load[0]:.2f}):", pipeline)
            sink = settings.sink.group_id
            quiet = resume_latency(settings, sink, quiet_s=5.0, probes=args.probes)
            busy = resume_latency(settings, sink, quiet_s=0.0, probes=args.probes)
            print(
                "\nlatency to the sink's commit (it writes node rows within "
                f"state_batch_seconds = {settings.sink.state_batch_seconds:g} s):"
            )
            for case, waited in (("after 5 s quiet", quiet), ("right after the last", busy)):
                print(f"  {case:<20} median {statistics.median(waited):.2f} s, max {max(waited):.2f} s")
            services = manager(settings)
            stop_pipeline(services, lambda _line: None)
            bare = subprocess.Popen([sys.executable, "-m", "bench.idle_cost", "--bare-consumer", str(config)])
            try:
                time.sleep(10)  # connected and at the partitions' ends
                baseline = cpu_percent(
                    {"kafka": process_trees(settings)["kafka"], "bare consumer": [bare.pid]}, args.idle_s
                )
            finally:
                bare.kill()
                bare.wait()
            load = os.getloadavg()
            table(f"baseline: a bare confluent-kafka consumer, same broker (load {load[0]:.2f}):", baseline)
        finally:
            subprocess.run(gpulens(config, "down"), capture_output=True, check=False)


if __name__ == "__main__":
    main()
