"""Starting the app: tables, jobs and views wired together, run by a faust worker."""

from __future__ import annotations

import shutil

import faust

from gpulens.pipeline.entity_tables import devices, entities, views, workloads
from gpulens.pipeline.entity_tables.app import TablesOptions, build_app, define_tables
from gpulens.pipeline.entity_tables.decoding import Decoding
from gpulens.pipeline.entity_tables.forwarding import PodForwarder, forwarded_topic
from gpulens.pipeline.entity_tables.incarnations import Ledger
from gpulens.pipeline.entity_tables.writing import StateWriter
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.wire.codec import AvroCodec


def run_tables(kafka: KafkaSettings, codec: AvroCodec, options: TablesOptions, *, loglevel: str) -> None:
    """Run until SIGTERM/SIGINT (faust's worker stops the app cleanly on them). The source
    topics, the state topics and ``forwarded_topic(options.group_id)`` must exist.

    Every start first aborts what earlier incarnations left open and drops the local stores:
    a store may hold writes of a transaction that a kill -9 left uncommitted (and the fencing
    aborts), so it is rebuilt from the committed changelogs (read_committed)."""
    ledger = Ledger(options.ledger)
    ledger.fence_previous(kafka)
    shutil.rmtree(options.stores, ignore_errors=True)
    app = build_app(kafka, options, ledger)
    tables = define_tables(app)
    decoding = Decoding(kafka, codec, consumer=options.group_id)
    writer = StateWriter(codec, tables)
    forwarded = forwarded_topic(options.group_id)
    entities.register(app, decoding, writer, PodForwarder(kafka, forwarded))
    devices.register(app, tables, codec, decoding, writer)
    workloads.register(app, tables, decoding, writer, forwarded)
    views.register(app, tables, codec)
    try:
        faust.Worker(app, loglevel=loglevel).execute_from_commandline()
    finally:
        decoding.close()
