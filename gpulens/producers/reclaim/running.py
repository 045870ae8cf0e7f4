"""One reclaim run: read the usage, judge every opted-in workload, act (only when applying),
and publish every decision on gpulens.reclaim.audit.v1.

Safety comes first: nothing is changed unless ``apply`` is set; only objects the API server
lists under the policy's selector are candidates; usage whose newest window ended more than
``max_age_s`` ago (a stopped pipeline) decides nothing; a failed request is audited as FAILED
and the run goes on to the next workload. Idle workloads that did not opt in are audited as
SKIPPED (``not-opted-in``), so the trail shows what a wider policy would have touched. With
``cpu_millicores_below`` the workloads idle on their GPUs are also checked live on their CPU
(:mod:`~gpulens.producers.reclaim.metering`) before anything is done.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.exceptions import KubernetesApiError
from gpulens.producers.publishing import BasePublisher
from gpulens.producers.reclaim.acting import Workload, act, opted_in, services_of, targets
from gpulens.producers.reclaim.judging import NO_USAGE, Judgement, judge, newest_end
from gpulens.producers.reclaim.metering import CPU_IDLE, CpuJudgement, cpu_checks
from gpulens.producers.reclaim.policy import Action, Policy
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import ReclaimDecision, ReclaimVerdict, WorkloadGpuUsage
from gpulens.schemas.model.topics import RECLAIM_AUDIT

SOURCE = "gpulens-reclaim"
STALE, NOT_OPTED_IN = "stale-usage", "not-opted-in"
UsageReader = Callable[[datetime], list[WorkloadGpuUsage]]
"""The cluster's workload usage rows produced since a wall time (:func:`~.reading.read_usage`)."""


def reclaim(
    api: KubeApi, policy: Policy, read: UsageReader, publisher: BasePublisher, *, apply: bool = False
) -> list[ReclaimDecision]:
    """Run ``policy`` once; every decision, as published.

    Each decision is published as it is made, and an action's is acknowledged by the broker
    before the next workload is looked at: a run that dies leaves at most its last action
    unaudited.
    """
    now = datetime.now(UTC)
    idle = policy.idle
    rows = read(now - timedelta(seconds=idle.max_age_s + idle.checks * idle.interval_s))
    usage: dict[str, list[WorkloadGpuUsage]] = defaultdict(list)
    for row in rows:
        usage[row.workload_uid].append(row)
    end = newest_end(rows)
    run = _Run(policy, publisher, now, uuid.uuid4().hex, dry_run=not apply)
    candidates = opted_in(api, policy)
    if end is None or end < now - timedelta(seconds=idle.max_age_s):
        for workload in candidates:
            run.decide(workload, ReclaimVerdict.SKIPPED, STALE if end else NO_USAGE)
    else:
        _judge_and_act(api, run, candidates, usage, end, apply=apply)
        chosen = {workload.uid for workload in candidates}
        for uid, windows in usage.items():
            judged = judge(windows, idle, end)
            if uid not in chosen and judged.idle:
                newest = max(windows, key=lambda row: row.window_start)
                other = Workload(uid, newest.workload_kind, newest.workload_name, newest.namespace, {})
                run.decide(other, ReclaimVerdict.SKIPPED, NOT_OPTED_IN, judged, end)
    publisher.flush()
    return run.decisions


def _judge_and_act(
    api: KubeApi,
    run: _Run,
    candidates: list[Workload],
    usage: dict[str, list[WorkloadGpuUsage]],
    end: datetime,
    *,
    apply: bool,
) -> None:
    """The opted-in workloads on fresh usage up to ``end``: judged, then acted on if idle."""
    policy, idle = run.policy, run.policy.idle
    gpu_idle: list[tuple[Workload, Judgement]] = []
    for workload in candidates:
        judged = judge(usage.get(workload.uid, []), idle, end)
        if judged.idle:
            gpu_idle.append((workload, judged))
        else:
            run.decide(workload, ReclaimVerdict.SKIPPED, judged.reason, judged, end)
    below = idle.cpu_millicores_below
    cpu = cpu_checks(api, [w for w, _ in gpu_idle], idle, below) if below is not None and gpu_idle else {}
    for workload, judged in gpu_idle:
        if cpu and cpu[workload.uid].reason != CPU_IDLE:
            run.decide(workload, ReclaimVerdict.SKIPPED, cpu[workload.uid].reason, judged, end, cpu=cpu)
            continue
        services = services_of(api, workload) if policy.action is Action.DELETE else []
        changed = targets(policy.action, workload, services)
        if not apply:
            run.decide(workload, ReclaimVerdict.WOULD_ACT, judged.reason, judged, end, changed, cpu=cpu)
            continue
        try:
            act(api, policy, workload, services, idle_until=end)
        except KubernetesApiError as err:
            run.decide(workload, ReclaimVerdict.FAILED, str(err), judged, end, changed, cpu=cpu)
        else:
            run.decide(workload, ReclaimVerdict.ACTED, judged.reason, judged, end, changed, cpu=cpu)
        run.publisher.flush()


class _Run:
    """What every decision of one run shares, and the decisions made so far."""

    def __init__(
        self, policy: Policy, publisher: BasePublisher, now: datetime, run_id: str, *, dry_run: bool
    ) -> None:
        self.policy, self.publisher, self.now, self.run_id, self.dry_run = (
            policy,
            publisher,
            now,
            run_id,
            dry_run,
        )
        self.decisions: list[ReclaimDecision] = []

    def decide(
        self,
        workload: Workload,
        verdict: ReclaimVerdict,
        reason: str,
        judged: Judgement | None = None,
        end: datetime | None = None,
        changed: list[str] | None = None,
        *,
        cpu: dict[str, CpuJudgement] | None = None,
    ) -> None:
        """Record one decision and queue it on the audit topic."""
        acting = verdict is not ReclaimVerdict.SKIPPED
        decision = ReclaimDecision(
            event_id=event_id(self.policy.cluster, SOURCE, self.run_id, workload.uid),
            cluster=self.policy.cluster,
            event_time=self.now,
            source=SOURCE,
            run_id=self.run_id,
            policy=self.policy.name,
            dry_run=self.dry_run,
            verdict=verdict,
            reason=reason,
            action=self.policy.action.value if acting else None,
            workload_uid=workload.uid,
            workload_kind=workload.kind,
            workload_name=workload.name,
            namespace=workload.namespace,
            targets=changed or [],
            checks=self.policy.idle.checks,
            idle_checks=judged.idle_checks if judged else 0,
            utilization_max=judged.utilization_max if judged else None,
            idle_until=end,
            cpu_millicores_max=cpu[workload.uid].millicores_max if cpu else None,
        )
        self.publisher.publish(RECLAIM_AUDIT, decision)
        self.decisions.append(decision)
