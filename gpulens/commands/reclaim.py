"""``gpulens reclaim``: opt-in idle reclaim (gpulens.producers.reclaim), dry run unless --apply,
and the orphan report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import run_service
from gpulens.schemas.model.topics import RECLAIM_AUDIT

_KUBECONFIG = click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config).",
)
_IN_CLUSTER = click.option(
    "--in-cluster", is_flag=True, help="Use the pod's service account (deploy/k8s/reclaim-rbac.yaml)."
)


@click.group()
def reclaim() -> None:
    """Reclaim GPUs held idle by workloads that opted in, and list what was left behind."""


@reclaim.command("run")
@click.option(
    "--policy",
    "policy_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The policy (TOML): namespaces, match_labels, idle checks, action.",
)
@click.option("--apply", is_flag=True, help="Change the cluster (default: a dry run that changes nothing).")
@_KUBECONFIG
@_IN_CLUSTER
@pass_context
def run(context: Context, policy_file: Path, apply: bool, kubeconfig: Path | None, in_cluster: bool) -> None:
    """Judge every opted-in workload on its GPU usage; act on the idle ones only with --apply.

    \b
    Usage: gpulens.agg.workload-gpu-usage.v1 (the worker's `workloads` processor). Idle: the
    GPUs' highest utilization under the threshold at every one of `checks` checks
    `interval_s` apart, in event time. Actions: annotate; scale-to-zero (Deployments,
    StatefulSets); delete (a Job and the Services serving only its pods).
    Every decision is a ReclaimDecision on gpulens.reclaim.audit.v1. Exit 1 if an action failed.
    """
    from gpulens.producers.kubernetes import KubeApi, load_configuration
    from gpulens.producers.publishing import EventPublisher
    from gpulens.producers.reclaim.policy import load_policy
    from gpulens.producers.reclaim.reading import read_usage
    from gpulens.producers.reclaim.running import reclaim as run_policy
    from gpulens.schemas.model.models import ReclaimVerdict

    settings = context.settings
    policy = load_policy(policy_file)
    api = KubeApi(load_configuration(kubeconfig=kubeconfig, in_cluster=in_cluster))
    try:
        decisions = run_service(
            settings,
            lambda service: run_policy(
                api,
                policy,
                lambda since: read_usage(settings.kafka, service.codec, cluster=policy.cluster, since=since),
                EventPublisher(settings.kafka, service.codec),
                apply=apply,
            ),
            topics=(RECLAIM_AUDIT,),
            signals=(),
        )
    finally:
        api.close()
    for d in decisions:
        acted = f" {d.action} {', '.join(d.targets)}" if d.targets else ""
        seen = f"{d.idle_checks}/{d.checks} idle checks, max {d.utilization_max}%"
        who = f"{d.workload_kind}/{d.namespace}/{d.workload_name}"
        click.echo(f"{d.verdict.value:9} {who}: {d.reason} ({seen}){acted}")
    mode = "applied" if apply else "dry run: nothing changed"
    click.echo(f"policy {policy.name}: {len(decisions)} decisions on {RECLAIM_AUDIT.name} ({mode})")
    if any(d.verdict is ReclaimVerdict.FAILED for d in decisions):
        raise SystemExit(1)


@reclaim.command("orphans")
@click.option("--namespace", help="Only this namespace (default: every namespace).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per orphan, one per line.")
@_KUBECONFIG
@_IN_CLUSTER
def orphans(namespace: str | None, as_json: bool, kubeconfig: Path | None, in_cluster: bool) -> None:
    """List Services selecting no pod, finished Jobs past their TTL, pending pods whose owner is gone.

    Read-only: nothing is changed and nothing is published.
    """
    from gpulens.producers.kubernetes import KubeApi, load_configuration
    from gpulens.producers.reclaim.orphans import find_orphans

    api = KubeApi(load_configuration(kubeconfig=kubeconfig, in_cluster=in_cluster))
    try:
        found = find_orphans(api, namespace=namespace)
    finally:
        api.close()
    for orphan in found:
        click.echo(
            json.dumps(asdict(orphan))
            if as_json
            else f"{orphan.kind}/{orphan.namespace}/{orphan.name}: {orphan.reason}"
        )
    if not as_json:
        click.echo(f"{len(found)} orphans")
