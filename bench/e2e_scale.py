"""End to end at fleet scale: simulator -> broker -> worker + sink -> ClickHouse, paced at real time.

    python -m bench.e2e_scale [--sizes 1000,10000,100000] [--duration 60] [--find-max] [--profile worker]

For each fleet size (GPUs; nodes of ``--gpus-per-node`` GPUs, one GpuSampleBatch per node every
``--interval`` s, so 100,000 GPUs = 12,500 nodes = 6,250 records/s = 50,000 GPU samples/s) it
starts a private platform (noida-db broker, schema registry, chDB holder: free ports, a
temporary directory), then the pipeline as a deployment runs it, as subprocesses: ``gpulens
worker --window 30 --processors allocation,workloads,alerts,changelog`` (the Kubernetes
manifest's worker: node rows and the cluster overview on), ``gpulens sink`` (default batches:
100,000 rows or 1 s), ``gpulens exporter`` (``--no-exporter`` leaves it out) and, on noida-db,
``gpulens retention`` (its job holds records the exporter's group has not consumed: without the
exporter it deletes no GPU samples). Then the
simulator (:mod:`bench.e2e_simulator`: `gpulens simulate`'s code with an exact start) publishes
the cluster at real time for ``--duration`` s, and the run waits up to ``--drain-timeout`` s
for the pipeline to catch up. Measured, over the *steady window* (``--warmup`` s after the
start, when the burst of every node joining is over, to the end of publishing):

* **offered**: records/s arriving on the simulator's topics (broker end offsets) and GPU
  samples/s published (the simulator's own count);
* **sustained**: rows/s becoming visible in ``gpu_samples`` and records/s the worker committed;
* **end-to-end latency**, event time to the row being visible in ClickHouse: every
  ``--poll`` s (0.5) the benchmark asks ClickHouse for ``count()`` of the cluster's
  ``gpu_samples`` rows per event time; rows counted for the first time get the wall time the
  poll was sent minus their event time. This is an upper bound: a row became visible at most
  one poll interval earlier. p50 / p99 / max cover the rows whose event time is in the
  steady window; a published row still missing when the run ends counts as infinitely late.
  The simulator's own lateness (wall clock minus event time when it handed each batch to the
  producer; all nodes sample at the same instant, so every interval is a burst of one record
  per node) is shown beside it: it is part of the end-to-end figure;
* **lag** of the worker's and the sink's consumer groups (end offsets minus committed,
  sampled every second): at the start and end of the steady window, the maximum, the trend
  (least-squares records/s of the lag's floor, the least lag of each 10 s: lag drops at each
  commit, and the worker's cycles stretch under load up to 10 s), and how many seconds of input
  the end lag is. It *grows* when the trend exceeds 5 % of the input rate and the floor of the
  last 10 s exceeds 6 s of input;
* **CPU** (user + system seconds over wall seconds of the steady window, % of one core; this
  machine has 2) and **peak RSS** (VmHWM) of each process from ``/proc``, and the most RSS the
  system under test (broker, registry, ClickHouse holder, worker, sink, exporter, retention)
  held at once, over the whole run and within the steady window; and **RSS over time**: each
  process's and the system's every 60 s from the simulator's start to the end of publishing;
* the **worker's cycles**: how many it committed over the steady window and its last commit's
  time (its /metrics at both ends), since cycles stretch under load.

A size fails when a lag grows, p99 exceeds ``--p99-limit`` (5 s), the system under test held
more than ``--rss-limit`` (1,500 MB, issue 15's bound) at once within the steady window, rows
are missing at the end, the retention job dropped records a group had not consumed (its cap,
``retention.max_records_per_partition``: counted from its /metrics), or the simulator cannot
publish an interval's batches within the interval (it shares the 2 cores; real agents run on
the GPU nodes). ``--find-max`` steps the fleet up by ``--step``
from ``--start-gpus`` until a size fails and prints the highest one that passed.
Before each size, :mod:`bench.machine_speed`'s fixed loop tells how fast the machine is (the
figures differ by machine). ``--profile worker,sink`` samples those processes with py-spy
(installed separately) over the steady window (`--profile-start`: over the start, until the
window) and prints their hottest functions. Starts everything itself; never asserts.

The processes run ``python -m gpulens`` in the bench's working directory, which ``-m`` puts
first on the path: to measure another commit, start the bench inside a worktree of it
(``PYTHONPATH`` pointing at one from this tree is not enough).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from confluent_kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from bench.e2e_probes import OffsetSampler, ProcessSampler, RowPoller
from bench.e2e_profiling import Profiler
from bench.e2e_report import (
    RSS_STEP_S,
    START_PAST_WARMUP_S,
    START_STEP_S,
    SYSTEM,
    SizeResult,
    first_time,
    lag_of,
    machine_of,
    nearest,
    processes_of,
    pss_over_time,
    quantile,
    rss_over_time,
    rss_spread,
    slope,
    steps,
    system_pss_kb,
    tables,
)
from bench.machine_speed import loop_cpu_s
from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.rows import SINK_TOPICS
from gpulens.infra.launching import port_open
from gpulens.main_job import EXPORTER, RETENTION, SINK, WORKER, WORKER_NICE, pipeline_specs
from gpulens.pipeline.operators import INPUT_ORDER
from gpulens.platform import BROKER, CLICKHOUSE, REGISTRY, free_port, manager, private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    WORKLOADS,
)

ORDER = ("broker", "registry", "clickhouse", "worker", "sink", "exporter", "retention", "simulator", "bench")
SIMULATED = (NODES, DEVICE_INVENTORY, CONTAINERS, PODS, WORKLOADS, GPU_SAMPLES, WATERMARKS)
"""The topics the simulator publishes to."""
PROBE_GROUP = "gpulens-e2e-probe"
"""A group that never commits: its 'lag' is the end offsets of the simulator's topics."""


@dataclasses.dataclass(frozen=True)
class Options:
    """How each size is run (the command's options)."""

    gpus_per_node: int = 8
    interval_s: float = 2.0
    duration_s: float = 60.0
    warmup_s: float = 10.0
    drain_timeout_s: float = 30.0
    lead_s: float | None = None
    """Seconds between launching the simulator and its start (None: by size)."""
    poll_s: float = 0.5
    window_s: int = 30
    processors: str = "allocation,workloads,alerts,changelog"
    exporter: bool = True
    broker: str = "noida"
    p99_limit_s: float = 5.0
    rss_limit_mb: float = 1_500.0
    """The most RSS the system under test may hold at once within the steady window (0: no bound)."""
    profile: tuple[str, ...] = ()
    profile_rate: int = 25
    profile_start: bool = False
    """Profile the start (the simulator's start to the steady window's) instead of the steady window."""
    keep: bool = False

    def lead_for(self, nodes: int) -> float:
        """Time for the simulator to start and generate the cluster's start (~3 ms a node here)."""
        return self.lead_s if self.lead_s is not None else 5.0 + 0.004 * nodes


class Processes:
    """The pipeline's processes of one run: started with a log each, stopped with SIGTERM."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, name: str) -> Path:
        return self._logs / f"{name}.log"

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        ready: Callable[[], bool] | None = None,
        timeout: float = 120.0,
        env: Mapping[str, str] = MappingProxyType({}),
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` (``env`` added to this environment); with ``ready``, wait until it
        holds (or fail with the log's tail)."""
        self._logs.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env},
            )
        self.running[name] = process
        deadline = time.monotonic() + timeout
        while ready is not None and not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{self.tail(name)}")
            time.sleep(0.2)
        return process

    def logged(self, name: str, text: str) -> Callable[[], bool]:
        """A readiness check: ``text`` appeared in the log of ``name``."""
        return lambda: text in self.log(name).read_text(errors="replace")

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, name: str, timeout: float = 30.0) -> None:
        process = self.running.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def stop_all(self) -> None:
        for name in reversed(list(self.running)):
            self.stop(name)


def _partitions(topics: object) -> list[TopicPartition]:
    return [TopicPartition(t.name, p) for t in topics for p in range(t.partitions)]  # type: ignore[attr-defined]


def _worker_inputs(options: Options) -> list[TopicPartition]:
    from gpulens.pipeline.alerting import AlertRules
    from gpulens.pipeline.operators import (
        AlertOperator,
        AllocationOperator,
        DeviceChangelogOperator,
        Operator,
        WorkloadUsageOperator,
    )
    from gpulens.pipeline.windows import TumblingWindows

    windows = TumblingWindows(options.window_s * 1000)
    make: dict[str, Callable[[], Operator]] = {
        "allocation": lambda: AllocationOperator(windows, per_node=True, overview=True),
        "workloads": lambda: WorkloadUsageOperator(windows),
        "alerts": lambda: AlertOperator(AlertRules()),
        "changelog": DeviceChangelogOperator,
    }
    chosen = {spec for name in options.processors.split(",") for spec in make[name.strip()]().inputs}
    return _partitions(spec for spec in INPUT_ORDER if spec in chosen)


@contextmanager
def _pipeline(
    settings: GPULensSettings, config: Path, logs: Path, options: Options, worker_metrics: int
) -> Iterator[Processes]:
    """The worker (its /metrics on ``worker_metrics``), the sink and the exporter, started and
    ready; stopped at the end."""
    processes = Processes(logs)
    gpulens = [sys.executable, "-m", "gpulens", "--config", str(config)]
    specs = pipeline_specs(settings, config)  # as `gpulens up` runs them: their allocator
    try:
        processes.start(
            "sink", [*gpulens, "sink"], ready=processes.logged("sink", "sinking "), env=specs[SINK].env
        )
        processes.start(
            "worker",
            [
                *gpulens, "worker", "--window", str(options.window_s), "--processors", options.processors,
                "--metrics-port", str(worker_metrics), "--nice", str(WORKER_NICE),  # as `gpulens up` runs it
            ],
            ready=processes.logged("worker", "gpulens.pipeline.running: worker "),
            env=specs[WORKER].env,
        )  # fmt: skip
        if options.exporter:
            exporter = settings.exporter
            processes.start(
                "exporter",
                [*gpulens, "exporter"],
                ready=lambda: port_open(exporter.host, exporter.port),
                env=specs[EXPORTER].env,
            )
        if RETENTION in specs:  # as `gpulens up` runs it on noida-db
            retention = settings.retention
            processes.start(
                RETENTION,
                [*gpulens, "retention"],
                ready=lambda: port_open(retention.metrics_host, retention.metrics_port),
            )
        yield processes
    finally:
        processes.stop_all()


def run_size(gpus: int, options: Options, *, echo: Callable[[str], None] = print) -> SizeResult:
    """Run one fleet size on a private platform of its own; every figure of it."""
    nodes = math.ceil(gpus / options.gpus_per_node)
    result = SizeResult(nodes, nodes * options.gpus_per_node, options.interval_s, options.duration_s)
    result.machine_loop_s = loop_cpu_s()
    tmp = Path(tempfile.mkdtemp(prefix=f"gpulens-e2e-{nodes}-"))
    try:
        with private_platform(tmp, broker=options.broker) as settings:
            create_topics(settings.kafka)
            services = manager(settings)
            platform = {
                name: pid
                for name, service in (("broker", BROKER), ("registry", REGISTRY), ("clickhouse", CLICKHOUSE))
                if (pid := services.status(service).pid) is not None
            }
            metrics = free_port()
            with _pipeline(settings, tmp / "gpulens.toml", tmp / "logs", options, metrics) as processes:
                _SizeRun(settings, tmp, processes, platform, nodes, options, metrics).measure(result)
                echo(f"   {result.gpus:,} GPUs: {result.verdict}")
    finally:
        if options.keep:
            echo(f"   kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


@dataclasses.dataclass
class _SizeRun:
    """One size on a running platform and pipeline: the simulator, the probes, the figures."""

    settings: GPULensSettings
    tmp: Path
    processes: Processes
    platform: dict[str, int]
    """pids of the platform's services."""
    nodes: int
    options: Options
    worker_metrics: int
    """The worker's /metrics port."""

    def measure(self, result: SizeResult) -> None:
        """Run the simulator while the probes watch, wait for the pipeline to catch up, analyse."""
        options, settings = self.options, self.settings
        cluster = f"e2e-{self.nodes}"
        sampler = ProcessSampler()
        for name, pid in {**self.platform, **{n: p.pid for n, p in self.processes.running.items()}}.items():
            sampler.add(name, pid)
        sampler.add("bench", os.getpid(), children=False)  # its children are measured apart
        offsets = OffsetSampler(
            settings.kafka,
            {
                "worker": ("gpulens-worker", _worker_inputs(options)),
                "sink": (settings.sink.group_id, _partitions(SINK_TOPICS)),
                "published": (PROBE_GROUP, _partitions(SIMULATED)),
            },
        )
        rows = RowPoller(settings.clickhouse, cluster, every_s=options.poll_s)
        for probe in (sampler, offsets, rows):
            probe.start()
        lead = options.lead_for(self.nodes)
        start_s = round(time.time() + lead, 3)
        steady = (start_s + options.warmup_s, start_s + options.duration_s)
        profiler = Profiler(self.tmp / "profiles", rate=options.profile_rate)
        worker_at: list[dict[str, float]] = []
        """The worker's metrics at the steady window's start and end."""
        timers = [
            threading.Timer(max(0.0, at - time.time()), lambda: worker_at.append(self._worker_metrics()))
            for at in steady
        ]
        for timer in timers:
            timer.start()
        out = self.tmp / "simulator.json"
        try:
            simulator = self.processes.start(
                "simulator",
                [
                    sys.executable, "-m", "bench.e2e_simulator", "--config", str(self.tmp / "gpulens.toml"),
                    "--nodes", str(self.nodes), "--gpus-per-node", str(options.gpus_per_node),
                    "--interval", str(options.interval_s), "--duration", str(options.duration_s),
                    "--start-ms", str(round(start_s * 1000)), "--cluster", cluster, "--out", str(out),
                ],
            )  # fmt: skip
            sampler.add("simulator", simulator.pid)
            pids = {**self.platform, **{n: p.pid for n, p in self.processes.running.items()}}
            since, until = (start_s, steady[0]) if options.profile_start else steady
            for name in options.profile:
                if name in pids:
                    args = (name, pids[name], until - since)
                    timers.append(threading.Timer(max(0.0, since - time.time()), profiler.record, args))
                    timers[-1].start()
            rc = simulator.wait(lead * 3 + options.duration_s * 4 + 120)
            if rc != 0:
                raise RuntimeError(f"the simulator failed (exit {rc}):\n{self.processes.tail('simulator')}")
            published_end = time.time()
            sim = json.loads(out.read_text())
            self._drain(rows, offsets, int(sim["samples"]), published_end + options.drain_timeout_s)
            if RETENTION in self.processes.running:
                result.dropped = _dropped(settings)
        finally:
            for timer in timers:
                timer.cancel()
                timer.join()
            for probe in (rows, offsets, sampler):
                probe.stop()
        result.profiles = profiler.summaries()
        if len(worker_at) == 2:
            result.worker_cycles = round(worker_at[1][CYCLES] - worker_at[0][CYCLES])
            result.worker_commit_s = worker_at[1][COMMIT_SECONDS]
            result.worker_held_peak = round(worker_at[1].get(HELD_PEAK, 0))
        _analyse(result, sim, sampler, offsets, rows, steady, published_end, options)

    def _worker_metrics(self) -> dict[str, float]:
        """The worker's cycle counter, last commit's time and most records held, from its /metrics."""
        url = f"http://127.0.0.1:{self.worker_metrics}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in (CYCLES, COMMIT_SECONDS, HELD_PEAK)
        }

    @staticmethod
    def _drain(rows: RowPoller, offsets: OffsetSampler, expected: int, deadline: float) -> None:
        """Wait until every published sample is a visible row and the worker committed its input."""
        while time.time() < deadline:
            worker = offsets.series[-1][1].get("worker") if offsets.series else None
            if rows.visible >= expected and worker is not None and worker[0] >= worker[1]:
                return
            time.sleep(0.5)


CYCLES, COMMIT_SECONDS, HELD_PEAK = (
    "gpulens_worker_cycles_total",
    "gpulens_worker_commit_seconds",
    "gpulens_worker_buffered_records_peak",
)
"""The worker's metrics read at the steady window's ends."""


def _dropped(settings: GPULensSettings) -> dict[str, int]:
    """Per topic, the records the retention job's cap deleted unconsumed (its /metrics)."""
    retention = settings.retention
    url = f"http://{retention.metrics_host}:{retention.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        sample.labels["topic"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "gpulens_retention_dropped_records"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.value
    }


def _analyse(
    result: SizeResult,
    sim: dict[str, Any],
    sampler: ProcessSampler,
    offsets: OffsetSampler,
    rows: RowPoller,
    steady: tuple[float, float],
    published_end: float,
    options: Options,
) -> None:
    """Fill ``result`` from the simulator's counts and the probes' series."""
    begin, end = steady
    by_ms = {int(k): int(v) for k, v in sim["samples_by_ms"].items()}
    result.published_records = int(sim["records"])
    result.published_samples = sum(by_ms.values())
    result.sim_prime_s = float(sim["primed_s"])
    result.sim_prime_overrun_s = float(sim["prime_overrun_s"])
    result.rows_visible = rows.visible
    in_window = {ms: n for ms, n in by_ms.items() if begin <= ms / 1000 < end}
    # Samples come in ticks, one every interval (all nodes at the same instant): per tick.
    result.offered_samples_s = sum(in_window.values()) / max(len(in_window) * options.interval_s, 1e-9)
    result.offered_records_s = slope(
        (t, v["published"][1]) for t, v in offsets.series if begin <= t <= end and "published" in v
    )
    result.sink_rows_s = slope((t, n) for t, n in rows.totals if begin <= t <= end)
    for name in ("worker", "sink"):
        result.lag[name] = lag_of(offsets.series, name, begin, end, published_end)
    result.worker_records_s = result.lag["worker"].consumed_rate

    timed = [(sent - ms / 1000, n, ms) for ms, sent, n in rows.arrivals if ms in in_window]
    latencies = [(v, n) for v, n, _ in timed]
    missing = sum(in_window.values()) - sum(n for _, n in latencies)
    if missing > 0:
        latencies.append((math.inf, missing))
    result.p50_s = quantile(latencies, 0.50)
    result.p99_s = quantile(latencies, 0.99)
    result.max_s = max((v for v, _ in latencies), default=math.nan)
    late_at = [(ms, late_ms / 1000, n) for ms, late_ms, n in sim["late_ms"] if begin <= ms / 1000 < end]
    late = [(v, n) for _, v, n in late_at]
    result.sim_late_p99_s = quantile(late, 0.99)
    for minute in range(math.ceil((end - begin) / 60)):
        since, until = 1000 * (begin + 60 * minute), 1000 * min(begin + 60 * (minute + 1), end)
        seen = [(v, n) for v, n, ms in timed if since <= ms < until]
        unseen = sum(n for ms, n in in_window.items() if since <= ms < until) - sum(n for _, n in seen)
        result.p99_by_minute.append((
            quantile([*seen, (math.inf, unseen)] if unseen > 0 else seen, 0.99),  # missing rows, as above
            quantile([(v, n) for ms, v, n in late_at if since <= ms < until], 0.99),
        ))  # fmt: skip
    result.rows_complete_after_s = first_time(
        [(t, n >= result.published_samples) for t, n in rows.totals], published_end
    )
    result.worker_caught_up_after_s = first_time(
        [(t, v["worker"][0] >= v["worker"][1]) for t, v in offsets.series if "worker" in v], published_end
    )
    result.processes = processes_of(sampler.series, begin, end)
    result.steady_rss_spread = rss_spread(sampler.series, begin, end)
    result.rss_over_time = rss_over_time(sampler.series, begin - options.warmup_s, published_end)
    result.pss_over_time = pss_over_time(sampler.series, begin - options.warmup_s, published_end)
    start_steps = (begin - options.warmup_s, begin + START_PAST_WARMUP_S, START_STEP_S)
    result.start_rss = rss_over_time(sampler.series, *start_steps)
    behind = [(t, v["worker"][1] - v["worker"][0]) for t, v in offsets.series if "worker" in v]
    result.start_lag = nearest(behind, steps(*start_steps))
    result.machine_busy_pct, result.others_pct = machine_of(sampler.machine, result.processes, begin, end)
    system_mb = [
        (t, sum(u.rss_kb for n, u in found.items() if n in SYSTEM) / 1024) for t, found in sampler.series
    ]
    result.total_rss_peak_mb = max((mb for _, mb in system_mb), default=0.0)
    window_at = [i for i, (t, _) in enumerate(system_mb) if begin <= t <= end]
    if window_at:
        peak = max(window_at, key=lambda i: system_mb[i][1])
        (at, result.steady_rss_peak_mb), found = system_mb[peak], sampler.series[peak][1]
        result.steady_rss_peak_at_s = at - (begin - options.warmup_s)
        result.steady_rss_peak_of = {n: round(found[n].rss_kb / 1024) for n in SYSTEM if n in found}
    over = [
        t for t, mb in system_mb if begin <= t <= end and options.rss_limit_mb and mb > options.rss_limit_mb
    ]
    result.over_rss_limit_until_s = max(over) - (begin - options.warmup_s) if over else None
    result.total_pss_peak_mb = max(
        ((system_pss_kb(found) or 0) / 1024 for _, found in sampler.series), default=0.0
    )
    result.poll_query_ms_p50 = 1000 * quantile([(q, 1) for q in rows.query_s], 0.5) if rows.query_s else 0.0
    result.full_polls = rows.full_polls

    if result.sim_late_p99_s > options.interval_s:
        result.failures.append(f"simulator behind (p99 {result.sim_late_p99_s:.1f} s late)")
    for name, lag in result.lag.items():
        if lag.growing:
            result.failures.append(f"{name} lag grows")
    if not result.p99_s <= options.p99_limit_s:
        result.failures.append(f"p99 > {options.p99_limit_s:g} s")
    if options.rss_limit_mb and result.steady_rss_peak_mb > options.rss_limit_mb:
        result.failures.append(f"RSS {result.steady_rss_peak_mb:,.0f} MB > {options.rss_limit_mb:,.0f} MB")
    if result.rows_visible < result.published_samples:
        result.failures.append(f"{result.published_samples - result.rows_visible:,} rows missing")
    if result.dropped:
        result.failures.append(f"retention dropped {sum(result.dropped.values()):,} records not yet consumed")


def _print_results(results: list[SizeResult], options: Options) -> None:
    print()
    print(tables(results, ORDER))
    for r in results:
        notes = (
            f"\n{r.gpus:,} GPUs: published {r.published_records:,} records ({r.published_samples:,} GPU "
            f"samples); the cluster's start took the simulator {r.sim_prime_s:.1f} s"
            + (f" ({r.sim_prime_overrun_s:.1f} s past the planned start)" if r.sim_prime_overrun_s else "")
            + f"; worker caught up {_after(r.worker_caught_up_after_s)} after publishing ended; "
            f"visibility query p50 {r.poll_query_ms_p50:.0f} ms ({r.full_polls} over the whole table); "
            f"the machine: bench.machine_speed's loop {r.machine_loop_s:.2f} CPU-s before the run"
        )
        if r.worker_cycles is not None and r.worker_commit_s is not None:  # 0 (stalled) shown too
            window_s = r.duration_s - options.warmup_s
            each = f" ({window_s / r.worker_cycles:.1f} s each on average)" if r.worker_cycles else ""
            notes += (
                f"\n  worker: {r.worker_cycles:,} cycles committed in the steady {window_s:g} s{each}, "
                f"its last commit {1000 * r.worker_commit_s:.0f} ms; "
                f"at most {r.worker_held_peak:,} records held for event-time order"
            )
        print(notes)
        minutes = ", ".join(f"{p99:.2f} ({late:.2f})" for p99, late in r.p99_by_minute)
        print(f"  e2e p99 s by minute of the window (the simulator's late p99): {minutes}")
        for name, points in r.rss_over_time.items():
            print(f"  {name} RSS MB every {RSS_STEP_S:g} s: {', '.join(f'{mb:,}' for mb in points)}")
        pss = ", ".join(f"{mb:,}" for mb in r.pss_over_time)
        print(f"  system PSS MB every {RSS_STEP_S:g} s: {pss}")
        since = f"every {START_STEP_S:g} s from the start to {START_PAST_WARMUP_S:g} s into the window"
        print(f"  worker lag {since}: {', '.join(f'{n:,}' for n in r.start_lag)}")
        for name, points in r.start_rss.items():
            print(f"  {name} RSS MB {since}: {', '.join(f'{mb:,}' for mb in points)}")
        spread = ", ".join(f"{name} {mid:,} / {most:,}" for name, (mid, most) in r.steady_rss_spread.items())
        print(f"  RSS MB in the steady window, median / most: {spread}")
        print(f"  system RSS MB at most at once in the steady window: {r.steady_rss_peak_mb:,.0f}", end="")
        if r.steady_rss_peak_at_s is not None:
            each = ", ".join(f"{name} {mb:,}" for name, mb in r.steady_rss_peak_of.items())
            print(f", {r.steady_rss_peak_at_s:.0f} s after the simulator's start ({each})", end="")
        print()
        if r.over_rss_limit_until_s is not None:
            print(
                f"  system RSS over {options.rss_limit_mb:,.0f} MB in the steady window until "
                f"{r.over_rss_limit_until_s:.0f} s after the simulator's start"
            )
        for topic, records in sorted(r.dropped.items()):
            print(f"  retention's cap dropped {records:,} records of {topic} not yet consumed")
        for name, summary in r.profiles.items():
            window = "the start" if options.profile_start else "steady window"
            print(f"\nprofile of the {name} at {r.gpus:,} GPUs (py-spy, {window}):\n{summary}")


def _after(seconds: float | None) -> str:
    return "not within the drain timeout" if seconds is None else f"{seconds:.1f} s"


def _options(args: argparse.Namespace) -> Options:
    return Options(
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        duration_s=args.duration,
        warmup_s=args.warmup,
        drain_timeout_s=args.drain_timeout,
        lead_s=args.lead,
        poll_s=args.poll,
        window_s=args.window,
        processors=args.processors,
        exporter=args.exporter,
        broker=args.broker,
        p99_limit_s=args.p99_limit,
        rss_limit_mb=args.rss_limit,
        profile=tuple(p for p in args.profile.split(",") if p),
        profile_rate=args.profile_rate,
        profile_start=args.profile_start,
        keep=args.keep,
    )


def find_max(options: Options, start_gpus: int, step: float, max_gpus: int) -> list[SizeResult]:
    """Sizes from ``start_gpus``, times ``step`` each, until one fails (or ``max_gpus``)."""
    results: list[SizeResult] = []
    gpus = start_gpus
    while True:
        print(f"... {gpus:,} GPUs", flush=True)
        result = run_size(gpus, options)
        results.append(result)
        if result.failures or gpus >= max_gpus:
            break
        gpus = min(max_gpus, max(gpus + options.gpus_per_node, round(gpus * step)))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.e2e_scale",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sizes", default="1000,10000,100000", help="Fleet sizes, GPUs, comma-separated.")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--interval", type=float, default=2.0, help="Seconds between a node's sample batches."
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="Seconds the simulator publishes per size."
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="Seconds left out of the steady window.")
    parser.add_argument(
        "--drain-timeout", type=float, default=30.0, help="Longest wait for the pipeline after."
    )
    parser.add_argument("--lead", type=float, help="Seconds to prepare the simulator [5 + 4 ms a node].")
    parser.add_argument("--poll", type=float, default=0.5, help="Seconds between visibility polls.")
    parser.add_argument("--window", type=int, default=30, help="Worker window, seconds.")
    parser.add_argument("--processors", default=Options.processors, help="Worker processors.")
    parser.add_argument(
        "--no-exporter", dest="exporter", action="store_false", help="Leave the exporter out."
    )
    parser.add_argument("--broker", choices=("noida", "tansu"), default="noida")
    parser.add_argument("--p99-limit", type=float, default=5.0, help="A size fails above this p99, seconds.")
    parser.add_argument(
        "--rss-limit",
        type=float,
        default=1_500.0,
        help="A size fails when the system held more RSS at once in the steady window, MB (0: no bound).",
    )
    parser.add_argument("--find-max", action="store_true", help="Step the fleet up until a size fails.")
    parser.add_argument("--start-gpus", type=int, default=2000, help="--find-max: first size.")
    parser.add_argument("--step", type=float, default=1.5, help="--find-max: factor between sizes.")
    parser.add_argument("--max-gpus", type=int, default=100_000, help="--find-max: last size.")
    parser.add_argument("--profile", default="", help="py-spy these processes, e.g. worker,sink.")
    parser.add_argument("--profile-rate", type=int, default=25, help="py-spy samples per second.")
    parser.add_argument(
        "--profile-start", action="store_true", help="Profile the start (until the steady window) instead."
    )
    parser.add_argument("--json", type=Path, help="Also write every figure here.")
    parser.add_argument("--keep", action="store_true", help="Keep each run's directory (logs, profiles).")
    args = parser.parse_args(argv)
    options = _options(args)
    if (
        options.profile
        and shutil.which("py-spy") is None
        and not Path(sys.executable).with_name("py-spy").exists()
    ):
        parser.error("--profile needs py-spy (pip install py-spy into the venv)")
    if args.find_max:
        results = find_max(options, args.start_gpus, args.step, args.max_gpus)
    else:
        results = []
        for gpus in (int(s) for s in args.sizes.split(",") if s):
            print(f"... {gpus:,} GPUs", flush=True)
            results.append(run_size(gpus, options))
    _print_results(results, options)
    if args.find_max:
        passed = [r for r in results if not r.failures]
        if passed:
            best = passed[-1]
            print(
                f"\nhighest sustained: {best.gpus:,} GPUs, {best.sink_rows_s:,.0f} GPU samples/s into "
                f"gpu_samples ({best.offered_records_s:,.0f} records/s offered), p99 {best.p99_s:.2f} s; "
                f"next size failed: {results[-1].verdict}"
            )
        else:
            print(f"\nno size passed; the first failed: {results[0].verdict}")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1, default=str))


if __name__ == "__main__":
    main()
