"""The main job: platform, topics, tables, the pipeline's processes, real data, a report.

`gpulens up` brings everything up in order and is idempotent; `gpulens down` stops exactly
what it started (pipeline first, then the platform). Without a Kubernetes cluster to watch,
the public traces are replayed so that there is real data to look at.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click

from gpulens.config import GPULensSettings
from infra.launching import ServiceManager, ServiceSpec

WORKER, SINK, EXPORTER = "worker", "sink", "exporter"
PIPELINE = (WORKER, SINK, EXPORTER)
"""Started after the platform, stopped before it."""

DEMO_WINDOW_S = 3600
"""The traces span months: hourly windows keep the demo's tables readable."""


def pipeline_specs(settings: GPULensSettings, config_file: Path | None) -> dict[str, ServiceSpec]:
    """The pipeline's long-running processes, as `gpulens up` starts them."""
    python = [sys.executable, "-m", "gpulens"]
    if config_file is not None:
        python += ["--config", str(config_file.resolve())]
    return {
        WORKER: ServiceSpec(WORKER, [*python, "worker", "--window", str(DEMO_WINDOW_S), "--no-nodes"]),
        SINK: ServiceSpec(SINK, [*python, "sink"]),
        EXPORTER: ServiceSpec(
            EXPORTER,
            [*python, "exporter"],
            settings.exporter.host,
            settings.exporter.port,
            hint="set GPULENS_EXPORTER__PORT to another port",
        ),
    }


def start_pipeline(
    settings: GPULensSettings, services: ServiceManager, config_file: Path | None, echo: Callable[[str], None]
) -> None:
    """Start the worker, the sink and the exporter unless they run already."""
    for name, spec in pipeline_specs(settings, config_file).items():
        status, started = services.start(spec)
        echo(f"  {name:<11} {'started' if started else 'already running':<16} pid {status.pid}")


def stop_pipeline(services: ServiceManager, echo: Callable[[str], None]) -> None:
    """Stop the pipeline's processes (they flush what they hold on SIGTERM)."""
    for name in reversed(PIPELINE):
        echo(f"  {name:<11} {'stopped' if services.stop(name, timeout=60) else 'was not running'}")


def replay_traces(settings: GPULensSettings) -> tuple[int, datetime]:
    """Publish both public traces (Alibaba v2023 pods, GenAI duty cycles) with progress bars.

    Returns the events published and the time of the Alibaba replay's last event.
    """
    from producers.publishing import EventPublisher
    from producers.replay import alibaba_v2023, genai_duty
    from producers.replay.locating import traces_dir
    from producers.replay.pacing import replay
    from schemas.codec import AvroCodec, registry_client

    traces = traces_dir()
    codec = AvroCodec(registry_client(settings.registry.url))
    plans = {
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
    last = datetime.min.replace(tzinfo=UTC)
    for name, make in plans.items():
        events = list(make())
        if name == "alibaba-v2023":
            last = events[-1][1].event_time
        with click.progressbar(length=len(events), label=f"  replay {name:<14}", file=sys.stderr) as bar:
            total += replay(events, EventPublisher(settings.kafka, codec), progress=bar.update)
    return total, last


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; a clear error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1.0)


def last_window_done(settings: GPULensSettings, cluster: str, until: datetime) -> bool:
    """ClickHouse holds the cluster's allocation window that ends the replay."""
    from consumers.clickhouse.client import get_client

    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    result = client.query(
        "SELECT max(window_end) FROM cluster_gpu_allocation WHERE cluster = {c:String}",
        parameters={"c": cluster},
    ).result_rows
    newest = result[0][0] if result else None
    return newest is not None and newest.replace(tzinfo=UTC) > until


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
        """SELECT workload_name AS workload, round(avg(utilization_avg), 1) AS `mean util %`,
       round(max(utilization_max), 1) AS `max util %`, sum(samples) AS samples
FROM workload_gpu_usage FINAL WHERE cluster = {genai:String}
GROUP BY workload ORDER BY `mean util %` DESC LIMIT 3
UNION ALL
SELECT * FROM (
  SELECT workload_name, round(avg(utilization_avg), 1), round(max(utilization_max), 1), sum(samples)
  FROM workload_gpu_usage FINAL WHERE cluster = {genai:String}
  GROUP BY workload_name ORDER BY avg(utilization_avg) ASC LIMIT 3)""",
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
    from consumers.clickhouse.client import get_client

    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    names = {"alibaba": f"{settings.cluster}-alibaba", "genai": f"{settings.cluster}-genai"}
    for title, query in REPORT:
        echo(f"\n{title}:")
        text = client.raw_query(query, parameters=names, fmt="PrettyCompactMonoBlock").decode()
        echo(text.rstrip() or "  (nothing yet)")
