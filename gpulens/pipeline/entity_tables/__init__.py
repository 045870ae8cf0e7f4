"""`gpulens tables`: the faust-streaming app that owns the entity tables.

Materialized tables of pods, nodes, device inventories, containers and workloads whose
changelogs are the public compacted topics gpulens.state.*.v1 (Avro, keys ``cluster/entity``),
plus the device changelog; exactly once (Kafka transactions), RocksDB stores recovered from the
changelogs, standby replicas, HTTP views of one entity.

Modules, one job each: ``app`` (the faust app, the tables and their topics), ``entities``
(pods, nodes, containers), ``devices`` (inventories, device changelog), ``forwarding`` and
``workloads`` (workload states from pods and workload events), ``writing`` (rows into tables),
``decoding`` (bad records to the DLQ), ``state_codec`` (table values), ``views`` (HTTP),
``exactly_once`` (faust's app and transport changed to restart after a kill -9),
``incarnations`` (fencing what a killed incarnation left open), ``running`` (wiring).
"""

from gpulens.pipeline.entity_tables.app import SOURCES, TablesOptions
from gpulens.pipeline.entity_tables.forwarding import forwarded_topic
from gpulens.pipeline.entity_tables.running import run_tables

__all__ = ["SOURCES", "TablesOptions", "forwarded_topic", "run_tables"]
