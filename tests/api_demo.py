"""The demo data `gpulens api` is tested on, shared by tests/test_api.py and tests/test_console.py.

One pipeline for the whole session (a plugin of tests/conftest.py, so the API's tests and the
console's share it rather than build a second), on a platform of its own: a busy quarter-day of
the Alibaba v2023 trace (40 nodes, its pods created in that time, many of them pending for a
while) and the first 3,000 rows of the GenAI duty cycles (41 one-GPU pods, idle stretches) are
replayed into two clusters; the worker (hourly windows, the pod label ``app`` copied onto
idle GPU-hours), the sink and the exporter run until
every group has drained; then `gpulens api` runs as a process with a token, asked over HTTP.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from alert_oracle import SAMPLES
from trace_slices import head_of, pods_between

from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.draining import wait_drained
from gpulens.platform import private_platform
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.kafka.topic_admin import create_topics

ALIBABA = traces_dir() / "alibaba-gpu-v2023"
DAY = 86_400
TOKEN = "api-test-token"
ALI, GEN = "api-alibaba", "api-genai"


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


@dataclass
class Demo:
    settings: GPULensSettings
    http: httpx.Client
    base: str
    duty_csv: Path
    config: Path

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        assert response.status_code == 200, (path, params, response.text)
        return response.json()

    def sql(self, statement: str, **params: Any) -> list[tuple]:
        client = get_client(self.settings.clickhouse, database=self.settings.clickhouse.database)
        try:
            return client.query(statement, parameters=params).result_rows
        finally:
            client.close()


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_answering(base: str, api: subprocess.Popen[bytes], log: Path | None = None) -> None:
    """Until the `gpulens api` process ``api`` answers /healthz at ``base`` (60 s at most; if it
    exits first, its ``log`` says why)."""
    deadline = time.monotonic() + 60
    while True:
        assert api.poll() is None, log.read_text() if log else f"the API exited with {api.returncode}"
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the API did not answer within 60 s"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    directory = tmp_path_factory.mktemp("api")
    nodes_csv = head_of(ALIBABA / "openb_node_list_gpu_node.csv", 40, directory / "nodes.csv")
    pods_csv = pods_between(
        ALIBABA / "openb_pod_list_default.csv", 147 * DAY, 147 * DAY + DAY // 4, directory / "pods.csv",
        gone_within_s=DAY // 2,
    )  # fmt: skip
    duty_csv = head_of(SAMPLES, 3_000, directory / "duty.csv")
    processes: list[subprocess.Popen[bytes]] = []
    with private_platform(directory) as settings:
        create_topics(settings.kafka)
        config = directory / "gpulens.toml"
        try:
            for replay in (
                ["alibaba-v2023", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--cluster", ALI],
                ["genai-duty", "--samples", str(duty_csv), "--cluster", GEN],
            ):
                done = subprocess.run(gpulens(config, "replay", *replay), capture_output=True, timeout=300)
                assert done.returncode == 0, done.stderr
            worker = ("worker", "--window", "3600", "--owner-labels", "app")
            for name, *args in (worker, ("sink",), ("exporter",)):
                with (directory / f"{name}.log").open("ab") as log:
                    processes.append(
                        subprocess.Popen(gpulens(config, name, *args), stdout=subprocess.DEVNULL, stderr=log)
                    )
            assert wait_drained(settings, timeout_s=300) is not None, "the pipeline did not drain"
            with (directory / "api.log").open("ab") as log:
                api = subprocess.Popen(
                    gpulens(config, "api"),
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env={**os.environ, "GPULENS_API__TOKEN": TOKEN},
                )
            processes.append(api)
            base = f"http://{settings.api.host}:{settings.api.port}"
            wait_answering(base, api, directory / "api.log")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
                yield Demo(settings, http, base, duty_csv, config)
        finally:
            _stop(processes)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def busiest_window_end(demo: Demo) -> datetime:
    """The end of the Alibaba slice's window with the most GPUs held at its end."""
    rows = demo.sql(
        "SELECT window_end FROM cluster_gpu_allocation FINAL WHERE cluster = {c:String} "
        "ORDER BY gpus_allocated_end DESC, window_start LIMIT 1",
        c=ALI,
    )
    return utc(rows[0][0])
