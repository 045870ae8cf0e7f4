"""What one INSERT statement costs the ClickHouse engine, by table and rows, beside bare ones.

    python -m bench.insert_cost [--tables pods,workloads,nodes,alerts,containers] [--rows 1,20,200]

The sink writes each table its batch holds once a batch (about every second), so every small
table the pipeline keeps (pods, workloads, containers, their events) costs ClickHouse a
statement, a new part and later its merges every second, however few rows it brings. In a fresh
in-process engine (chDB, as the holder runs it) with the sink's migrations, this inserts
``--rows`` rows of random content (ClickHouse's ``generateRandom``, times set to now so one part
is one partition) into each table, ``--statements`` times, each with its own deduplication token
as the sink's are, and prints the process's CPU per statement. The baselines: ``SELECT 1``, and
a one-row insert into a bare two-column MergeTree table. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.consumers.clickhouse.settings import ClickHouseSettings


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.insert_cost",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--tables", default="pods,workloads,nodes,alerts,containers", help="Tables to insert into."
    )
    parser.add_argument("--rows", default="1,20,200", help="Rows per statement.")
    parser.add_argument("--statements", type=int, default=50, help="Statements per table and row count.")
    args = parser.parse_args(argv)
    path = tempfile.mkdtemp(prefix="insert-cost-")
    try:
        settings = ClickHouseSettings(url=f"chdb://{path}", database="bench")
        migrate(settings, samples_ttl_days=30)
        client = get_client(settings, database="bench")
        client.command("CREATE TABLE bare (a UInt64, b String) ENGINE = MergeTree ORDER BY a")

        statements: int = args.statements

        def per_statement_ms(statement: str) -> float:
            started = _cpu_s()
            for n in range(statements):
                client.command(statement.format(n=n))
            return (_cpu_s() - started) * 1000 / statements

        counts = [int(r) for r in args.rows.split(",") if r]
        print(f"CPU ms per statement (in-process chDB, {statements} statements each)")
        print(f"{'':24}" + "".join(f"{f'{r:,} rows':>12}" for r in counts))
        print(f"{'SELECT 1 (baseline)':24}{per_statement_ms('SELECT 1'):>12.1f}")
        bare = per_statement_ms("INSERT INTO bare VALUES ({n}, 'x')")
        print(f"{'bare 2-column table, 1':24}{bare:>12.1f}")
        for table in (t for t in args.tables.split(",") if t):
            times = client.query(
                "SELECT name FROM system.columns WHERE database = 'bench' AND table = {table:String} "
                "AND type LIKE 'DateTime%' AND default_kind != 'MATERIALIZED'",
                parameters={"table": table},
            ).result_rows
            now = ", ".join(f"now64(3) AS {name}" for (name,) in times)
            replace = f" REPLACE ({now})" if now else ""
            cells = [
                per_statement_ms(
                    f"INSERT INTO {table} SELECT *{replace} FROM generateRandom() LIMIT {rows} "
                    f"SETTINGS insert_deduplication_token = '{table}-{rows}-{{n}}'"
                )
                for rows in counts
            ]
            print(f"{table:24}" + "".join(f"{cell:>12.1f}" for cell in cells), flush=True)
        client.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
