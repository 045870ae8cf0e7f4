-- Device changes decoded by ClickHouse itself, as GPU sample batches are (0011): the sink inserts
-- the Kafka values of gpulens.changelog.devices.v1 as they are (INSERT INTO device_changes FORMAT
-- AvroConfluent); the view below stores each one as its device_changelog row, the row the Python
-- mapper writes. A cluster's start brings two per device (a GPU and an RDMA port each), 200,000 at
-- 100,000 GPUs, which the sink decoded one by one. device_changes keeps nothing (Null engine). Its
-- constraints are the event model's rules (non-empty names, UTF-8 text, event time in
-- [2000, 2100)); Avro enums out of range are refused by the format itself. A refused set is split,
-- and the record goes to the DLQ through the Python decoder with its reason.

CREATE TABLE IF NOT EXISTS device_changes
(
    event_id String,
    cluster String,
    event_time DateTime64(3, 'UTC'),
    source String,
    node String,
    change String,
    device_kind String,
    device_id String,
    changed Array(String),
    before Map(String, String),
    after Map(String, String),
    CONSTRAINT names CHECK length(cluster) > 0 AND length(source) > 0 AND length(node) > 0
        AND isValidUTF8(event_id) AND isValidUTF8(cluster) AND isValidUTF8(source) AND isValidUTF8(node)
        AND isValidUTF8(device_id) AND arrayAll(v -> isValidUTF8(v), changed)
        AND arrayAll(v -> isValidUTF8(v), arrayConcat(mapKeys(before), mapValues(before), mapKeys(after), mapValues(after))),
    CONSTRAINT event_time CHECK event_time >= toDateTime64('2000-01-01 00:00:00', 3, 'UTC')
        AND event_time < toDateTime64('2100-01-01 00:00:00', 3, 'UTC')
)
ENGINE = Null
COMMENT 'DeviceChange records as the sink receives them (gpulens.changelog.devices.v1); kept nowhere: device_changelog_from_changes stores them.';

CREATE MATERIALIZED VIEW IF NOT EXISTS device_changelog_from_changes TO device_changelog
(
    event_id String,
    cluster LowCardinality(String),
    event_time DateTime64(3, 'UTC'),
    source LowCardinality(String),
    node LowCardinality(String),
    change LowCardinality(String),
    device_kind LowCardinality(String),
    device_id String,
    changed Array(String),
    before Map(String, String),
    after Map(String, String)
)
AS SELECT event_id, cluster, event_time, source, node, change, device_kind, device_id, changed, before, after
FROM device_changes;
