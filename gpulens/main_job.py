"""The main job: platform, topics, tables, the pipeline's processes, real data, a report.

`gpulens up` brings everything up in order and is idempotent; `gpulens down` stops exactly
what it started (pipeline first, then the platform). Without a Kubernetes cluster to watch,
the public traces are replayed so that there is real data to look at.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpulens.config import GPULensSettings
from gpulens.infra.launching import ServiceManager, ServiceSpec, State
from gpulens.infra.python_allocator import allocator_env
from gpulens.pipeline.settings import PROCESSORS

if TYPE_CHECKING:
    from gpulens.draining import GroupLag
    from gpulens.schemas.model.models import Event
    from gpulens.schemas.model.topics import TopicSpec

WORKER, SINK, EXPORTER, WATCHER, SUPERVISOR = "worker", "sink", "exporter", "watcher", "supervisor"
RETENTION, API = "retention", "api"
PIPELINE = (WORKER, SINK, EXPORTER, RETENTION, WATCHER, API)
"""Started (by the supervisor) after the platform, stopped before it."""

DEMO_WINDOW_S = 3600
"""The traces span months: hourly windows keep the demo's tables readable."""
WORKER_NICE = 10
"""The worker's lower CPU priority beside the platform on one machine (``pipeline.nice``): the
samples' path to ClickHouse goes first (measured in the README, "End to end at fleet scale")."""


def _python(config_file: Path | None) -> list[str]:
    python = [sys.executable, "-m", "gpulens"]
    return [*python, "--config", str(config_file.resolve())] if config_file is not None else python


def pipeline_specs(
    settings: GPULensSettings, config_file: Path | None, *, watch: bool = False
) -> dict[str, ServiceSpec]:
    """The pipeline's long-running processes, as the supervisor runs them (in this order)."""
    python = _python(config_file)
    # the exporter's per-GPU mode reads what the worker's `latest` processor writes
    latest = ["--processors", ",".join(PROCESSORS)] if settings.exporter.per_gpu else []
    allocator = allocator_env(settings.platform.python_allocator, os.environ)  # the data-heavy three
    specs = {
        WORKER: ServiceSpec(
            WORKER,
            [
                *python,
                "worker",
                "--window",
                str(DEMO_WINDOW_S),
                "--no-nodes",
                "--nice",
                str(WORKER_NICE),
                *latest,
            ],
            env=allocator,
        ),
        SINK: ServiceSpec(SINK, [*python, "sink"], env=allocator),
        EXPORTER: ServiceSpec(
            EXPORTER,
            [*python, "exporter"],
            settings.exporter.host,
            settings.exporter.port,
            hint="set GPULENS_EXPORTER__PORT to another port",
            env=allocator,
        ),
        API: ServiceSpec(
            API,
            [*python, "api"],
            settings.api.host,
            settings.api.port,
            hint="set GPULENS_API__PORT to another port",
        ),
    }
    retention = settings.retention
    if settings.platform.broker == "noida" and retention.interval_s > 0:
        # noida-db holds every record it keeps in memory and its own retention ignores consumers
        specs[RETENTION] = ServiceSpec(
            RETENTION,
            [*python, "retention"],
            retention.metrics_host,
            retention.metrics_port or None,
            hint="set GPULENS_RETENTION__METRICS_PORT to another port (0: no /metrics)",
        )
    if watch:
        specs[WATCHER] = ServiceSpec(WATCHER, [*python, "watch"])
    return specs


def kubernetes_reachable() -> bool:
    """A cluster to watch: in-cluster service account, $KUBECONFIG or ~/.kube/config."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    configured = os.environ.get("KUBECONFIG")
    return (
        any(Path(p).is_file() for p in configured.split(os.pathsep))
        if configured
        else (Path.home() / ".kube" / "config").is_file()
    )


def supervisor_spec(config_file: Path | None, *, watch: bool) -> ServiceSpec:
    """`gpulens supervise`: the process that keeps the pipeline running after `up` returns."""
    argv = [*_python(config_file), "supervise"]
    return ServiceSpec(SUPERVISOR, [*argv, "--watch"] if watch else argv)


def start_pipeline(
    settings: GPULensSettings,
    services: ServiceManager,
    config_file: Path | None,
    echo: Callable[[str], None],
    *,
    watch: bool = False,
) -> None:
    """Start the supervisor, and wait until it has every pipeline process running."""
    status, started = services.start(supervisor_spec(config_file, watch=watch))
    echo(f"  {SUPERVISOR:<11} {'started' if started else 'already running':<16} pid {status.pid}")
    for name, spec in pipeline_specs(settings, config_file, watch=watch).items():
        wait_for(
            lambda name=name, spec=spec: (  # type: ignore[misc]
                services.status(name).state is State.RUNNING and services.answers(spec)
            ),
            timeout=180,
            what=f"the supervisor to start {name} (see {services.log_path(SUPERVISOR)})",
        )
        echo(f"  {name:<11} {'running':<16} pid {services.status(name).pid}")


def stop_pipeline(services: ServiceManager, echo: Callable[[str], None]) -> None:
    """Stop the supervisor (it stops what it runs, each flushing), then anything left over."""
    stopped = services.stop(SUPERVISOR, stall_s=120)
    echo(f"  {SUPERVISOR:<11} {'stopped' if stopped else 'was not running'}")
    for name in reversed(PIPELINE):
        if services.stop(name, stall_s=60):  # left behind by a supervisor that was killed
            echo(f"  {name:<11} stopped")


def replay_traces(settings: GPULensSettings) -> int:
    """Publish both public traces (Alibaba v2023 pods, GenAI duty cycles) with progress bars;
    the events published."""
    from gpulens.producers.publishing import EventPublisher
    from gpulens.producers.replay import alibaba_v2023, genai_duty
    from gpulens.producers.replay.locating import traces_dir
    from gpulens.producers.replay.pacing import replay
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    traces = traces_dir()
    codec = AvroCodec(registry_client(settings.registry.url))
    plans: dict[str, Callable[[], Iterator[tuple[TopicSpec, Event]]]] = {
        "alibaba-v2023": lambda: alibaba_v2023.plan(
            alibaba_v2023.read_nodes(traces / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
            alibaba_v2023.read_pods(traces / "alibaba-gpu-v2023/openb_pod_list_default.csv"),
            cluster=f"{settings.cluster}-alibaba",
            epoch=datetime(2023, 1, 1, tzinfo=UTC),
        ),
        "genai-duty": lambda: genai_duty.plan(
            genai_duty.read_samples(traces / "alibaba-genai-2026/pod_gpu_duty_cycle_48pods.csv"),
            cluster=f"{settings.cluster}-genai",
        ),
    }
    total = 0
    for name, make in plans.items():
        events = list(make())
        with click.progressbar(length=len(events), label=f"  replay {name:<14}", file=sys.stderr) as bar:
            total += replay(events, EventPublisher(settings.kafka, codec), progress=bar.update)
    return total


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; a clear error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


DRAIN_TIMEOUT_S = 600
"""How long `gpulens up` waits for the pipeline to process the replay before giving up."""


def wait_until_drained(
    settings: GPULensSettings, echo: Callable[[str], None], *, every_s: float = 5.0
) -> None:
    """Wait until every consumer group of the pipeline has consumed every record (the report
    computed earlier showed whatever had arrived: different numbers each run), with a progress
    line every ``every_s`` seconds; a clear error after :data:`DRAIN_TIMEOUT_S`."""
    from gpulens.draining import wait_drained

    started = time.monotonic()
    shown = [started]

    def progress(groups: list[GroupLag]) -> None:
        if time.monotonic() - shown[0] < every_s:
            return
        shown[0] = time.monotonic()
        echo(f"  {time.monotonic() - started:4.0f} s, records left: {_left(groups)}")

    drained = wait_drained(settings, timeout_s=DRAIN_TIMEOUT_S, progress=progress)
    if drained is None:
        raise click.ClickException(
            f"the pipeline did not process the replay within {DRAIN_TIMEOUT_S} s, so no report: "
            f"see `gpulens status` and the logs in {settings.platform.state_dir / 'logs'}"
        )
    echo(f"  drained in {time.monotonic() - started:.0f} s: every consumer group has consumed every record")


def _left(groups: list[GroupLag]) -> str:
    return ", ".join(f"{g.group} {g.records:,}" if g.topics else f"{g.group} not started" for g in groups)


REPORT: tuple[tuple[str, str], ...] = (
    (
        "GPU allocation over time (Alibaba v2023, by month)",
        """SELECT toStartOfMonth(window_start) AS month,
       round(avg(allocation_rate_avg) * 100, 1) AS `allocated %`,
       round(max(gpus_allocated_max), 1) AS `peak GPUs`,
       any(gpu_capacity) AS capacity,
       max(pods_pending_end) AS `most pending`
FROM cluster_gpu_allocation FINAL WHERE cluster = {alibaba:String}
GROUP BY month ORDER BY month""",
    ),
    (
        "Busiest and idlest workloads (GenAI serving fleet, mean GPU utilization)",
        # The parts of a UNION ALL come in no fixed order: the outer ORDER BY makes it one.
        """SELECT * FROM (
  (SELECT workload_name AS workload, round(avg(utilization_avg), 1) AS `mean util %`,
          round(max(utilization_max), 1) AS `max util %`, sum(samples) AS samples
   FROM workload_gpu_usage FINAL WHERE cluster = {genai:String}
   GROUP BY workload ORDER BY `mean util %` DESC LIMIT 3)
  UNION ALL
  (SELECT workload_name, round(avg(utilization_avg), 1), round(max(utilization_max), 1), sum(samples)
   FROM workload_gpu_usage FINAL WHERE cluster = {genai:String}
   GROUP BY workload_name ORDER BY avg(utilization_avg) ASC LIMIT 3)
) ORDER BY `mean util %` DESC, workload""",
    ),
    (
        "Alerts (opened)",
        """SELECT cluster, alert, count() AS opened, min(event_time) AS first, max(event_time) AS last
FROM alerts FINAL WHERE state = 'OPENED' AND cluster IN ({alibaba:String}, {genai:String})
GROUP BY cluster, alert ORDER BY cluster, alert""",
    ),
    (
        "Pending GPU pods: the scheduler's reasons and free GPUs when they waited",
        """SELECT labels['reason'] AS reason, count() AS pods,
       round(avg(toFloat64OrZero(labels['gpus_requested'])), 2) AS `avg GPUs asked`
FROM alerts FINAL WHERE alert = 'GpuPodPending' AND state = 'OPENED' AND cluster = {alibaba:String}
GROUP BY reason ORDER BY pods DESC""",
    ),
    (
        "Device changes",
        """SELECT cluster, device_kind, change, count() AS devices
FROM device_changelog FINAL WHERE cluster IN ({alibaba:String}, {genai:String})
GROUP BY cluster, device_kind, change ORDER BY cluster""",
    ),
)

EXAMPLES = (
    "SELECT window_start, gpus_allocated_avg, allocation_rate_avg FROM gpulens.cluster_gpu_allocation FINAL"
    " ORDER BY window_start DESC LIMIT 5",
    "SELECT alert, state, entity, event_time, message FROM gpulens.alerts FINAL ORDER BY event_time DESC"
    " LIMIT 10",
    "SELECT workload_name, avg(utilization_avg) FROM gpulens.workload_gpu_usage FINAL GROUP BY 1 ORDER BY 2",
)
"""SQL to try after the report."""


def print_report(settings: GPULensSettings, echo: Callable[[str], None]) -> None:
    """The short report of `gpulens up`, computed from ClickHouse."""
    from gpulens.consumers.clickhouse.client import get_client

    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    names = {"alibaba": f"{settings.cluster}-alibaba", "genai": f"{settings.cluster}-genai"}
    for title, query in REPORT:
        echo(f"\n{title}:")
        text = client.raw_query(query, parameters=names, fmt="PrettyCompactMonoBlock").decode()
        echo(text.rstrip() or "  (nothing yet)")
    print_current_state(settings, echo)


def print_current_state(settings: GPULensSettings, echo: Callable[[str], None]) -> None:
    """The clusters as a subscriber of the compacted state topics sees them now."""
    from gpulens.current_state import clusters_now
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    echo("\nNow, from the compacted state topics (gpulens.state.*.v1 read from the beginning):")
    clusters = clusters_now(settings.kafka, AvroCodec(registry_client(settings.registry.url)))
    for cluster, now in sorted(clusters.items()):
        pods = ", ".join(f"{n} {phase}" for phase, n in now.pods.most_common()) or "none"
        workloads = ", ".join(f"{n} {status}" for status, n in now.workloads.most_common()) or "none"
        echo(f"  {cluster}: {now.nodes} nodes; pods: {pods}; workloads: {workloads}")
        for workload in now.top:
            echo(
                f"    {workload.kind} {workload.namespace}/{workload.name}: {workload.gpus_held:g} GPUs held,"
                f" {workload.active_pods} active pods"
            )
