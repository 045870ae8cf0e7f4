"""Versioned, idempotent schema migrations, recorded in ``schema_migrations``.

Migrations are the numbered files ``migrations/NNNN_name.sql``: statements separated by a
``;`` at the end of a line, each idempotent on its own (``CREATE ... IF NOT EXISTS``), so a
run interrupted half-way is finished by the next one. A migration is recorded once all its
statements ran; one whose file changed after it was applied is an error (add a new one).
``$name`` placeholders take values from the settings: ``$samples_ttl`` (0003, the TTL gpu_samples
was created with, by event time) and ``$samples_ingest_ttl`` (0010, by insertion time, what it
is since); the gpu_samples TTL is re-applied whenever the setting no longer matches the table.
Every MergeTree table gets :data:`MERGE_SELECTOR_BASE` as its ``merge_selector_base`` where the
server has that setting and the table sets none of its own (:func:`_widen_merges`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from string import Template

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as DriverError

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.exceptions import MigrationError, translate
from gpulens.consumers.clickhouse.settings import ClickHouseSettings

__all__ = [
    "MERGE_SELECTOR_BASE",
    "MIGRATIONS_DIR",
    "Migration",
    "load_migrations",
    "merges_widened",
    "migrate",
]

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SAMPLES_TTL = "inserted_at + INTERVAL {days} DAY"
"""TTL of gpu_samples, from when a row was inserted (a replay of old samples stays); the table's
engine shows it as ``toIntervalDay(N)``."""
MERGE_SELECTOR_BASE = 20
"""Every table's ``merge_selector_base`` (ClickHouse's default 5, "expert level"): how many parts
of a similar size a merge waits for. The sink inserts a part into each table it writes about
every second, and each row is merged again at every level. At 50,000 rows/s into a copy of
gpu_samples for 600 s (``python -m bench.sample_merges``) the merge threads took 32.7 % of a core
with 5 and 21.3 % with 20, the table holding more parts meanwhile (18 at the end against 7) and
the process up to 50 MB more while 20 parts merge at once. The small tables (pods, workloads,
containers and their events: thousands of rows, a part a second) merged their one large part
again with each few new ones: at 30,000 GPUs (``python -m bench.e2e_scale``) the holder's merge
threads took 11.0 % of a core with 5 on them and 3.9 % with 20, each table holding 13 parts at
most."""
_CREATED_SAMPLES_TTL = "toDateTime(event_time) + INTERVAL {days} DAY"
"""The TTL 0003 created gpu_samples with, before the table had ``inserted_at`` (0010)."""

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_COMMENT_LINE = re.compile(r"^\s*--.*$", re.MULTILINE)
_TTL_DAYS = re.compile(r"toIntervalDay\((\d+)\)")

_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32 COMMENT 'Number of the migration file.',
    name String COMMENT 'Name of the migration file.',
    checksum String COMMENT 'blake2b of the file as applied.',
    applied_at DateTime64(3, 'UTC') COMMENT 'When it was applied.'
)
ENGINE = ReplacingMergeTree
ORDER BY version
COMMENT 'Migrations applied to this database (gpulens db migrate).'
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.blake2b(self.text.encode(), digest_size=16).hexdigest()

    def statements(self, values: dict[str, str]) -> list[str]:
        """The statements with the placeholders filled in, comment-only chunks left out."""
        rendered = Template(self.text).substitute(values)
        chunks = (chunk.strip() for chunk in _STATEMENT_END.split(rendered))
        return [chunk for chunk in chunks if _COMMENT_LINE.sub("", chunk).strip()]


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file in ``directory``, in version order."""
    migrations: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise MigrationError(f"{path}: migration files are named NNNN_name.sql")
        version = int(match.group(1))
        if version in migrations:
            raise MigrationError(f"{path}: version {version} is also {migrations[version].name}")
        migrations[version] = Migration(version, path.stem, path.read_text())
    return [migrations[v] for v in sorted(migrations)]


def migrate(settings: ClickHouseSettings, *, samples_ttl_days: int) -> list[str]:
    """Create the database and apply what is missing; what was done, one line per step."""
    database = settings.database
    _run(get_client(settings), f"CREATE DATABASE IF NOT EXISTS `{database}`", f"database {database}")
    client = get_client(settings, database=database)
    _run(client, _SCHEMA_MIGRATIONS, "schema_migrations")
    recorded_rows = _rows(client, "SELECT version, checksum FROM schema_migrations FINAL")
    applied = {row[0]: row[1] for row in recorded_rows}
    values = {
        "samples_ttl": _CREATED_SAMPLES_TTL.format(days=samples_ttl_days),
        "samples_ingest_ttl": SAMPLES_TTL.format(days=samples_ttl_days),
    }
    done: list[str] = []
    for migration in load_migrations():
        recorded = applied.get(migration.version)
        if recorded is not None:
            if recorded != migration.checksum:
                raise MigrationError(
                    f"{migration.name} changed after it was applied to {database}; "
                    "never edit an applied migration, add a new one"
                )
            continue
        for statement in migration.statements(values):
            _run(client, statement, f"migration {migration.name}")
        try:
            client.insert(
                "schema_migrations",
                [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
                column_names=["version", "name", "checksum", "applied_at"],
            )
        except DriverError as err:
            raise translate(err, f"recording migration {migration.name}") from err
        done.append(f"applied {migration.name}")
    if _set_samples_ttl(client, samples_ttl_days):
        done.append(f"gpu_samples TTL set to {samples_ttl_days} days")
    if widened := _widen_merges(client):
        done.append(merges_widened(widened))
    return done


def _set_samples_ttl(client: Client, days: int) -> bool:
    found = _TTL_DAYS.search(_samples_engine(client))
    if found is not None and int(found.group(1)) == days:
        return False
    _run(client, f"ALTER TABLE gpu_samples MODIFY TTL {SAMPLES_TTL.format(days=days)}", "gpu_samples TTL")
    return True


def merges_widened(tables: int) -> str:
    """``migrate``'s line for ``tables`` tables given :data:`MERGE_SELECTOR_BASE`."""
    return (
        f"{tables} {'table merges' if tables == 1 else 'tables merge'} about {MERGE_SELECTOR_BASE} "
        "parts of a size at once"
    )


def _widen_merges(client: Client) -> int:
    """Set :data:`MERGE_SELECTOR_BASE` as ``merge_selector_base`` of every MergeTree table of the
    database, once: not on a server without the setting (older ClickHouse), nor on a table that
    sets it already (an operator's own choice stays). How many tables were set."""
    known = _rows(client, "SELECT count() FROM system.merge_tree_settings WHERE name = 'merge_selector_base'")
    if not known or known[0][0] == 0:
        return 0
    tables = _rows(
        client,
        "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree' "
        "AND position(engine_full, 'merge_selector_base') = 0 ORDER BY name",
    )
    for (table,) in tables:
        _run(
            client,
            f"ALTER TABLE `{table}` MODIFY SETTING merge_selector_base = {MERGE_SELECTOR_BASE}",
            f"{table} merge_selector_base",
        )
    return len(tables)


def _samples_engine(client: Client) -> str:
    """gpu_samples' ``engine_full``: its engine, sorting key, TTL and settings ('' without it)."""
    engine = _rows(
        client,
        "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = 'gpu_samples'",
    )
    return str(engine[0][0]) if engine else ""


def _run(client: Client, statement: str, what: str) -> None:
    try:
        client.command(statement)
    except DriverError as err:
        raise translate(err, what) from err


def _rows(client: Client, query: str) -> list[tuple[object, ...]]:
    try:
        return [tuple(row) for row in client.query(query).result_rows]
    except DriverError as err:
        raise translate(err, query) from err
