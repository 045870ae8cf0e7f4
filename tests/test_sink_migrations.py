"""Migrations: every table exists with the columns the sink writes; applying twice is applying once."""

from __future__ import annotations

from consumers.clickhouse.client import get_client
from consumers.clickhouse.migrating import load_migrations, migrate
from consumers.clickhouse.rows import TABLES


def test_migrate_twice_is_migrate_once_and_creates_every_table(platform, unique) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"mig_{unique}"})
    first = migrate(settings, samples_ttl_days=30)
    second = migrate(settings, samples_ttl_days=30)

    assert first == [f"applied {m.name}" for m in load_migrations()]
    assert second == []
    client = get_client(settings, database=settings.database)
    recorded = client.query("SELECT version, name FROM schema_migrations ORDER BY version").result_rows
    assert recorded == [(m.version, m.name) for m in load_migrations()], "recorded once each"
    columns: dict[str, list[str]] = {}
    for table, column in client.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() ORDER BY table, position"
    ).result_rows:
        columns.setdefault(table, []).append(column)
    assert set(columns) == {t.name for t in TABLES} | {"schema_migrations"}
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
