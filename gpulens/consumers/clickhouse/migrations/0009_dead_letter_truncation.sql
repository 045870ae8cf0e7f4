-- Dead letters of oversize originals: the value column keeps the first 256 KiB only, so the
-- original's length and SHA-256 are stored beside it (null where the writer predates them).

ALTER TABLE dead_letters
    ADD COLUMN IF NOT EXISTS value_length Nullable(UInt64) COMMENT 'Original value length in bytes; null: no value, or an older writer.' AFTER value,
    ADD COLUMN IF NOT EXISTS value_sha256 Nullable(String) COMMENT 'SHA-256 of the whole original value, hex; null: no value, or an older writer.' AFTER value_length,
    ADD COLUMN IF NOT EXISTS value_truncated Bool DEFAULT false COMMENT 'The original was too large: value holds its first bytes only.' AFTER value_sha256;
