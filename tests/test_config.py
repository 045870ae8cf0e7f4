"""Settings from a TOML file and GPULENS_* variables, with errors that say what to fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sink_support import wait_for

from gpulens.cli_context import with_flags
from gpulens.commands.worker import worker
from gpulens.config import load_settings
from gpulens.pipeline.settings import PipelineSettings
from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.exceptions import ConfigError


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPULENS_"):
            monkeypatch.delenv(name)


def test_defaults_describe_the_embedded_platform() -> None:
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert settings.platform.broker == "noida"
    assert settings.chdb_path == Path(".gpulens/clickhouse")


def test_environment_sets_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_KAFKA__BOOTSTRAP_SERVERS", "kafka-0:9092")
    monkeypatch.setenv("GPULENS_CLICKHOUSE__HTTP_PORT", "8124")
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "kafka-0:9092"
    assert settings.clickhouse.http_port == 8124


def test_file_sets_values_and_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text('cluster = "prod-a"\n[kafka]\nbootstrap_servers = "from-file:9092"\n')
    monkeypatch.setenv("GPULENS_KAFKA__BOOTSTRAP_SERVERS", "from-env:9092")
    settings = load_settings(path)
    assert settings.cluster == "prod-a"
    assert settings.kafka.bootstrap_servers == "from-env:9092"


def test_invalid_value_names_the_setting_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text('[platform]\nbroker = "redpanda"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "platform.broker" in message
    assert "GPULENS_PLATFORM__BROKER" in message
    assert f"[platform] broker in {path}" in message
    assert "'redpanda'" in message


def test_unknown_setting_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text("[kafka]\nbootstrap_server = 'typo:9092'\n")
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server: Extra inputs are not permitted"):
        load_settings(path)


def test_producers_compress_as_configured_and_consumers_are_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """compression.type is a producer property: librdkafka warns on a consumer given it."""
    kafka = load_settings(None).kafka
    assert kafka.producer()["compression.type"] == "zstd"
    assert "compression.type" not in kafka.streaming_consumer(**{"group.id": "g"})
    monkeypatch.setenv("GPULENS_KAFKA__COMPRESSION", "lz4")
    assert load_settings(None).kafka.producer(acks="all")["compression.type"] == "lz4"
    monkeypatch.setenv("GPULENS_KAFKA__COMPRESSION", "brotli")
    choices = "'none', 'gzip', 'snappy', 'lz4' or 'zstd'"
    with pytest.raises(ConfigError, match=rf"kafka\.compression: Input should be {choices}"):
        load_settings(None)


def test_broken_toml_says_where(tmp_path: Path) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text("[kafka\n")
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 1"):
        load_settings(path)


def test_a_list_variable_that_is_not_json_is_one_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPULENS_RETENTION__IGNORED_GROUPS", "probe")
    with pytest.raises(ConfigError) as caught:
        load_settings(None)
    assert str(caught.value).startswith("invalid settings: GPULENS_RETENTION__IGNORED_GROUPS: ")
    assert "must be JSON" in str(caught.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


# --- [pipeline]: the worker's options ----------------------------------------------------------

WORKER_FLAG_DEFAULTS = {
    "window_s": 30,
    "per_node": True,
    "overview": True,
    "processors": ("allocation", "workloads", "idle", "alerts", "changelog", "state", "pending"),
    "latest_every_s": 15.0,
    "idle_below": 5.0,
    "idle_for": 600.0,
    "pending_for": 300.0,
    "stale_after": 300.0,
    "idle_window_s": 3600,
    "owner_labels": (),
    "compute_idle_below": 1.0,
    "memory_floor_mib": 1024,
    "sample_valid_s": 300.0,
    "pile_up_pods": 5,
    "pile_up_idle_gpus": 1,
    "group_id": "gpulens-worker",
    "idle_ms": 3000,
    "source_timeout_s": 10.0,
    "allowed_lateness_s": 0.0,
    "hold_records": 50_000,
    "hold_decoded": 10_000,
    "hold_columns": 200_000,
    "cycle_s": 1.0,
    "commit_share": 0.1,
    "cycle_max_s": 10.0,
    "nice": 0,
    "max_ahead_s": 86_400.0,
    "max_behind_s": 7 * 86_400.0,
    "hanging_transaction_s": 75.0,
    "compaction_min_rows": 10_000,
    "shard": Shard(0, 1),
    "metrics_port": None,
    "metrics_host": "127.0.0.1",
}
"""What `gpulens worker` ran with before [pipeline] existed (its flags' defaults then)."""


def worker_options(config: Path | None, *argv: str) -> PipelineSettings:
    """The options `gpulens [--config config] worker ARGV` runs with."""
    return with_flags(load_settings(config).pipeline, worker.make_context("worker", list(argv)))


def test_pipeline_defaults_are_what_the_worker_ran_with_before() -> None:
    options = worker_options(None)
    assert {name: getattr(options, name) for name in WORKER_FLAG_DEFAULTS} == WORKER_FLAG_DEFAULTS
    assert set(type(options).model_fields) == set(WORKER_FLAG_DEFAULTS), "every worker option is a setting"
    assert {p.name for p in worker.params} == set(WORKER_FLAG_DEFAULTS), "and every setting a flag"


def test_file_and_environment_reach_the_worker_and_a_given_flag_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text(
        "[pipeline]\n"
        "window_s = 60\n"
        "idle_below = 2.5\n"
        'processors = ["alerts", "state"]\n'
        'shard = "1/2"\n'
        'group_id = "from-file"\n'
        "per_node = false\n"
    )
    monkeypatch.setenv("GPULENS_PIPELINE__IDLE_BELOW", "7.5")
    monkeypatch.setenv("GPULENS_PIPELINE__HOLD_RECORDS", "123")
    monkeypatch.setenv("GPULENS_PIPELINE__LATEST_EVERY_S", "4")
    options = worker_options(path, "--group", "from-flag", "--latest-every", "15", "--nodes")
    assert (options.window_s, options.processors, options.shard) == (60, ("alerts", "state"), Shard(1, 2))
    assert (options.idle_below, options.hold_records) == (7.5, 123), "the environment wins over the file"
    assert (options.group_id, options.latest_every_s, options.per_node) == ("from-flag", 15.0, True), (
        "a flag given wins, also when it says its own default"
    )
    assert options.consumer_group == "from-flag-1of2"
    assert options.idle_for == WORKER_FLAG_DEFAULTS["idle_for"], "what nobody set keeps its default"


def test_environment_takes_processors_and_shard_as_the_flags_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_PIPELINE__PROCESSORS", "allocation, latest")
    monkeypatch.setenv("GPULENS_PIPELINE__SHARD", "2/3")
    options = worker_options(None)
    assert (options.processors, options.shard) == (("allocation", "latest"), Shard(2, 3))
    monkeypatch.setenv("GPULENS_PIPELINE__PROCESSORS", '["changelog"]')
    assert worker_options(None).processors == ("changelog",)


@pytest.mark.parametrize(
    ("toml", "key", "says"),
    [
        ("window_s = 0", "window_s", "greater than or equal to 1 (got 0)"),
        ('processors = ["allocation", "alerts", "bogus"]', "processors", "'latest' (got 'bogus')"),
        ("processors = []", "processors", "at least 1 item"),
        ('shard = "2/2"', "shard", "want I/N with N >= 1 and 0 <= I < N"),
        ("metrics_port = 70000", "metrics_port", "less than or equal to 65535"),
        ("group = 'typo'", "group", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_pipeline_value_is_an_error_naming_the_key(
    tmp_path: Path, toml: str, key: str, says: str
) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text(f"[pipeline]\n{toml}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    [problem] = str(caught.value).splitlines()[1:]
    assert problem.lstrip().startswith(f"pipeline.{key}")
    assert says in problem
    assert problem.endswith(f"set GPULENS_PIPELINE__{key.upper()} or [pipeline] {key} in {path}")


def test_a_worker_run_takes_its_options_from_file_and_environment(
    config_file: Path, tmp_path: Path, unique: str, spawned: list[subprocess.Popen[bytes]]
) -> None:
    config = tmp_path / "gpulens.toml"
    config.write_text(
        f'{config_file.read_text()}\n[pipeline]\ngroup_id = "file-{unique}"\nprocessors = ["state"]\n'
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpulens", "--config", str(config), "worker"],
            stderr=stderr,
            env={**os.environ, "GPULENS_PIPELINE__SHARD": "1/2"},
        )
    spawned.append(process)
    servers = load_settings(config).kafka.bootstrap_servers
    banner = f"worker file-{unique}-1of2: state; shard 1/2; reading {servers}"
    wait_for(lambda: banner in log.read_text() or process.poll() is not None, 60, "the worker's first line")
    assert banner in log.read_text().splitlines()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
