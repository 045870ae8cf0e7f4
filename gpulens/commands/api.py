"""`gpulens api`: the Lens HTTP JSON API (and, at /, the console) over the ClickHouse tables."""

from __future__ import annotations

import click

from gpulens.cli_context import Context, pass_context, with_flags
from gpulens.commands.service import Service, run_service


@click.command()
@click.option("--host", help="Address the API binds [api.host].")
@click.option("--port", type=click.IntRange(0, 65535), help="Port of the API [api.port].")
@pass_context
def api(context: Context, /, **_api_flags: object) -> None:
    """Serve the Lens API over clickhouse.database until SIGTERM/Ctrl-C.

    \b
    Lens's resource layout, JSON, read-only (every statement runs with readonly=2 and bound
    parameters only); every current view takes asOf=<RFC 3339> and answers from history:
      /api/clusters, /api/clusters/{cluster}/overview, /consumers, /idleWorkloads, /gpuHeatmap
      /api/nodes?cluster=..., /api/nodes/{name}, /gpuDevices, /gpuMetrics, /workloads,
        /workloadsHistory, /gpuAllocation, /gpuUtilizationHistory
      /api/workloads?cluster=..., /api/workloads/{uid}, /hierarchy, /metrics, /pods, /report
      /api/alerts, /api/pending, /api/gpu-aggregation/hourly?groupBy=namespace|workload|label:KEY
    The OpenAPI document is /openapi.json; the web console is at /. With api.token set, /api/
    needs "Authorization: Bearer TOKEN" (401 without it). Bad parameters answer 400 naming them.
    """
    from gpulens.api.app import build_app
    from gpulens.api.reading import open_reader
    from gpulens.api.serving import serve

    settings = context.settings
    options = with_flags(settings.api)

    def work(service: Service) -> None:
        reader = open_reader(settings.clickhouse, timeout_s=options.query_timeout_s)
        try:
            serve(build_app(options, reader), host=options.host, port=options.port, stop=service.stop)
        finally:
            reader.close()

    run_service(
        settings,
        work,
        banner=f"api: http://{options.host}:{options.port}/api/ over {settings.clickhouse.url} database "
        f"{settings.clickhouse.database}" + (", token required" if options.token else ""),
    )
