"""`gpulens gateway`: the gRPC ingest gateway, for agents that cannot reach Kafka themselves."""

from __future__ import annotations

import asyncio
import signal

import click

from gpulens.cli_context import Context, pass_context


@click.command()
@click.option("--port", type=int, help="gRPC port (default: gateway.port).")
@pass_context
def gateway(context: Context, port: int | None) -> None:
    """Accept event batches over gRPC, check them, publish them to Kafka; serve until SIGTERM/Ctrl-C.

    Calls need `authorization: Bearer <token>` with one of gateway.tokens; a batch is acked
    only after the broker acknowledged every record of it.
    """
    from prometheus_client import start_http_server

    from gpulens.producers.gateway import Gateway
    from gpulens.schemas.model.exceptions import ConfigError
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    settings = context.settings
    gateway_settings = (
        settings.gateway if port is None else settings.gateway.model_copy(update={"port": port})
    )
    if not gateway_settings.tokens:
        raise ConfigError("gateway.tokens is empty: nobody could publish; set GPULENS_GATEWAY__TOKENS")
    server = Gateway(gateway_settings, settings.kafka, AvroCodec(registry_client(settings.registry.url)))
    if gateway_settings.metrics_port:
        start_http_server(
            gateway_settings.metrics_port,
            addr=gateway_settings.metrics_host,
            registry=server.metrics.registry,
        )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await server.serve(stop)

    asyncio.run(serve())
    click.echo("gateway stopped")
