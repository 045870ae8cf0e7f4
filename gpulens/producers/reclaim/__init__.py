"""Opt-in idle reclaim: the cleanup job of the Focus-Server note, done safely.

policy      the policy file: opted-in namespaces and labels, the idle definition, the action
judging     idle or not, from a workload's workload_gpu_usage windows (pure, event time)
reading     those windows, read back from gpulens.agg.workload-gpu-usage.v1
metering    optional CPU checks, live, from metrics.k8s.io PodMetrics
acting      opted-in objects, and the annotate / scale-to-zero / delete requests
running     one run: judge, decide, act (only with --apply), audit every decision
orphans     Services selecting no pod, finished Jobs past their TTL, pending pods without owner

Every decision is a ReclaimDecision on gpulens.reclaim.audit.v1. Its RBAC is not the watchers'
(deploy/k8s/reclaim-rbac.yaml).
"""
