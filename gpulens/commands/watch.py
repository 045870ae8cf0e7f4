"""``gpulens watch``: run the Kubernetes watchers of one cluster (gpulens.producers.kubernetes)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import STOP_SIGNALS, Service, run_service

log = logging.getLogger("gpulens.watch")


@click.command("watch")
@click.option("--cluster", help="Cluster name put on every event (default: the `cluster` setting).")
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config).",
)
@click.option(
    "--in-cluster", is_flag=True, help="Use the pod's service account (when run inside Kubernetes)."
)
@click.option(
    "--once",
    is_flag=True,
    help="List everything once, publish what changed and a watermark (the wall clock less "
    "watermark_lag_s), and exit.",
)
@pass_context
def watch(
    context: Context, cluster: str | None, kubeconfig: Path | None, in_cluster: bool, once: bool
) -> None:
    """Watch nodes, GPU pods, workloads and volumes; publish NodeEvent, PodEvent, WorkloadEvent,
    StorageEvent.

    \b
    Topics: gpulens.nodes.v1, gpulens.pods.v1, gpulens.workloads.v1, gpulens.storage.v1 (Avro,
    keyed by entity). Volume usage is read from each node's kubelet summary every
    [watcher] storage_usage_interval_s (0: capacity only; storage = false: no volumes).
    While it leads, a Watermark on gpulens.watermarks.v1 every [watcher] watermark_interval_s
    (with --once, one after the changes).
    Only a change of what is published makes an event (no node heartbeats); a restart or a new
    leader continues from what the topics hold, without duplicates or gaps. With
    [watcher.lease] enabled (the default) only the replica holding the Lease publishes; the
    RBAC it needs is in deploy/k8s/watcher-rbac.yaml. Settings: [watcher] in the config file,
    e.g. custom kinds: GPULENS_WATCHER__CUSTOM_WORKLOADS='[{"group": "kubeflow.org",
    "version": "v1", "plural": "pytorchjobs", "kind": "PyTorchJob"}]'.
    """
    from gpulens.producers.kubernetes import (
        GpuCatalog,
        KubeApi,
        LeaseElector,
        Translator,
        Watcher,
        load_configuration,
        read_published,
    )
    from gpulens.producers.publishing import EventPublisher

    settings = context.settings
    name = cluster or settings.cluster
    watcher_settings = settings.watcher
    configuration = load_configuration(kubeconfig=kubeconfig, in_cluster=in_cluster)
    api = KubeApi(configuration, request_timeout_s=watcher_settings.request_timeout_s)

    def work(service: Service) -> int:
        publisher = EventPublisher(settings.kafka, service.codec)
        watcher = Watcher(
            api=api,
            settings=watcher_settings,
            translator=Translator(name, watcher_settings.source, GpuCatalog.from_settings(watcher_settings)),
            publisher=publisher,
            restore=lambda: read_published(
                settings.kafka, service.codec, cluster=name, source=watcher_settings.source
            ),
            elector=LeaseElector(api, watcher_settings.lease)
            if watcher_settings.lease.enabled and not once
            else None,
        )
        if once:
            return watcher.run_once()
        log.info("watching cluster %s at %s", name, configuration.host)
        watcher.run(service.stop)
        return publisher.published

    try:
        published = run_service(
            settings,
            work,
            signals=() if once else STOP_SIGNALS,
            announce=lambda signum: log.info("signal %d: stopping", signum),
        )
    finally:
        api.close()
    what = "changes published, then a watermark" if once else "records published"
    click.echo(f"cluster {name}: {published} {what}")
