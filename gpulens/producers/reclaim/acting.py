"""The Kubernetes side of reclaim: the opted-in objects, and the requests each action makes.

Only objects the API server lists under the policy's label selector, in the policy's
namespaces, are ever candidates; every request names its object by namespace and name.
Requests go through :class:`~gpulens.producers.kubernetes.api.KubeApi` (the official client):
PATCHes as JSON merge patches, the scale subresource for replicas, and DELETE of a Job with
``propagationPolicy: Background`` so its pods go too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.reclaim.policy import Action, Policy

IDLE_ANNOTATION = "gpulens.io/idle"
MERGE_PATCH = "application/merge-patch+json"
_COLLECTIONS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}


@dataclass(frozen=True, slots=True)
class Workload:
    """An opted-in object reclaim may act on."""

    uid: str
    kind: str
    name: str
    namespace: str
    pod_labels: dict[str, str]
    """Its pod template's labels (what its Services select)."""

    @property
    def path(self) -> str:
        return f"{_COLLECTIONS[self.kind].format(ns=self.namespace)}/{self.name}"

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def opted_in(api: KubeApi, policy: Policy) -> list[Workload]:
    """The objects of the action's kinds carrying ``match_labels`` in the policy's namespaces."""
    selector = ",".join(f"{key}={value}" for key, value in sorted(policy.match_labels.items()))
    found = []
    for namespace in policy.namespaces:
        for kind in policy.kinds:
            listed = api.request(
                "GET", _COLLECTIONS[kind].format(ns=namespace), query=[("labelSelector", selector)]
            )
            for obj in listed.get("items") or []:
                meta = obj["metadata"]
                template = (obj.get("spec") or {}).get("template") or {}
                labels = (template.get("metadata") or {}).get("labels") or {}
                found.append(Workload(meta["uid"], kind, meta["name"], namespace, dict(labels)))
    return found


def services_of(api: KubeApi, workload: Workload) -> list[str]:
    """Names of the Services in its namespace that serve it alone: a (non-empty) selector its
    pods match, and no pod of another owner among the pods it selects now (a Service shared
    with another workload is never deleted with this one)."""
    services = api.request("GET", _COLLECTIONS["Service"].format(ns=workload.namespace)).get("items") or []
    pods = api.request("GET", _COLLECTIONS["Pod"].format(ns=workload.namespace)).get("items") or []
    names = []
    for service in services:
        selector: dict[str, str] = (service.get("spec") or {}).get("selector") or {}
        if not selector or not selector.items() <= workload.pod_labels.items():
            continue
        selected = [p for p in pods if selector.items() <= (p["metadata"].get("labels") or {}).items()]
        if all(_controller(pod) == workload.uid for pod in selected):
            names.append(service["metadata"]["name"])
    return sorted(names)


def _controller(pod: RawObject) -> str | None:
    """The uid of the pod's controlling owner."""
    owners = pod["metadata"].get("ownerReferences") or []
    return next((o.get("uid") for o in owners if o.get("controller")), None)


def targets(action: Action, workload: Workload, services: list[str]) -> list[str]:
    """What the action changes: ``Kind/namespace/name`` of each object."""
    extra = [f"Service/{workload.namespace}/{name}" for name in services] if action is Action.DELETE else []
    return [workload.ref, *extra]


def act(
    api: KubeApi, policy: Policy, workload: Workload, services: list[str], *, idle_until: datetime
) -> None:
    """Do the policy's action to ``workload``; Kubernetes API errors propagate (the caller audits them)."""
    if policy.action is Action.ANNOTATE:
        note = (
            f"policy {policy.name}: GPU utilization under {policy.idle.gpu_utilization_below:g}% at "
            f"{policy.idle.checks} checks {policy.idle.interval_s:g} s apart until {idle_until.isoformat()}"
        )
        patch: RawObject = {"metadata": {"annotations": {IDLE_ANNOTATION: note}}}
        api.request("PATCH", workload.path, body=patch, content_type=MERGE_PATCH)
    elif policy.action is Action.SCALE_TO_ZERO:
        api.request(
            "PATCH", f"{workload.path}/scale", body={"spec": {"replicas": 0}}, content_type=MERGE_PATCH
        )
    else:
        options: RawObject = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        api.request("DELETE", workload.path, body=options)
        for name in services:
            api.request("DELETE", f"{_COLLECTIONS['Service'].format(ns=workload.namespace)}/{name}")
