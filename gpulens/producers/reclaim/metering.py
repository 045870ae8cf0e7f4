"""CPU millicores of workloads' pods at each check, from the resource metrics API.

metrics.k8s.io (metrics-server) keeps no history: it answers each pod's recent usage now. So
these checks run live, as the Focus-Server cleanup job ran them: ``checks`` rounds ``interval_s``
apart (wall clock), one list of PodMetrics per namespace per round; a workload's usage is the
sum over the containers of the pods its pod template's labels select. A check is idle under
``cpu_millicores_below``; no metrics for its pods is ``cpu-unmeasured``, one check at or above it
``cpu-busy``. Rounds stop early once no workload can still be idle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.quantities import parse_quantity
from gpulens.producers.reclaim.acting import Workload
from gpulens.producers.reclaim.policy import IdleDefinition

CPU_IDLE, CPU_BUSY, CPU_UNMEASURED = "idle", "cpu-busy", "cpu-unmeasured"
_PODMETRICS = "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods"


@dataclass(frozen=True, slots=True)
class CpuJudgement:
    """What the CPU checks found about one workload."""

    reason: str
    """CPU_IDLE when every check was idle; else why the first non-idle one was not."""
    millicores_max: float | None
    """Highest CPU its pods used at a check, millicores."""


def cpu_checks(
    api: KubeApi,
    workloads: Sequence[Workload],
    idle: IdleDefinition,
    below: float,
) -> dict[str, CpuJudgement]:
    """Per workload uid, ``idle``'s checks of its pods' CPU against ``below`` millicores."""
    seen: dict[str, list[float]] = {w.uid: [] for w in workloads}
    failed: dict[str, str] = {}
    for check in range(idle.checks):
        if check:
            time.sleep(idle.interval_s)
        pods_of = {
            ns: _usage(api, ns) for ns in sorted({w.namespace for w in workloads if w.uid not in failed})
        }
        for workload in workloads:
            if workload.uid in failed:
                continue
            used = [
                m
                for labels, m in pods_of[workload.namespace]
                if workload.pod_labels.items() <= labels.items()
            ]
            if not used or not workload.pod_labels:
                failed[workload.uid] = CPU_UNMEASURED
                continue
            seen[workload.uid].append(sum(used))
            if sum(used) >= below:
                failed[workload.uid] = CPU_BUSY
        if len(failed) == len(workloads):
            break
    return {
        w.uid: CpuJudgement(failed.get(w.uid, CPU_IDLE), max(seen[w.uid], default=None)) for w in workloads
    }


def _usage(api: KubeApi, namespace: str) -> list[tuple[dict[str, str], float]]:
    """(labels, millicores) of every pod the metrics API reports in ``namespace``."""
    found = []
    for item in api.request("GET", _PODMETRICS.format(ns=namespace)).get("items") or []:
        cpu = sum(
            parse_quantity((c.get("usage") or {}).get("cpu", "0")) for c in item.get("containers") or []
        )
        found.append((dict(item["metadata"].get("labels") or {}), float(cpu * 1000)))
    return found
