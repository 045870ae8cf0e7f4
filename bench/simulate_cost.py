"""What the load generator costs: CPU of the simulator process per second of real-time load.

    python -m bench.simulate_cost [--sizes 10000,30000,100000] [--duration 40] [--warmup 10]
                                  [--variants bare,columns,records] [--tree /path/to/other/checkout]

For each fleet size (GPUs; 8 per node, one GpuSampleBatch per node every 2 s, so 100,000 GPUs =
12,500 nodes = 6,250 batches/s = 50,000 GPU samples/s) and each variant, one process publishes
the fleet at real time into a private platform's broker, and its CPU (user + system, all its
threads, from ``/proc``) is read over the paced window (``--warmup`` s after its start, when
the burst of every node joining is over, to ``--duration``); then it is stopped. Variants:

* ``bare``: :mod:`bench.bare_producer`, pre-built bytes of every node's batch produced with a
  plain confluent-kafka Producer each interval: the floor, what moving the bytes costs;
* ``columns``: :mod:`bench.e2e_simulator` (`gpulens simulate --speed 1`'s code), the batches
  written by column (:class:`SampleBatchWriter`);
* ``records``: the same with ``--records``: each batch built and Avro-encoded as a record;
* ``tree``: :mod:`bench.e2e_simulator` of another checkout (``--tree``, with its own
  ``.venv`` if it has one; ``git archive main | tar -x -C DIR`` makes one): the simulator
  before this change, say.

Printed per size and variant: CPU as % of one core, CPU-seconds per 10,000 batches, the
simulator's p99 lateness (wall clock minus event time once an instant's batches were queued;
above the interval it cannot keep pace), and the load average (the machine is shared: CPU
seconds of the process are what count). Starts a private platform; never asserts, only prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.e2e_report import quantile
from gpulens.platform import private_platform
from gpulens.schemas.kafka.topic_admin import create_topics

_TICK = os.sysconf("SC_CLK_TCK")
VARIANTS = ("bare", "columns", "records", "tree")


@dataclass(frozen=True, slots=True)
class Row:
    gpus: int
    variant: str
    cpu_pct: float
    batches_s: float
    late_p99_s: float
    load: float


def cpu_seconds(pid: int) -> float:
    """User + system seconds of ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def command(
    variant: str, args: argparse.Namespace, config: Path, nodes: int, start_ms: int, out: Path
) -> tuple[list[str], Path | None]:
    """argv and working directory of ``variant``'s process."""
    common = ["--config", str(config), "--nodes", str(nodes), "--duration", str(args.duration),
              "--start-ms", str(start_ms), "--cluster", f"cost-{variant}-{nodes}"]  # fmt: skip
    if variant == "bare":
        return [sys.executable, "-m", "bench.bare_producer", *common], None
    argv = ["-m", "bench.e2e_simulator", *common, "--out", str(out)]
    if variant == "records":
        return [sys.executable, *argv, "--records"], None
    if variant == "columns":
        return [sys.executable, *argv], None
    tree: Path = args.tree
    assert tree is not None, "--tree names the checkout the 'tree' variant runs"
    python = tree / ".venv" / "bin" / "python"
    return [str(python) if python.exists() else sys.executable, *argv], tree


def run_one(variant: str, gpus: int, config: Path, tmp: Path, args: argparse.Namespace) -> Row:
    nodes = gpus // 8
    lead = args.lead + 0.006 * nodes  # the cluster's start is generated first (~3 ms a node)
    start = round(time.time() + lead, 3)
    out = tmp / f"{variant}-{gpus}.json"
    argv, cwd = command(variant, args, config, nodes, round(start * 1000), out)
    with (tmp / f"{variant}-{gpus}.log").open("wb") as log:
        process = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(max(0.0, start + args.warmup - time.time()))
        began, cpu_began = time.time(), cpu_seconds(process.pid)
        time.sleep(max(0.0, start + args.duration - time.time()))
        wall, cpu = time.time() - began, cpu_seconds(process.pid) - cpu_began
        load = os.getloadavg()[0]
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    late = float("nan")
    if out.exists():
        sim = json.loads(out.read_text())
        window = (start + args.warmup, start + args.duration)
        late = quantile(
            [(ms / 1000, n) for at, ms, n in sim["late_ms"] if window[0] <= at / 1000 < window[1]], 0.99
        )
    return Row(gpus, variant, 100 * cpu / wall, nodes / 2.0, late, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,30000,100000", help="Fleet sizes in GPUs.")
    parser.add_argument("--duration", type=float, default=40.0, help="Seconds each process publishes.")
    parser.add_argument("--warmup", type=float, default=10.0, help="Seconds after the start not measured.")
    parser.add_argument("--lead", type=float, default=8.0, help="Seconds to start a process [+ 6 ms a node].")
    parser.add_argument("--variants", default="bare,columns,records", help=f"Among {', '.join(VARIANTS)}.")
    parser.add_argument("--tree", type=Path, help="Another checkout, for the 'tree' variant.")
    args = parser.parse_args()
    variants = args.variants.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        for gpus in (int(size) for size in args.sizes.split(",")):
            for variant in variants:
                rows.append(run_one(variant, gpus, Path(tmp) / "gpulens.toml", Path(tmp), args))
                row = rows[-1]
                print(f"{row.gpus:>8,} GPUs  {row.variant:<8} {row.cpu_pct:6.1f} % of a core  "
                      f"late p99 {row.late_p99_s:5.2f} s  load {row.load:.1f}", flush=True)  # fmt: skip
    print(f"\n{'GPUs':>8} {'batches/s':>10} {'variant':<8} {'CPU % of a core':>16} "
          f"{'CPU-s per 10k batches':>22} {'late p99':>9} {'load avg':>9}")  # fmt: skip
    for row in rows:
        per_10k = row.cpu_pct / 100 / row.batches_s * 10_000
        print(f"{row.gpus:>8,} {row.batches_s:>10,.0f} {row.variant:<8} {row.cpu_pct:>15.1f}% "
              f"{per_10k:>22.2f} {row.late_p99_s:>8.2f}s {row.load:>9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
