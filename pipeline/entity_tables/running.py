"""Starting the app: tables, jobs and views wired together, run by a faust worker."""

from __future__ import annotations

import faust

from pipeline.entity_tables import devices, entities, views, workloads
from pipeline.entity_tables.app import TablesOptions, build_app, define_tables
from pipeline.entity_tables.decoding import Decoding
from pipeline.entity_tables.forwarding import PodForwarder, forwarded_topic
from pipeline.entity_tables.writing import StateWriter
from schemas.codec import AvroCodec
from schemas.settings import KafkaSettings


def run_tables(kafka: KafkaSettings, codec: AvroCodec, options: TablesOptions, *, loglevel: str) -> None:
    """Run until SIGTERM/SIGINT (faust's worker stops the app cleanly on them). The source
    topics, the state topics and ``forwarded_topic(options.group_id)`` must exist."""
    app = build_app(kafka, options)
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
