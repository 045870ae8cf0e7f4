"""`gpulens api`: the Lens HTTP JSON API over the tables the ClickHouse sink writes.

A read side beside the rooms: it reads the sink's tables (through
:mod:`gpulens.consumers.clickhouse`'s client, opened read-only) and nothing else: no topic, no
operator state. It sits above the rooms and below the composition root; it never imports the
producers, the pipeline or the platform room (`lint-imports` checks both). The console, static
files served at ``/`` by the same process, lives in ``console/``.
"""
