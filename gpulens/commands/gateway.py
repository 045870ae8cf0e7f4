"""`gpulens gateway`: the gRPC ingest gateway, for agents that cannot reach Kafka themselves."""

from __future__ import annotations

import asyncio

import click

from gpulens.cli_context import Context, pass_context, with_flags
from gpulens.commands.service import STOP_SIGNALS, Metrics, Service, run_service


@click.command()
@click.option("--port", type=int, help="gRPC port (default: gateway.port).")
@pass_context
def gateway(context: Context, /, **_gateway_flags: object) -> None:
    """Accept event batches over gRPC, check them, publish them to Kafka; serve until SIGTERM/Ctrl-C.

    Calls need `authorization: Bearer <token>` with one of gateway.tokens; a batch is acked
    only after the broker acknowledged every record of it. Primus-Lens node exporters may
    stream their container events to it too (exporter.ExporterService/StreamContainerEvents).
    """
    from gpulens.producers.gateway import Gateway, GatewayMetrics
    from gpulens.schemas.model.exceptions import ConfigError

    settings = context.settings
    gateway_settings = with_flags(settings.gateway)
    if not gateway_settings.tokens:
        raise ConfigError("gateway.tokens is empty: nobody could publish; set GPULENS_GATEWAY__TOKENS")
    metrics = GatewayMetrics()

    async def serve(server: Gateway) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, stop.set)
        await server.serve(stop)

    def work(service: Service) -> None:
        asyncio.run(
            serve(
                Gateway(
                    gateway_settings, settings.kafka, service.codec, metrics=metrics, cluster=settings.cluster
                )
            )
        )

    run_service(
        settings,
        work,
        metrics=Metrics(gateway_settings.metrics_port, gateway_settings.metrics_host, metrics.registry),
        signals=(),  # the event loop's own handlers stop the server
    )
    click.echo("gateway stopped")
