"""Migrations: every table exists with the columns the sink writes; applying twice is applying once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.migrating import (
    MERGE_SELECTOR_BASE,
    load_migrations,
    merges_widened,
    migrate,
)
from gpulens.consumers.clickhouse.queries import ADAPTER_VIEWS, DERIVED_TABLES
from gpulens.consumers.clickhouse.rows import INTAKE_TABLES, TABLES


def test_migrate_twice_is_migrate_once_and_creates_every_table(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"mig_{unique}"})
    first = migrate(settings, samples_ttl_days=30)
    second = migrate(settings, samples_ttl_days=30)

    client = get_client(settings, database=settings.database)
    assert first == [
        *(f"applied {m.name}" for m in load_migrations()),
        merges_widened(len(_merge_tree_engines(client))),
    ]
    assert second == []
    recorded = client.query("SELECT version, name FROM schema_migrations ORDER BY version").result_rows
    assert recorded == [(m.version, m.name) for m in load_migrations()], "recorded once each"
    columns: dict[str, list[str]] = {}
    for table, column in client.query(  # MATERIALIZED columns are filled by ClickHouse, never written
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() "
        "AND default_kind != 'MATERIALIZED' ORDER BY table, position"
    ).result_rows:
        columns.setdefault(table, []).append(column)
    assert set(columns) == {t.name for t in TABLES} | {
        "schema_migrations",
        *ADAPTER_VIEWS,
        *DERIVED_TABLES,
        *INTAKE_TABLES,
    }
    for table in TABLES:
        assert columns[table.name] == list(table.columns), f"{table.name}: SQL and rows.py disagree"


def test_changing_the_samples_ttl_is_applied_once(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"ttl_{unique}"})
    migrate(settings, samples_ttl_days=30)

    assert migrate(settings, samples_ttl_days=7) == ["gpu_samples TTL set to 7 days"]
    assert migrate(settings, samples_ttl_days=7) == []
    engine = get_client(settings).command(
        f"SELECT engine_full FROM system.tables WHERE database = 'ttl_{unique}' AND name = 'gpu_samples'"
    )
    assert "toIntervalDay(7)" in engine


def _merge_tree_engines(client) -> dict[str, str]:
    """engine_full of each MergeTree table of the client's database."""
    return dict(
        client.query(
            "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() "
            "AND engine LIKE '%MergeTree'"
        ).result_rows
    )


def test_every_table_merges_wider_than_clickhouses_default(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"width_{unique}"})
    migrate(settings, samples_ttl_days=30)

    engines = _merge_tree_engines(get_client(settings, database=settings.database))
    assert {"gpu_samples", "pods", "workloads", "containers"} <= set(engines)
    narrow = [
        name
        for name, engine in engines.items()
        if f"merge_selector_base = {MERGE_SELECTOR_BASE}" not in engine
    ]
    assert narrow == []


def _migrated_then(platform, database: str, change: str, tables: tuple[str, ...]):
    """A database migrated, then ``change`` (an ALTER TABLE's action) made to each of ``tables``:
    its settings and a client of it."""
    settings = platform.clickhouse.model_copy(update={"database": database})
    migrate(settings, samples_ttl_days=30)
    client = get_client(settings, database=settings.database)
    for table in tables:
        client.command(f"ALTER TABLE {table} {change}")
    return settings, client


def test_an_operators_own_merge_width_stays(platform, unique) -> None:
    settings, client = _migrated_then(
        platform, f"own_{unique}", "MODIFY SETTING merge_selector_base = 8", ("gpu_samples", "pods")
    )

    assert migrate(settings, samples_ttl_days=30) == []
    engines = _merge_tree_engines(client)
    assert "merge_selector_base = 8" in engines["gpu_samples"]
    assert "merge_selector_base = 8" in engines["pods"]


def test_a_database_that_widened_only_gpu_samples_widens_the_rest_once(platform, unique) -> None:
    """Migrated before every table was widened: the next migrate sets the others, and only once."""
    settings, client = _migrated_then(
        platform, f"rest_{unique}", "RESET SETTING merge_selector_base", ("pods", "workloads")
    )
    assert "merge_selector_base" not in _merge_tree_engines(client)["pods"]

    assert migrate(settings, samples_ttl_days=30) == [merges_widened(2)]
    assert migrate(settings, samples_ttl_days=30) == []
    assert f"merge_selector_base = {MERGE_SELECTOR_BASE}" in _merge_tree_engines(client)["workloads"]


def test_samples_of_a_past_trace_outlive_merges_the_ttl_counts_from_insertion(platform, unique) -> None:
    """A replay of 2022 samples must stay queryable: the TTL counts from when rows came in."""
    settings = platform.clickhouse.model_copy(update={"database": f"keep_{unique}"})
    migrate(settings, samples_ttl_days=30)
    client = get_client(settings, database=settings.database)
    taken = datetime(2022, 9, 11, tzinfo=UTC)
    samples = [("c", "n1", "g0", 0, taken + timedelta(seconds=30 * i), 50.0, f"e{i}") for i in range(100)]
    client.insert("gpu_samples", samples, column_names=SAMPLE_COLUMNS)
    client.command("OPTIMIZE TABLE gpu_samples FINAL")  # merges apply the TTL
    kept = client.query(
        "SELECT count(), countIf(inserted_at > now() - INTERVAL 10 MINUTE) FROM gpu_samples"
    ).result_rows
    assert kept == [(len(samples), len(samples))]


SAMPLE_COLUMNS = ["cluster", "node", "device_id", "gpu_index", "event_time", "utilization_pct", "event_id"]
USAGE_COLUMNS = [
    *("event_id", "cluster", "workload_uid", "workload_kind", "workload_name", "namespace", "window_start"),
    *("window_end", "gpus_allocated_avg", "gpus_allocated_max", "gpus_allocated_end", "utilization_avg"),
    *("utilization_max", "samples", "pods_active_end"),
]


def test_primus_safe_adapter_views(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"views_{unique}"})
    migrate(settings, samples_ttl_days=30)
    client = get_client(settings, database=settings.database)
    newest = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)  # inside the samples' TTL
    samples = [  # node n1: 20 % long ago, then 40 % and 60 % within the last 5 minutes
        ("c", "n1", "g0", 0, newest - timedelta(minutes=30), 20.0, "e1"),
        ("c", "n1", "g0", 0, newest - timedelta(minutes=4), 40.0, "e2"),
        ("c", "n1", "g1", 1, newest, 60.0, "e3"),
    ]
    client.insert("gpu_samples", samples, column_names=SAMPLE_COLUMNS)
    hour = timedelta(hours=1)
    older = ("a", "c", "w", "Deployment", "web", "ns", newest - hour, newest, 2.0, 2.0, 2.0, 10.0, 20.0, 5, 2)
    newer = ("b", "c", "w", "Deployment", "web", "ns", newest, newest + hour, 3.0, 4.0, 4.0, 30.0, 50.0, 9, 4)
    client.insert("workload_gpu_usage", [older, newer], column_names=USAGE_COLUMNS)

    nodes = client.query("SELECT cluster, node, gpu_utilization FROM node_statistic").result_rows
    assert nodes == [("c", "n1", 50.0)]
    workloads = client.query(
        "SELECT workload_kind, workload_name, gpu_allocated, gpu_utilization, active_pods "
        "FROM workload_statistic"
    ).result_rows
    assert workloads == [("Deployment", "web", 4.0, 30.0, 4)]
