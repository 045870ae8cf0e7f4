-- The audit trail of idle reclaim (gpulens.reclaim.audit.v1): one row per decision of a
-- `gpulens reclaim run` about one workload, dry runs included. "What did reclaim do, or would it
-- have done, and why?" is a query on this table by run_id, verdict or workload.

CREATE TABLE IF NOT EXISTS reclaim_decisions
(
    event_id String COMMENT 'Deterministic id of the decision.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    event_time DateTime64(3, 'UTC') COMMENT 'When it was decided (wall time of the run).',
    source LowCardinality(String) COMMENT 'What decided (gpulens-reclaim).',
    run_id String COMMENT 'The run that decided (one per command invocation).',
    policy LowCardinality(String) COMMENT 'Name of the policy file''s policy.',
    dry_run Bool COMMENT 'True: nothing was changed (the default); false: --apply.',
    verdict LowCardinality(String) COMMENT 'SKIPPED, WOULD_ACT, ACTED or FAILED.',
    reason String COMMENT 'Why: idle, busy, unmeasured, no-usage, stale-usage, not-opted-in, ..., or the API error.',
    action LowCardinality(Nullable(String)) COMMENT 'annotate, scale-to-zero or delete (null: none).',
    workload_uid String COMMENT 'The workload''s uid.',
    workload_kind LowCardinality(String) COMMENT 'Deployment, StatefulSet, Job, ...',
    workload_name String COMMENT 'Its name.',
    namespace LowCardinality(String) COMMENT 'Its namespace.',
    targets Array(String) COMMENT 'Objects acted on or to act on: Kind/namespace/name.',
    checks UInt32 COMMENT 'Checks the policy asks for.',
    idle_checks UInt32 COMMENT 'Newest consecutive checks that found it idle.',
    utilization_max Nullable(Float64) COMMENT 'Highest GPU utilization the checks saw, %.',
    idle_until Nullable(DateTime64(3, 'UTC')) COMMENT 'Event time the usage it was judged on reached.',
    cpu_millicores_max Nullable(Float64) COMMENT 'Highest CPU its pods used at a live check (null: not checked).'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, event_time, run_id, workload_uid, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every decision of idle reclaim, dry runs included (gpulens.reclaim.audit.v1).';
