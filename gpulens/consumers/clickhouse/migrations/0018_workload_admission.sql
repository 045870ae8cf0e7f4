-- Kueue's queued workloads (the watchers read kueue.x-k8s.io Workloads where they are served):
-- whether each is admitted, and why not. Null for every other kind of workload, and for rows
-- written before this migration.

ALTER TABLE workloads
    ADD COLUMN IF NOT EXISTS admitted Nullable(Bool)
        COMMENT 'A queued workload (Kueue''s Workload): admitted or not; null for every other kind.' AFTER replicas,
    ADD COLUMN IF NOT EXISTS admission_message Nullable(String)
        COMMENT 'Why a queued workload is not admitted, in its queue''s words.' AFTER admitted;

ALTER TABLE workload_events
    ADD COLUMN IF NOT EXISTS admitted Nullable(Bool)
        COMMENT 'A queued workload (Kueue''s Workload): admitted or not; null for every other kind.' AFTER replicas,
    ADD COLUMN IF NOT EXISTS admission_message Nullable(String)
        COMMENT 'Why a queued workload is not admitted, in its queue''s words.' AFTER admitted;
