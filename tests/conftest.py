"""Real services, started once per session: the broker, the schema registry, the ClickHouse holder.

They run as the same processes `gpulens infra up` starts, on free ports, with their state in
a temporary directory. Tests isolate themselves by topic, subject and database names.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.config import GPULensSettings, load_settings
from gpulens.platform import ORDER, manager, service_specs
from infra.launching import ServiceManager
from schemas.codec import AvroCodec, registry_client
from schemas.topic_admin import create_topics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(directory: Path, **overrides: str) -> Path:
    """A gpulens.toml on free ports with its state under ``directory``."""
    values = {
        "state_dir": str(directory / "state"),
        "kafka_port": str(free_port()),
        "registry_port": str(free_port()),
        "clickhouse_port": str(free_port()),
        "broker": "noida",
        **overrides,
    }
    path = directory / "gpulens.toml"
    path.write_text(
        f"""cluster = "test"

[kafka]
bootstrap_servers = "127.0.0.1:{values["kafka_port"]}"

[registry]
url = "http://127.0.0.1:{values["registry_port"]}"

[clickhouse]
url = "http://127.0.0.1:{values["clickhouse_port"]}"
http_port = {values["clickhouse_port"]}

[platform]
state_dir = "{values["state_dir"]}"
broker = "{values["broker"]}"
"""
    )
    return path


@pytest.fixture(scope="session")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("platform"))


@pytest.fixture(scope="session")
def settings(config_file: Path) -> GPULensSettings:
    return load_settings(config_file)


@pytest.fixture(scope="session")
def services(settings: GPULensSettings) -> ServiceManager:
    return manager(settings)


@pytest.fixture(scope="session")
def platform(settings: GPULensSettings, config_file: Path, services: ServiceManager) -> Iterator[GPULensSettings]:
    """The embedded platform, up for the whole session, with the catalog's topics created."""
    specs = service_specs(settings, config_file)
    try:
        for name in ORDER:
            services.start(specs[name], timeout=90)
        create_topics(settings.kafka)
        yield settings
    finally:
        for name in reversed(ORDER):
            services.stop(name)


@pytest.fixture
def codec(platform: GPULensSettings) -> AvroCodec:
    return AvroCodec(registry_client(platform.registry.url))


@pytest.fixture
def unique() -> str:
    """A short unique suffix for names a test creates (topics, subjects, groups, databases)."""
    return uuid.uuid4().hex[:10]
