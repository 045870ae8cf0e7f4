"""`gpulens agent`: the node agent (one per node, a DaemonSet in a cluster)."""

from __future__ import annotations

import signal

import click

from gpulens.cli_context import Context, pass_context, with_flags
from gpulens.commands.service import Metrics, Service, run_service


@click.command()
@click.option("--node", help="Node name in every record (default: agent.node, NODE_NAME or the hostname).")
@click.option("--once", is_flag=True, help="Collect and publish one round, wait for delivery, exit.")
@pass_context
def agent(context: Context, /, once: bool, **_agent_flags: object) -> None:
    """Collect GPUs, RDMA ports, pod<->device assignments and container lifecycle (containerd) of
    this node and publish them.

    Collectors whose library, socket or sysfs tree is missing switch off with one log line
    (containerd's socket is waited for, with backoff);
    records the broker does not acknowledge wait in agent.spool_dir and are re-sent in order.
    Serves its health and its GPUs' gauges (gpu_utilization, gpu_socket_power_watts,
    gpu_memory_used_bytes, with the pod holding each GPU) on agent.metrics_host:metrics_port.
    """
    from gpulens.producers.agent import AgentMetrics, build_agent, collectors_for

    settings = context.settings
    agent_settings = with_flags(settings.agent)
    metrics = AgentMetrics()

    def work(service: Service) -> None:
        node_agent = build_agent(
            agent_settings,
            cluster=settings.cluster,
            kafka=settings.kafka,
            codec=service.codec,
            collectors=collectors_for(agent_settings),
            metrics=metrics,
        )
        node_agent.start()
        click.echo(
            f"agent on node {agent_settings.node}: {', '.join(node_agent.active) or 'no collector'} on"
        )
        try:
            node_agent.run(service.stop, rounds=1 if once else None)
        except KeyboardInterrupt:
            pass
        finally:
            node_agent.close(timeout_s=agent_settings.delivery_timeout_s)

    run_service(
        settings,
        work,
        metrics=None
        if once
        else Metrics(agent_settings.metrics_port, agent_settings.metrics_host, metrics.registry),
        signals=(signal.SIGTERM,),  # Ctrl-C stays a KeyboardInterrupt, which ends the round at once
    )
