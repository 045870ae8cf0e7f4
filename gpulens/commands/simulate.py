"""`gpulens simulate`: a synthetic GPU cluster at any scale, publishing what the live producers would."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import Service, run_service
from gpulens.producers.simulate.specs import EPOCH, GPU_MODELS, RECORDS_PER_POD, ChurnRates, SimulationSpec

log = logging.getLogger(__name__)
_CHURN = ChurnRates()


def _rate_help() -> str:
    """The records/s formula with a worked example computed by the same code the run uses."""
    example = SimulationSpec(nodes=1250, gpus_per_node=8, interval_s=2.0, start=EPOCH)
    lifecycle = example.records_per_s - example.batches_per_s
    return (
        "\b\n"
        "Rate, in records/s (steady state; churn adds a few per hour):\n"
        "  N/S sample batches (N*G/S GPU samples inside them)\n"
        f"  + ~{RECORDS_PER_POD} * A pod-lifecycle records (pod, container and workload events),\n"
        "  A = pods/s = --arrival-rate/60, else load*N*G / (mean GPUs per pod * --pod-duration);\n"
        f"  mean GPUs per pod is {example.mean_gpus_per_pod:.1f} at G=8 with the built-in workload mix.\n"
        "e.g. --nodes 1250 --gpus-per-node 8 --interval 2 (defaults otherwise):\n"
        f"  {example.batches_per_s:,.0f} batches/s ({example.batches_per_s * 8:,.0f} GPU samples/s)"
        f" + ~{lifecycle:.0f} lifecycle records/s (A = {example.arrivals_per_s:.1f})"
        f" = ~{example.records_per_s:,.0f} records/s."
    )


@click.command("simulate", epilog=_rate_help())
@click.option("--nodes", type=click.IntRange(min=1), default=16, show_default=True, help="Nodes (N).")
@click.option(
    "--gpus-per-node", type=click.IntRange(1, 64), default=8, show_default=True, help="GPUs per node (G)."
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.001),
    default=5.0,
    show_default=True,
    help="Seconds between two GpuSampleBatches of a node (S).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Simulated seconds to run (D) [default: until Ctrl-C].",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Simulated seconds per wall second; 0 = as fast as the broker takes them.",
)
@click.option(
    "--start",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]),
    default=None,
    help="Event time of the start, UTC [default: now].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed and options, same records.")
@click.option("--cluster", default=None, help="Cluster name in every record [default: the configured one].")
@click.option(
    "--gpu-model", type=click.Choice(sorted(GPU_MODELS)), default="h100", show_default=True, help="GPU model."
)
@click.option(
    "--load",
    type=click.FloatRange(min=0),
    default=0.8,
    show_default=True,
    help="Offered load: share of the GPUs arriving pods ask for on average (above 1: pods queue).",
)
@click.option(
    "--arrival-rate", type=click.FloatRange(min=0), default=None, help="Pods per minute (overrides --load)."
)
@click.option(
    "--pod-duration",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="Mean seconds a pod runs (exponential).",
)
@click.option(
    "--churn",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help=(
        f"Multiplier of the churn rates, per node and hour: NotReady {_CHURN.not_ready:g}, "
        f"removed {_CHURN.removed:g}, GPU lost {_CHURN.gpu_lost:g}; 0 = none."
    ),
)
@pass_context
def simulate(
    context: Context,
    nodes: int,
    gpus_per_node: int,
    interval: float,
    duration: float | None,
    speed: float,
    start: datetime | None,
    seed: int,
    cluster: str | None,
    gpu_model: str,
    load: float,
    arrival_rate: float | None,
    pod_duration: float,
    churn: float,
) -> None:
    """Publish a synthetic GPU cluster: the records the Kubernetes watcher and node agents would.

    Same record types, topics and keys as the live producers. Nodes join at the start with
    their DeviceInventory; GPU pods (training Jobs, serving Deployments, notebooks) arrive
    at random, are scheduled onto free GPUs or stay Pending (Unschedulable) while none fit,
    run (ContainerEvents name their GPUs), succeed and are deleted; every node sends one
    GpuSampleBatch per interval, busy where a pod works, idle where it waits or nothing runs.
    Nodes go NotReady and come back, are replaced; GPUs are lost and return. Event time is
    simulated time; the run ends with a final Watermark, also on Ctrl-C.
    """
    from gpulens.producers.publishing import EventPublisher
    from gpulens.producers.simulate.batch_writing import SampleBatchWriter
    from gpulens.producers.simulate.pacing import Progress, publish_simulation
    from gpulens.producers.simulate.simulating import ClusterSimulation
    from gpulens.schemas.model.topics import CATALOG, GPU_SAMPLES

    settings = context.settings
    began = (start.replace(tzinfo=UTC) if start else datetime.now(UTC)).replace(microsecond=0)
    spec = SimulationSpec(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        interval_s=interval,
        start=began,
        duration_s=duration,
        cluster=cluster or settings.cluster,
        seed=seed,
        gpu_model=gpu_model,
        load=load,
        arrivals_per_min=arrival_rate,
        pod_duration_s=pod_duration,
        churn=churn,
    )
    simulation = ClusterSimulation(spec)
    log.info(
        "cluster %s: %d nodes x %d %s from %s, %s; expect ~%.0f records/s "
        "(%.0f sample batches/s, %.2f pods/s) at %s",
        spec.cluster,
        nodes,
        gpus_per_node,
        spec.model.name,
        began.isoformat(),
        f"{duration:g} s" if duration else "until Ctrl-C",
        spec.records_per_s,
        spec.batches_per_s,
        spec.arrivals_per_s,
        f"{speed:g}x real time" if speed else "full speed",
    )

    def report(progress: Progress) -> None:
        census = simulation.census()
        lag = f", {progress.behind_s:.1f} s behind" if progress.behind_s >= 1 else ""
        log.info(
            "simulated %s (+%.0f s): %s records, %.0f/s%s; %d/%d nodes ready, %d/%d GPUs held, "
            "%d pods running, %d pending",
            progress.simulated.isoformat(),
            (progress.simulated - began).total_seconds(),
            f"{progress.records:,}",
            progress.rate,
            lag,
            census.ready,
            census.nodes,
            census.held,
            census.gpus,
            census.running,
            census.pending,
        )

    def work(service: Service) -> Progress:
        publisher = EventPublisher(settings.kafka, service.codec)
        writer = SampleBatchWriter(service.codec.schema_id(GPU_SAMPLES))  # sample batches written by column
        try:
            return publish_simulation(
                simulation,
                publisher,
                speed=speed,
                stop=service.stop,
                report=report,
                writer=writer,
                freeze=True,
            )
        finally:
            publisher.close()

    final = run_service(  # SIGTERM/Ctrl-C end the run with its final watermark, not a traceback
        settings,
        work,
        topics=CATALOG,
        announce=lambda signum: log.info("%s: stopping after the current record", signum.name),
        tuned=True,
    )
    click.echo(
        f"published {final.records:,} records in {final.elapsed_s:.1f} s ({final.rate:,.0f}/s), "
        f"simulated {spec.start.isoformat()} .. {final.simulated.isoformat()}"
    )
