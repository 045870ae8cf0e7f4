-- Container lifecycle from the runtime (containerd's events, the node agent's containerd
-- collector): each container row also says where the container is in its life and how it ended.
-- Rows written before this migration have the defaults (no state, no exit, not OOM-killed).

ALTER TABLE containers
    ADD COLUMN IF NOT EXISTS state LowCardinality(Nullable(String))
        COMMENT 'CREATED, RUNNING, EXITED or DELETED, as containerd reports it; null where not known.' AFTER devices,
    ADD COLUMN IF NOT EXISTS exit_code Nullable(Int32)
        COMMENT 'The main process''s exit code once it exited (137: killed, e.g. by the OOM killer).' AFTER state,
    ADD COLUMN IF NOT EXISTS exited_at Nullable(DateTime64(3, 'UTC'))
        COMMENT 'When the main process exited.' AFTER exit_code,
    ADD COLUMN IF NOT EXISTS oom_killed Bool DEFAULT false
        COMMENT 'The kernel''s OOM killer struck the container.' AFTER exited_at;

ALTER TABLE container_events
    ADD COLUMN IF NOT EXISTS state LowCardinality(Nullable(String))
        COMMENT 'CREATED, RUNNING, EXITED or DELETED, as containerd reports it; null where not known.' AFTER devices,
    ADD COLUMN IF NOT EXISTS exit_code Nullable(Int32)
        COMMENT 'The main process''s exit code once it exited (137: killed, e.g. by the OOM killer).' AFTER state,
    ADD COLUMN IF NOT EXISTS exited_at Nullable(DateTime64(3, 'UTC'))
        COMMENT 'When the main process exited.' AFTER exit_code,
    ADD COLUMN IF NOT EXISTS oom_killed Bool DEFAULT false
        COMMENT 'The kernel''s OOM killer struck the container.' AFTER exited_at;
