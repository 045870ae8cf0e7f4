"""`gpulens report`: reports over ClickHouse, printed; `report workload UID` is jobstats' report
of one workload over its life (the API's /api/workloads/{uid}/report, as text or JSON)."""

from __future__ import annotations

from datetime import datetime

import click

from gpulens.api.workload_report import IDLE_BELOW, SPAN_MAX_S, WorkloadReport
from gpulens.cli_context import Context, pass_context


@click.group()
def report() -> None:
    """Reports computed from the ClickHouse tables the sink writes."""


@report.command("workload")
@click.argument("uid")
@click.option("--cluster", help="The workload's cluster (needed when its uid is in several).")
@click.option(
    "--idle-below",
    type=click.FloatRange(min=0),
    default=IDLE_BELOW,
    show_default=True,
    help="Utilization (%) under which a GPU held counts as idle.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (the API's answer).")
@pass_context
def workload(context: Context, uid: str, cluster: str | None, idle_below: float, as_json: bool) -> None:
    """One workload over its whole life, as jobstats reports a Slurm job.

    \b
    UID is the workload's (its pods' top owner; a bare pod's own uid). In event time:
      GPU-hours held; mean and p95 utilization of its GPUs while held; idle GPU-hours
      (held, utilization under --idle-below); time pending; restarts, failed and disrupted
      pods, container exits; energy (where samples carry power); first and last seen; its
      pods and GPUs. Definitions: README, "Per-workload reports".
    An unknown UID (or one in several clusters without --cluster) is a one-line error, exit 1.
    """
    from gpulens.api.exceptions import AmbiguousWorkload, UnknownWorkload
    from gpulens.api.reading import open_reader
    from gpulens.api.workload_report import clusters_of, workload_report

    settings = context.settings
    reader = open_reader(settings.clickhouse, timeout_s=settings.api.query_timeout_s)
    try:
        if cluster is None:
            found = clusters_of(reader, uid)
            if not found:
                raise UnknownWorkload(
                    f"no workload {uid!r} in any cluster of database {settings.clickhouse.database}"
                )
            if len(found) > 1:
                raise AmbiguousWorkload(
                    f"workload {uid!r} is in clusters {', '.join(found)}: choose with --cluster"
                )
            cluster = found[0]
        made = workload_report(reader, cluster=cluster, uid=uid, idle_below=idle_below)
    finally:
        reader.close()
    if made is None:
        raise UnknownWorkload(f"no workload {uid!r} in cluster {cluster!r}")
    click.echo(made.model_dump_json(indent=2) if as_json else render(made))


def duration(seconds: float) -> str:
    """``seconds`` for people: ``2 h 05 min``, ``4 min 10 s``, ``12 s``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _when(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """``rows`` under ``header`` in columns as wide as their widest cell, left-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def render(made: WorkloadReport) -> str:
    """The report as text: a summary in jobstats' manner, then its pods and its GPUs."""
    measured = made.measured_gpu_hours
    share = f" ({made.idle_gpu_hours / measured:.0%} of measured)" if measured else ""
    energy = (
        "n/a (no sample carries power)"
        if made.energy_j is None
        else f"{made.energy_j / 3.6e6:.3f} kWh ({made.energy_j:,.0f} J)"
    )
    lines = [
        f"Workload     {made.kind} {made.namespace}/{made.name}  uid {made.uid}  cluster {made.cluster}",
        f"Status       {made.status}",
        f"Seen         {_when(made.first_seen)} .. {_when(made.last_seen)}"
        f"  ({duration((made.last_seen - made.first_seen).total_seconds())})",
        f"GPU-hours    {made.gpu_hours:.3f} held, {measured:.3f} measured by samples",
        f"Utilization  mean {_pct(made.utilization_avg)}, p95 {_pct(made.utilization_p95)}"
        f"  ({made.samples:,} samples)",
        f"Idle held    {made.idle_gpu_hours:.3f} GPU-hours under {made.idle_below:g} %{share}",
        f"Pending      {duration(made.pending_s)}",
        f"Pods         {made.pods} ({made.pods_failed} failed, {made.pods_disrupted} disrupted), "
        f"{made.restarts} restarts, {made.container_exits} container exits",
        f"Energy       {energy}",
        f"(event time: holds still open count until the cluster's newest event, {_when(made.now)};",
        f" a sample speaks for its GPU {SPAN_MAX_S} s at most)",
        "",
    ]
    pods = []
    for pod in made.pod_list:
        exits = (f"{e.container} exited {e.exit_code} {e.reason or ''}".rstrip() for e in pod.exits)
        phase = f"{pod.phase}, deleted" if pod.deleted else pod.phase
        pods.append(
            [
                pod.name, ",".join(pod.nodes) or "-", f"{pod.gpu_amount:g}", phase, duration(pod.pending_s),
                f"{pod.gpu_hours:.3f}", str(pod.restarts), "; ".join([*pod.disruptions, *exits]) or "-",
            ]
        )  # fmt: skip
    lines += table(["POD", "NODES", "GPUS", "PHASE", "PENDING", "GPU-HOURS", "RESTARTS", "EVENTS"], pods)
    if made.gpu_list:
        gpus = [
            [
                gpu.device_id, gpu.node, gpu.pod_name, f"{gpu.samples:,}", _pct(gpu.utilization_avg),
                f"{gpu.idle_gpu_hours:.3f}", "n/a" if gpu.energy_j is None else f"{gpu.energy_j:,.0f}",
            ]
            for gpu in made.gpu_list
        ]  # fmt: skip
        lines += ["", *table(["GPU", "NODE", "POD", "SAMPLES", "UTIL", "IDLE GPU-H", "ENERGY J"], gpus)]
    return "\n".join(lines)
