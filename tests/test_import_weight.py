"""A process loads the libraries of its own job, not those of every other command nor those a
library could use: each long-running process of the pipeline keeps what it imported for its
whole life."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sink_support import SinkProcesses, wait_for

CLIENTS = ("numpy", "grpc", "kubernetes", "clickhouse_connect", "confluent_kafka.schema_registry", "chdb")
"""Libraries of some commands only (tens of MB each, once imported)."""

LOADED = """
import json, sys
{action}
print(json.dumps(sorted(m for m in {clients!r} if m in sys.modules)))
"""


def loaded_after(action: str) -> list[str]:
    """Which of :data:`CLIENTS` a fresh interpreter holds after ``action``."""
    code = LOADED.format(action=action, clients=CLIENTS)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return list(json.loads(out.stdout.splitlines()[-1]))


def test_the_configuration_loads_no_client_library() -> None:
    assert loaded_after("import gpulens.config; gpulens.config.load_settings(None)") == []


@pytest.mark.parametrize("command", ["retention", "exporter", "sink"])
def test_a_command_loads_none_of_the_libraries_only_others_use(command: str) -> None:
    """`gpulens CMD --help` loads CMD's module (and the settings); numpy (the load generator,
    the worker's columnar reads), gRPC (the agent, the gateway), the Kubernetes client (the
    watchers) and chDB (the ClickHouse holder) stay out."""
    run = f"""
from gpulens.cli import cli
try:
    cli(["{command}", "--help"], standalone_mode=False)
except SystemExit:
    pass
"""
    loaded = loaded_after(run)
    assert not {"numpy", "grpc", "kubernetes", "chdb"} & set(loaded), loaded


def test_the_retention_job_loads_neither_the_codec_nor_the_schema_registry_client() -> None:
    """It needs the topics each pipeline group reads, not the sink's and the exporter's
    machinery that names them (the running job held 69 MB with them)."""
    run = """
import gpulens.config
from gpulens.commands.retention import retention_policy
retention_policy(gpulens.config.load_settings(None))
"""
    assert "confluent_kafka.schema_registry" not in loaded_after(run)


def test_a_codec_at_work_loads_no_schema_registry_client_library(platform) -> None:
    """The worker, the sink and the exporter register and look up schemas through the
    pipeline's own client: confluent-kafka's would bring 287 modules more (its OAuth, JWT and
    asyncio machinery), about 15 MB in each of them."""
    run = f"""
from gpulens.schemas.model.topics import PODS
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events
codec = AvroCodec(registry_client({platform.registry.url!r}))
event = example_events()[PODS]
assert AvroCodec(registry_client({platform.registry.url!r})).decode(PODS, codec.encode(PODS, event)) == event
"""
    assert "confluent_kafka.schema_registry" not in loaded_after(run)


def test_a_sink_that_stored_rows_holds_neither_pandas_nor_arrow(
    platform, codec, config_file, unique, spawned
) -> None:
    """clickhouse-connect imports pandas (and with it pyarrow, 70 MB) on the first insert of
    rows, to tell them from a DataFrame; the sink inserts rows only (its migrations included)."""
    sinks = SinkProcesses(platform, config_file, spawned, group=f"sink-{unique}", database=f"light_{unique}")
    expected = sinks.load(codec, f"light-{unique}", 10)
    sink = sinks.start()
    wait_for(lambda: sinks.stored() >= expected, 120, "the sink to store the samples")
    libraries = Path(f"/proc/{sink.pid}/maps").read_text()
    assert "libarrow" not in libraries
    assert "/pandas/" not in libraries
