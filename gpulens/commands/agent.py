"""`gpulens agent`: the node agent (one per node, a DaemonSet in a cluster)."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from gpulens.cli_context import Context, pass_context


@click.command()
@click.option("--node", help="Node name in every record (default: agent.node, NODE_NAME or the hostname).")
@click.option("--once", is_flag=True, help="Collect and publish one round, wait for delivery, exit.")
@pass_context
def agent(context: Context, node: str | None, once: bool) -> None:
    """Collect GPUs, RDMA ports and pod<->device assignments of this node and publish them.

    Collectors whose library, socket or sysfs tree is missing switch off with one log line;
    records the broker does not acknowledge wait in agent.spool_dir and are re-sent in order.
    Serves its health and its GPUs' gauges (gpu_utilization, gpu_socket_power_watts,
    gpu_memory_used_bytes, with the pod holding each GPU) on agent.metrics_host:metrics_port.
    """
    from prometheus_client import start_http_server

    from gpulens.producers.agent import AgentMetrics, build_agent, collectors_for
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    settings = context.settings
    agent_settings = settings.agent if node is None else settings.agent.model_copy(update={"node": node})
    metrics = AgentMetrics()
    if agent_settings.metrics_port and not once:
        start_http_server(
            agent_settings.metrics_port, addr=agent_settings.metrics_host, registry=metrics.registry
        )
    node_agent = build_agent(
        agent_settings,
        cluster=settings.cluster,
        kafka=settings.kafka,
        codec=AvroCodec(registry_client(settings.registry.url)),
        collectors=collectors_for(agent_settings),
        metrics=metrics,
    )
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    node_agent.start()
    click.echo(f"agent on node {agent_settings.node}: {', '.join(node_agent.active) or 'no collector'} on")
    try:
        node_agent.run(stop, rounds=1 if once else None)
    except KeyboardInterrupt:
        pass
    finally:
        node_agent.close(timeout_s=agent_settings.delivery_timeout_s)
