"""Real services, started once per session: the broker, the schema registry, the ClickHouse holder.

They run as the same processes `gpulens infra up` starts, on free ports, with their state in
a temporary directory. Tests isolate themselves by topic, subject and database names.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.config import GPULensSettings
from gpulens.infra.launching import ServiceManager
from gpulens.platform import manager, private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.wire.codec import AvroCodec, registry_client

# The sinks the tests start as processes write the small tables every second, as GPU samples
# (5 s by default): tests wait for those rows, and tests/test_sink_cadence.py covers the two paces.
os.environ.setdefault("GPULENS_SINK__STATE_BATCH_SECONDS", "1")

# The replayed demo data and its `gpulens api` process (fixture ``demo``), built once per session
# for both the API's tests and the console's.
pytest_plugins = ["api_demo", "watcher_support"]


@pytest.fixture(scope="session")
def platform_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("platform")


@pytest.fixture(scope="session")
def platform(platform_dir: Path) -> Iterator[GPULensSettings]:
    """The embedded platform, up for the whole session, with the catalog's topics created."""
    with private_platform(platform_dir) as settings:
        create_topics(settings.kafka)
        yield settings


@pytest.fixture(scope="session")
def config_file(platform: GPULensSettings, platform_dir: Path) -> Path:
    return platform_dir / "gpulens.toml"


@pytest.fixture(scope="session")
def services(platform: GPULensSettings) -> ServiceManager:
    return manager(platform)


@pytest.fixture
def codec(platform: GPULensSettings) -> AvroCodec:
    return AvroCodec(registry_client(platform.registry.url))


@pytest.fixture
def unique() -> str:
    """A short unique suffix for names a test creates (topics, subjects, groups, databases)."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def module_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GPULensSettings, Path]]:
    """A private platform shared by one module's tests, and its config file. A module whose
    tests start workers of new groups takes it as its ``platform``: a new group reads its inputs
    from the beginning, and on the session's platform that is everything every earlier test
    published (it made each worker test read for a minute)."""
    directory = tmp_path_factory.mktemp("module-platform")
    with private_platform(directory) as settings:
        create_topics(settings.kafka)
        yield settings, directory / "gpulens.toml"


@pytest.fixture
def own_platform(tmp_path: Path) -> Iterator[tuple[GPULensSettings, Path]]:
    """A private platform (broker, registry, ClickHouse) of one test and its config file: for
    tests that pour junk on the catalog's own topics, freeze the broker, or publish so much that
    every later worker of a new group would have to read it."""
    with private_platform(tmp_path) as settings:
        create_topics(settings.kafka)
        yield settings, tmp_path / "gpulens.toml"


@pytest.fixture
def own_codec(own_platform: tuple[GPULensSettings, Path]) -> AvroCodec:
    return AvroCodec(registry_client(own_platform[0].registry.url))


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool from Debian's prometheus package, unpacked into .tools/ (no server installed);
    the test is skipped, saying why, where the package cannot be had."""
    install = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "install_promtool.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if install.returncode != 0:
        pytest.skip(
            "promtool cannot be installed here (apt-get download prometheus failed): "
            f"{install.stderr.strip()[-500:]}"
        )
    return Path(install.stdout.strip().splitlines()[-1])


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (append them): stopped at its end if still running, and reaped.

    Stopped with SIGTERM first: a worker SIGKILLed mid-cycle leaves its transaction open on the
    session's shared output topics, and noida-db has no transaction timeout, so every
    read_committed reader of a later test (the exporter's) stops at it. SIGKILL only past 30 s."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()
