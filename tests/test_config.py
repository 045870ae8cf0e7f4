"""Settings from a TOML file and GPULENS_* variables, with errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.config import load_settings
from gpulens.schemas.model.exceptions import ConfigError


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

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


def test_broken_toml_says_where(tmp_path: Path) -> None:
    path = tmp_path / "gpulens.toml"
    path.write_text("[kafka\n")
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 1"):
        load_settings(path)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
